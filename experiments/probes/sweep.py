"""Config sweep: every launch config of each group in one workload's greedy partition, verified
and timed alone on the GPU (the same GPUTimer the search uses). Shows how far the default config
is from the best one and which configs fail, without a search in the way.

    python -m experiments.probes.sweep --workloads attention_scores --max-configs 64 --out $OUT

Workloads are the public suite's and the model-style functions' (``experiments/bench/model_functions.py``),
or KernelBench problems named ``L<level>_<number>`` with ``--kb KB`` (a KernelBench folder, as
for ``experiments.kernelbench``; the problem's own shapes, fp32, on the GPU); ``--kinds`` keeps
the groups of those kernel kinds only (``reduction,pointwise``).
``--variants plain,unselective`` times each config twice: as generated, and with every ``where``
loading both branches everywhere (``load_hints.select_branch`` off), to show what the selective
loads save.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from pathlib import Path

import autofuse
from autofuse.kernels import config_label, config_space, default_config
from autofuse.kernels.common import load_hints
from autofuse.measure import Candidate, GPUTimer
from autofuse.partition.partitioner import Partitioner
from experiments.bench.model_functions import MODEL_FUNCTIONS
from experiments.bench.suite import stamp
from experiments.bench.workloads import BY_NAME

WORKLOADS = {**BY_NAME, **{w.name: w for w in MODEL_FUNCTIONS}}
_SELECT = load_hints.select_branch


def use_variant(name: str) -> None:
    """``plain``: kernels as generated; ``unselective``: no selective loads."""
    if name not in ("plain", "unselective"):
        raise ValueError(f"--variants: unknown variant {name!r} (plain, unselective)")
    load_hints.select_branch = _SELECT if name == "plain" else (lambda em, i: None)


def sweep_group(graph, info, timer: GPUTimer, max_configs: int, seed: int, where: str = "") -> dict:
    space = config_space(info, graph)
    default = default_config(info, graph)
    # --where "c.BLOCK_K == 128": a Python condition on the config ``c``
    picked = [c for c in space if not where or eval(where, {}, {"c": c})]  # noqa: S307
    if len(picked) > max_configs:
        picked = random.Random(seed).sample(picked, max_configs)
    if default not in picked:
        picked.append(default)
    rows = []
    for cfg in picked:
        t0 = time.perf_counter()
        m = timer.measure(Candidate(graph, info, cfg))
        rows.append({"config": config_label(cfg), "default": cfg == default,
                     "time_s": m.seconds, "failure": m.failure,
                     "wall_s": time.perf_counter() - t0})  # fmt: skip
    ok = sorted((r for r in rows if r["time_s"]), key=lambda r: r["time_s"])
    d = next(r for r in rows if r["default"])
    return {"kind": info.kind, "ops": [graph[i].op for i in info.nodes],
            "space": len(space), "timed": len(rows), "failed": sum(1 for r in rows if r["failure"]),
            "best": ok[0] if ok else None, "default": d, "rows": ok + [r for r in rows if r["failure"]]}  # fmt: skip


def _us(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e6:.1f}us"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workloads", required=True)
    p.add_argument("--max-configs", type=int, default=48)
    p.add_argument("--out", default="results")
    p.add_argument("--tag", default="sweep")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--where", default="", help='keep configs c where this holds: "c.BLOCK_K==128"')
    p.add_argument("--variants", default="plain", help="plain,unselective")
    p.add_argument("--kb", default="", help="KernelBench folder for workloads named L2_52")
    p.add_argument("--kinds", default="", help="only groups of these kernel kinds")
    a = p.parse_args()
    timer = GPUTimer()
    doc = {"stamp": stamp(), "workloads": []}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in a.workloads.split(","):
        for variant in a.variants.split(","):
            use_variant(variant)
            doc["workloads"].append(
                {"workload": name, "variant": variant, "groups": sweep_workload(name, timer, a)}
            )
            (out / f"{a.tag}.json").write_text(json.dumps(doc, indent=2, default=str))


def sweep_workload(name: str, timer: GPUTimer, a: argparse.Namespace) -> list[dict]:
    graph = workload_graph(name, a.kb)
    part = Partitioner(graph).greedy()
    groups = []
    kinds = set(filter(None, a.kinds.split(",")))
    for g in part.groups:
        info = Partitioner(graph).check(g)
        if isinstance(info, str) or len(info.nodes) < 2 and info.kind == "gemm":
            continue
        if kinds and info.kind not in kinds:
            continue
        r = sweep_group(graph, info, timer, a.max_configs, a.seed, a.where)
        groups.append(r)
        best, d = r["best"] or {}, r["default"]
        print(f"{name} {r['kind']} [{','.join(r['ops'])}] space={r['space']} "
              f"timed={r['timed']} failed={r['failed']} best={_us(best.get('time_s'))} "
              f"({best.get('config')}) default={_us(d['time_s'])}", flush=True)  # fmt: skip
        for row in r["rows"][:5]:
            print(f"    {_us(row['time_s'])}  {row['config']}", flush=True)
        for row in [x for x in r["rows"] if x["failure"]][:3]:
            print(f"    FAILED {row['config']}: {row['failure'][:300]}", flush=True)
    return groups


def workload_graph(name: str, kb: str):
    """The captured graph of a suite or model workload, or of KernelBench problem ``L2_52``."""
    m = re.fullmatch(r"L(\d+)_(\d+)", name)
    if m is None:
        w = WORKLOADS[name]
        return autofuse.capture(w.fn, w.inputs()).graph
    if not kb:
        raise SystemExit(f"--workloads {name}: a KernelBench problem needs --kb")
    from experiments.kernelbench.problems import BY_STAGE, discover, instantiate, load_module

    (problem,) = discover(Path(kb), int(m.group(1)), {int(m.group(2))})
    module, _ = load_module(problem, BY_STAGE["shipped"])
    model, inputs = instantiate(module, 0, None, "cuda")
    return autofuse.capture(model, inputs).graph


if __name__ == "__main__":
    main()
