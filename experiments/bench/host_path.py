"""CPU host time per call of a plan, the kernel launch stubbed out: what ``OptimizedFunction``
and ``execute`` cost in Python around the launches (no GPU needed). ``--models`` does the same
for each graph the torch.compile backend compiles for the suite's models (tiny configs: the
eager steps' own work, torch.mm on tiny tensors, is in the figure).

    TRITON_INTERPRET=1 python -m experiments.bench.host_path [--profile] [--models llama_eager,gpt2]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import autofuse  # noqa: E402
from autofuse.plan.runtime import KernelStep  # noqa: E402


class _Stub:
    scratch = False

    def __call__(self, args):
        return None


def tiny(x, w):
    return torch.sigmoid(x * w + 1.0)


def two_kernels(x, w):
    y = torch.sigmoid(x * w + 1.0)
    return y.sum(-1) + 1.0, y


def per_call_us(fn, args, n=20000) -> float:
    for _ in range(200):
        fn(*args)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*args)
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def model_graphs_us(name: str, mode: str = "inference") -> dict[str, float]:
    """Host us per call of each graph the backend compiles for model ``name`` (tiny), its
    kernel launches stubbed, called with the arguments Dynamo gave it."""
    import autofuse.frontend.dynamo as dyn
    from experiments.bench.models import build

    torch._dynamo.reset()
    case = build(name, "tiny")
    fast = torch.compile(case.model, backend="autofuse")
    seen: dict[int, tuple] = {}
    call = dyn.CompiledGraph.__call__

    def spy(self, *args):
        flat = list(args[0]) if len(args) == 1 and type(args[0]) is list else list(args)
        seen.setdefault(id(self), (self, flat))
        return call(self, *args)

    dyn.CompiledGraph.__call__ = spy
    try:
        case.inference(fast) if mode == "inference" else case.train_step(fast)
    finally:
        dyn.CompiledGraph.__call__ = call
    out = {}
    for g, flat in seen.values():
        for s in g.plan.steps:
            if isinstance(s, KernelStep):
                s.__dict__["launcher"] = _Stub()
        with torch.no_grad():
            us = per_call_us(lambda g=g, flat=flat: g(list(flat)), (), n=300)
        out[f"{name} {g.kind} ({len(g.plan.steps)} steps)"] = us
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--profile", action="store_true")
    p.add_argument("--models", default="", help="e.g. llama_eager,gpt2 (needs transformers)")
    a = p.parse_args()
    rows = {}
    for m in filter(None, a.models.split(",")):
        for mode in ("inference", "train"):
            rows.update(model_graphs_us(m, mode))
    for fn, shape in ((tiny, (64,)), (two_kernels, (8, 64))):
        args = (torch.randn(shape), torch.randn(shape))
        opt = autofuse.optimize(fn, args)
        for s in opt.plan.steps:
            if isinstance(s, KernelStep):
                s.__dict__["launcher"] = _Stub()
        rows[f"{fn.__name__}: call, grad mode"] = per_call_us(opt, args)
        with torch.no_grad():
            rows[f"{fn.__name__}: call, no_grad"] = per_call_us(opt, args)
        from autofuse.plan.runtime import execute

        with torch.no_grad():
            rows[f"{fn.__name__}: execute alone"] = per_call_us(
                lambda *xs, p=opt.plan: execute(p, xs), args
            )
        if a.profile:
            import cProfile
            import pstats

            with torch.no_grad():
                cProfile.runctx(
                    "for _ in range(20000): opt(*args)", globals(), locals(), "/tmp/hp.prof"
                )
            pstats.Stats("/tmp/hp.prof").sort_stats("tottime").print_stats(12)
    for k, v in rows.items():
        print(f"{k:34s} {v:6.2f} us per call (CPU host time, launch stubbed)")


if __name__ == "__main__":
    main()
