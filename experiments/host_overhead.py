"""Host cost per call: a workload whose kernel is a few microseconds, called back to back, so
the wall time per call is what the CPU spends launching it (the GPU waits on the host).

    python -m experiments.host_overhead --out $OUT

Compares eager, torch.compile (default), an autofuse plan on the lean launch path and the same
plan through ``JITFunction.__getitem__`` every call.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import autofuse
from autofuse.plan.runtime import KernelStep
from experiments.bench import stamp


def tiny(x, w):
    return torch.sigmoid(x * w + 1.0)


def per_call_us(fn, args, n: int = 3000) -> float:
    for _ in range(50):
        fn(*args)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*args)
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="results")
    a = p.parse_args()
    x, w = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    opt = autofuse.optimize(tiny, (x, w))
    compiled = torch.compile(tiny)
    rows = {"eager (3 kernels)": per_call_us(tiny, (x, w)),
            "torch.compile default": per_call_us(compiled, (x, w)),
            "autofuse lean launch": per_call_us(opt, (x, w))}  # fmt: skip
    launchers = [s.launcher for s in opt.plan.steps if isinstance(s, KernelStep)]
    for ln in launchers:
        ln.lean = False
    rows["autofuse via JITFunction"] = per_call_us(opt, (x, w))
    for ln in launchers:
        ln.lean = True
    for k, v in rows.items():
        print(f"{k:28s} {v:7.2f} us per call", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_overhead.json").write_text(
        json.dumps({"stamp": stamp(), "us_per_call": rows}, indent=2)
    )


if __name__ == "__main__":
    main()
