"""Probe: where the attention backward's time goes. The eager-written attention of
``attention_bench`` (bf16, B=8, H=32, T=1024, d=128 by default) runs one training step through
``torch.compile(backend="autofuse")``; the backward graph's ``attention_bwd`` kernel is then
timed alone at configs of its space (the search's timer, GPUTimer, without its check: the
bench and the tests check the kernel's results), with achieved TFLOP/s (the backward's five
products: 2.5 forwards) and the fraction of the measured bf16 matmul peak. The other kernels of
the backward graph (``delta = rowsum(dO * O)``) are timed at their plan's config.

    python -m experiments.probes.attn_bwd_sweep --out $OUT [--variants causal,gqa] [--max-configs 40]
        [--where "c.BLOCK_M == 64 and c.num_warps == 8"]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def backward_graph(variant: str, a) -> tuple:
    """(backward CompiledGraph, forward FLOPs) of one training step of ``variant``."""
    from autofuse.frontend import compiled_graphs
    from experiments.bench.attention_bench import make

    torch._dynamo.reset()
    fn, args, _, flops = make(variant, a.batch, a.heads, a.seq, a.head_dim)
    args = [x.requires_grad_() if x.is_floating_point() else x for x in args]
    before = {id(g) for g in compiled_graphs()}
    out = torch.compile(fn, backend="autofuse")(*args)
    out.float().square().mean().backward()
    torch.cuda.synchronize()
    new = [g for g in compiled_graphs() if id(g) not in before and g.kind == "backward"]
    return new[-1], flops


def sweep_variant(variant: str, a, peak: float) -> dict:
    from autofuse.measure import Candidate, GPUTimer
    from experiments.probes.sweep import sweep_group

    g, flops = backward_graph(variant, a)
    timer = GPUTimer(verify=False)
    rec: dict = {"variant": variant, "shape": [a.batch, a.heads, a.seq, a.head_dim],
                 "fwd_flops": flops, "kernels": []}  # fmt: skip
    for k in g.plan.kernels:
        if k.info.kind != "attention_bwd":
            m = timer.measure(Candidate(g.graph, k.info, k.config))
            rec["kernels"].append({"kind": k.info.kind, "name": k.name, "time_s": m.seconds})
            continue
        r = sweep_group(g.graph, k.info, timer, a.max_configs, 0, a.where)
        for row in r["rows"]:
            if row["time_s"]:
                row["tflops"] = 2.5 * flops / row["time_s"] / 1e12
                row["fraction_of_mm_peak"] = 2.5 * flops / row["time_s"] / peak
        r["name"] = k.name
        rec["kernels"].append(r)
        best, d = r["best"] or {}, r["default"]
        print(f"{variant}: {k.name} space={r['space']} timed={r['timed']} failed={r['failed']}"
              f" best={best.get('time_s', 0) * 1e6:.0f}us ({best.get('config')},"
              f" {best.get('tflops', 0):.0f} TFLOP/s) default={(d['time_s'] or 0) * 1e6:.0f}us"
              f" ({d['config']})", flush=True)  # fmt: skip
        for row in r["rows"][:6]:
            print(f"    {(row['time_s'] or 0) * 1e6:7.0f}us  {row['config']}", flush=True)
    return rec


def main(argv: list[str] | None = None) -> dict:
    from autofuse.tune.roofline import ceilings
    from experiments.bench.bench_models import stamp

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results")
    p.add_argument("--variants", default="causal,gqa")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--max-configs", type=int, default=40)
    p.add_argument("--where", default="", help='keep configs c where this holds: "c.whole"')
    p.add_argument("--tag", default=None)
    a = p.parse_args(argv)
    st = stamp("cuda")
    doc = {"stamp": st, "ceilings": ceilings(), "variants": []}
    mm_peak = doc["ceilings"]["bf16_mm_flops_per_s"]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{a.tag or 'attn_bwd_sweep_' + st['commit']}.json"
    for v in a.variants.split(","):
        doc["variants"].append(sweep_variant(v, a, mm_peak))
        path.write_text(json.dumps(doc, indent=2, default=str))
    return doc


if __name__ == "__main__":
    main()
