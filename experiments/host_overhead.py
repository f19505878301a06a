"""Host cost per call: a workload whose kernel is a few microseconds, called back to back, so
the wall time per call is what the CPU spends launching it (the GPU waits on the host).

    python -m experiments.host_overhead --out $OUT

Compares eager, torch.compile (default and reduce-overhead), an autofuse plan on the lean launch
path, the same plan through ``JITFunction.__getitem__`` every call, and with and without
``cuda_graph=True`` (one and two kernels). ``python -m experiments.host_path`` measures the
Python part of a call on any machine (launch stubbed).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import autofuse
from autofuse.plan.runtime import KernelStep, kernel_args
from experiments.bench import stamp


def tiny(x, w):
    return torch.sigmoid(x * w + 1.0)


def two_kernels(x, w):
    y = torch.sigmoid(x * w + 1.0)
    return y.sum(), y * 2.0


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


def _floor_rows(opt, step, x, w) -> dict:
    """What Triton's own launch of the plan's compiled binary costs (the floor under any plan
    that launches through Triton), and with the output allocation a plan makes per call; the
    arguments are the plan's own (``kernel_args``), checked against eager once."""
    (run,) = step.launcher.binaries.values()  # the lean path's binary, launched once already
    consts = step.launcher.consts
    given = dict(zip(opt.plan.graph.inputs, (x, w)))
    ins = [given[i] for i in step.kernel.info.loads]
    out = torch.empty_like(x)
    args = [*kernel_args(step.kernel, [*ins, out]), *consts]

    def bare(x, w):
        run(*args)

    def alloc(x, w):
        run(*kernel_args(step.kernel, [*ins, torch.empty_like(x)]), *consts)

    bare(x, w)
    torch.cuda.synchronize()
    assert torch.allclose(out, tiny(x, w), atol=1e-5), "the bare launch does not compute tiny"
    return {"triton launch alone": per_call_us(bare, (x, w)),
            "triton launch + output allocation": per_call_us(alloc, (x, w))}  # fmt: skip


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
    steps = [s for s in opt.plan.steps if isinstance(s, KernelStep)]
    rows.update(_floor_rows(opt, steps[0], x, w))
    launchers = [s.launcher for s in steps]
    for ln in launchers:
        ln.lean = False
    rows["autofuse via JITFunction"] = per_call_us(opt, (x, w))
    for ln in launchers:
        ln.lean = True
    # the whole plan replayed as one CUDA graph (over the first call's own inputs, which these
    # calls pass again: no input copy; outputs copied out), against torch.compile's own graphs
    graphed = autofuse.optimize(tiny, (x, w), cuda_graph=True)
    rows["autofuse cuda_graph=True"] = per_call_us(graphed, (x, w))
    assert graphed.graphs.graph is not None, graphed.graphs.off
    rows["torch.compile reduce-overhead"] = per_call_us(
        torch.compile(tiny, mode="reduce-overhead"), (x, w)
    )
    two = autofuse.optimize(two_kernels, (x, w))
    two_graphed = autofuse.optimize(two_kernels, (x, w), cuda_graph=True)
    rows["autofuse 2 kernels"] = per_call_us(two, (x, w))
    rows["autofuse 2 kernels cuda_graph=True"] = per_call_us(two_graphed, (x, w))
    for k, v in rows.items():
        print(f"{k:28s} {v:7.2f} us per call", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_overhead.json").write_text(
        json.dumps({"stamp": stamp(), "us_per_call": rows}, indent=2)
    )


if __name__ == "__main__":
    main()
