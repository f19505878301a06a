"""Host cost per call: a workload whose kernel is a few microseconds, called back to back, so
the wall time per call is what the CPU spends launching it (the GPU waits on the host).

    python -m experiments.bench.host_overhead --out $OUT

Compares eager, torch.compile (default and reduce-overhead), an autofuse plan on the lean launch
path, the same plan through ``JITFunction.__getitem__`` every call, and with and without
``cuda_graph=True`` (one and two kernels). ``python -m experiments.bench.host_path`` measures the
Python part of a call on any machine (launch stubbed).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import torch

import autofuse
from autofuse.partition import Partitioner
from autofuse.plan.launcher import stats as launcher_stats
from autofuse.plan.runtime import KernelStep, build_plan, kernel_args
from experiments.bench.suite import stamp


def tiny(x, w):
    return torch.sigmoid(x * w + 1.0)


def two_kernels(x, w):
    y = torch.sigmoid(x * w + 1.0)
    return y.sum(), y * 2.0


def chain(x, w, k: int):
    """k pointwise ops in a row: one kernel each in the unfused plan, one op each in eager."""
    y = x
    for _ in range(k):
        y = y * w
    return y


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
    """What one launch of the plan's compiled binary costs, the floor under any plan: through
    the lean path's bound launch (torch's static launcher where it applies), through Triton's
    own launch of the same binary, and with the output allocation a plan makes per call; the
    arguments are the plan's own (``kernel_args``), checked against eager once."""
    (run,) = step.launcher.binaries.values()  # the lean path's launch, used once already
    (compiled,) = step.launcher.compiled.values()
    runner, consts = compiled[step.launcher.grid3], step.launcher.consts
    given = dict(zip(opt.plan.graph.inputs, (x, w)))
    ins = [given[i] for i in step.kernel.info.loads]
    out = torch.empty_like(x)
    args = kernel_args(step.kernel, [*ins, out])

    def bound(x, w):
        run(args)

    ptrs = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]

    def bound_ints(x, w):  # as a plan's program calls it: pointers read once, passed as ints
        run(ptrs)

    def triton(x, w):
        runner(*args, *consts)

    def alloc(x, w):
        run(kernel_args(step.kernel, [*ins, torch.empty_like(x)]))

    for launch in (bound, bound_ints, triton):
        out.zero_()
        launch(x, w)
        torch.cuda.synchronize()
        assert torch.allclose(out, tiny(x, w), atol=1e-5), f"{launch.__name__} launch is wrong"
    return {"bound launch alone": per_call_us(bound, (x, w)),
            "bound launch, pointers as integers": per_call_us(bound_ints, (x, w)),
            "triton launch alone": per_call_us(triton, (x, w)),
            "bound launch + output allocation": per_call_us(alloc, (x, w)),
            "kernels bound to torch's static launcher so far": launcher_stats()["direct"]}  # fmt: skip


def _slope(points: dict[int, float]) -> tuple[float, float]:
    """Least-squares line through (kernels, us per call): (us per kernel, us per call at 0)."""
    ks, ts = list(points), list(points.values())
    mk, mt = sum(ks) / len(ks), sum(ts) / len(ts)
    b = sum((k - mk) * (t - mt) for k, t in zip(ks, ts)) / sum((k - mk) ** 2 for k in ks)
    return b, mt - b * mk


def per_kernel_rows(x, w, counts=(1, 2, 4, 8, 16)) -> dict:
    """Host cost per launched kernel: plans of k kernels (the unfused plan of a k-op chain,
    checked against eager), each called back to back on tiny tensors; the slope of the time per
    call over k is what one more kernel costs the host, the intercept what a call costs."""
    plans, eager = {}, {}
    for k in counts:
        fn = functools.partial(chain, k=k)
        fn.__name__ = f"chain{k}"
        captured = autofuse.capture(fn, (x, w))
        graph = captured.graph
        plan = build_plan(graph, Partitioner(graph).unfused().groups, label=f"unfused chain {k}")
        launches = sum(isinstance(s, KernelStep) for s in plan.steps)
        assert launches == k, f"the unfused {k}-op chain has {launches} kernels"
        opt = autofuse.OptimizedFunction(captured, plan, fn)
        torch.testing.assert_close(opt(x, w), fn(x, w))
        plans[k] = per_call_us(opt, (x, w))
        eager[k] = per_call_us(fn, (x, w))
    per_kernel, per_call = _slope(plans)
    per_op, per_eager_call = _slope(eager)
    return {"autofuse us per call by kernels": plans, "eager us per call by ops": eager,
            "autofuse us per kernel (slope)": per_kernel, "autofuse us per call at 0 kernels": per_call,
            "eager us per op (slope)": per_op, "eager us per call at 0 ops": per_eager_call}  # fmt: skip


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
    per_kernel = per_kernel_rows(x, w)
    per_kernel["kernels bound to torch's static launcher, all plans"] = launcher_stats()["direct"]
    # what autofuse's own runtime adds per kernel: the slope less one bare launch of a bound
    # kernel with its output allocated (the launcher and allocator Inductor's code calls too)
    floor = rows.get("bound launch + output allocation")
    if floor is not None:
        per_kernel["autofuse us per kernel beyond launch + allocation"] = (
            per_kernel["autofuse us per kernel (slope)"] - floor
        )
    for k, v in per_kernel.items():
        print(f"{k:34s} {v}", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_overhead.json").write_text(
        json.dumps({"stamp": stamp(), "us_per_call": rows, "per_kernel": per_kernel}, indent=2)
    )


if __name__ == "__main__":
    main()
