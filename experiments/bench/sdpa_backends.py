"""SDPA's backends as autofuse library calls against autofuse's own attention kernels, on one
GPU in one run.

    python -m experiments.bench.sdpa_backends --out $OUT [--variants causal,padded,boolmask,window,gqa]

Per variant of ``experiments.attention_bench`` (bf16, B=8, H=32, T=1024, d=128 by default),
forward (inference, under ``no_grad``) and forward+backward, microseconds per call (do_bench
median) of:

- ``sdpa <backend>``: ``F.scaled_dot_product_attention`` in eager under
  ``sdpa_kernel(<backend>)`` (a backend that refuses the variant is reported with its error);
- ``autofuse sdpa auto``: the SDPA-written function through ``torch.compile(backend=autofuse)``,
  ``AUTOFUSE_SDPA=auto``: the untuned planner's end-to-end choice among the offered backends
  (the backend each graph ran and why are recorded under ``steps``);
- ``autofuse sdpa <backend>``: the same with ``AUTOFUSE_SDPA=<backend>`` (forward only: a
  training pair keeps torch's pick, only ``math`` changes its backward);
- ``autofuse kernel``: the eager-written function, its attention decomposed and run by
  autofuse's own kernels (``autofuse.optimize`` forward; the backend's forward and backward
  graphs, attention and attention_bwd kernels, for forward+backward).

Writes ``sdpa_backends_<commit>.json``. Every result is checked against a float64 eager
reference first (max relative error < 5e-2); a failing one is listed under ``errors``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
import traceback
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from experiments.bench.attention_bench import VARIANTS, make

BACKENDS = ("cudnn", "flash", "efficient", "math")
_SDP = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}  # fmt: skip


def _eager_backend(name: str, sdpa):
    def call(*args):
        with sdpa_kernel([_SDP[name]]):
            return sdpa(*args)

    return call


def _through_autofuse(fn, setting: str, train: bool, backends: dict):
    """``fn`` compiled by the autofuse backend with ``AUTOFUSE_SDPA=setting`` (set again on each
    call: Dynamo compiles on the first one, and again on a guard failure); the backend object,
    whose records say which backend each graph ran and why, in ``backends[setting]``."""
    from autofuse.frontend.dynamo import make_backend
    from autofuse.settings import reload_settings, settings

    backend = backends[setting] = make_backend(cuda_graph=False)
    compiled = torch.compile(fn, backend=backend)

    def call(*args):
        if settings().sdpa != setting:
            os.environ["AUTOFUSE_SDPA"] = setting
            reload_settings()
        return compiled(*args) if train else _no_grad(compiled, args)

    return call


def _sdpa_steps(record) -> dict:
    g = record.plan.graph
    described = [s.describe(g) for s in record.plan.steps]
    return {
        "kind": record.kind,
        "steps": [d for d in described if "sdpa." in d or "SDPA" in d],
        "choice": None if record.plan_choice is None else record.plan_choice.why,
    }


def _no_grad(f, args):
    with torch.no_grad():
        return f(*args)


def _calls(fn, sdpa, args, train: bool, backends: dict) -> dict:
    import autofuse

    calls = {f"sdpa {b}": _eager_backend(b, sdpa) for b in BACKENDS}
    settings = ("auto", "math") if train else ("auto", *BACKENDS, "autofuse")
    for s in settings:
        calls[f"autofuse sdpa {s}"] = _through_autofuse(sdpa, s, train, backends)
    if train:
        calls["autofuse kernel"] = torch.compile(fn, backend="autofuse")
    else:
        calls["autofuse kernel"] = autofuse.optimize(fn, args)
    return calls


def _run(call, args, grad, train: bool):
    if not train:
        return _no_grad(call, args)
    for x in args[:3]:
        x.grad = None
    call(*args).backward(grad)
    return [x.grad for x in args[:3]]


def _err(got, ref) -> float:
    got = got if isinstance(got, list) else [got]
    ref = ref if isinstance(ref, list) else [ref]
    return max(float((g.double() - r).abs().max() / r.abs().max().clamp_min(1e-6))
               for g, r in zip(got, ref, strict=True))  # fmt: skip


def run_variant(variant: str, a) -> dict:
    from triton.testing import do_bench

    fn, args, sdpa, _ = make(variant, a.batch, a.heads, a.seq, a.head_dim)
    torch._dynamo.reset()  # one SDPA function compiled by one backend per setting: room for all
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    rec: dict = {"variant": variant, "shape": [a.batch, a.heads, a.seq, a.head_dim], "passes": {}}
    for train in (False, True):
        p = "forward+backward" if train else "forward"
        targs = [x.detach().requires_grad_(train and k < 3) if x.is_floating_point() else x
                 for k, x in enumerate(args)]  # fmt: skip
        dargs = [x.detach().double().requires_grad_(train and k < 3) if x.is_floating_point()
                 else x for k, x in enumerate(args)]  # fmt: skip
        grad = torch.randn_like(args[0])
        ref = _run(fn, dargs, grad.double(), train)
        ref = [r.detach() for r in ref] if train else ref.detach()
        backends: dict = {}
        out: dict = {"us": {}, "errors": {}}
        for name, call in _calls(fn, sdpa, targs, train, backends).items():
            try:
                err = _err(_run(call, targs, grad, train), ref)
            except Exception as e:  # noqa: BLE001 - a backend that refuses this variant
                out["errors"][name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                continue
            if err >= 5e-2:
                out["errors"][name] = f"wrong result: max rel err {err:.3g}"
                continue
            f = functools.partial(_run, call, targs, grad, train)
            out["us"][name] = do_bench(f, warmup=25, rep=a.rep_ms, return_mode="median") * 1e3
        # per setting and compiled graph: the steps that ran SDPA (backend, why) and the timing
        out["steps"] = {k: [_sdpa_steps(r) for r in b.records] for k, b in backends.items()}
        rec["passes"][p] = out
        print(f"{variant:9s} {p:17s} " + "  ".join(f"{k}={v:.0f}" for k, v in out["us"].items()),
              flush=True)  # fmt: skip
    return rec


def main(argv: list[str] | None = None) -> dict:
    from experiments.bench.bench_models import stamp

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "results"))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--rep-ms", type=float, default=100.0)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("sdpa_backends: needs a CUDA GPU")
    t0 = time.perf_counter()
    st = stamp("cuda")
    doc: dict = {"stamp": st, "cudnn": torch.backends.cudnn.version(), "records": []}
    path = Path(a.out) / f"sdpa_backends_{st['commit']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    for v in [v for v in a.variants.split(",") if v]:
        try:
            doc["records"].append(run_variant(v, a))
        except Exception:  # noqa: BLE001 - one variant's failure is recorded, not fatal
            doc["records"].append({"variant": v, "error": traceback.format_exc()[-3000:]})
        doc["seconds"] = time.perf_counter() - t0
        path.write_text(json.dumps(doc, indent=1, default=str))
    print(f"wrote {path}")
    return doc


if __name__ == "__main__":
    main()
