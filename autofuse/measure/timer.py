"""Timing on the GPU: the benchmark function is injected (``do_bench=``, as Triton's autotuner
takes it); ``GPUTimer`` verifies a candidate, then times its launch alone."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from autofuse import logs
from autofuse.ir.eager import run_graph
from autofuse.ir.graph import Graph
from autofuse.kernels import GroupInfo
from autofuse.measure.candidate import (
    Candidate,
    Measurement,
    describe_error,
    eager_subgraph,
)
from autofuse.measure.cost_model import CostModel
from autofuse.measure.verify import (
    build_kernel,
    poisoned_outputs,
    random_inputs,
    verify_candidate,
)
from autofuse.plan.runtime import execute, kernel_args, launcher_for
from autofuse.report import nbytes
from autofuse.settings import settings, target

# ---------------------------------------------------------------------------------------------
# Timing on the GPU
# ---------------------------------------------------------------------------------------------


def _bench_ms(fn: Callable[[], Any], warmup_ms: float, rep_ms: float, flush_l2: bool) -> float:
    """Median milliseconds of ``fn()`` on CUDA: triton's do_bench (which clears L2 before each
    timed run), or, without the flush, the same method on CUDA events."""
    if flush_l2:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(min(10000, max(1, int(warmup_ms / est)))):
        fn()
    n = min(10000, max(1, int(rep_ms / est)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def _bench_cpu_ms(fn: Callable[[], Any], warmup_ms: float, rep_ms: float) -> float:
    t0 = time.perf_counter()
    fn()
    est = max((time.perf_counter() - t0) * 1e3, 1e-3)
    for _ in range(min(100, max(1, int(warmup_ms / est)))):
        fn()
    times = []
    for _ in range(min(1000, max(3, int(rep_ms / est)))):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def time_callable(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    warmup_ms: float = 25,
    rep_ms: float = 100,
    flush_l2: bool = True,
) -> float:
    """Seconds per call of ``fn(*args)`` (median, under no_grad): do_bench on CUDA, the same for
    eager and torch.compile baselines as for plans. Without CUDA, the wall-clock median of the
    CPU calls (a CPU time, not comparable with GPU figures)."""
    args = tuple(args)

    def call() -> Any:
        return fn(*args)

    with torch.no_grad():
        if torch.cuda.is_available():
            return _bench_ms(call, warmup_ms, rep_ms, flush_l2) * 1e-3
        return _bench_cpu_ms(call, warmup_ms, rep_ms) * 1e-3


def time_plan(
    plan: Any, inputs: Sequence[torch.Tensor], warmup_ms: float = 25, rep_ms: float = 100
) -> float:
    """End-to-end seconds of ``runtime.execute(plan, inputs)`` (median), as time_callable."""
    inputs = list(inputs)
    return time_callable(lambda: execute(plan, inputs), (), warmup_ms, rep_ms)


def l2_cache_bytes(device: Any = None) -> int:
    """The target's L2 size (inputs under ~2x of it are rotated between timed runs)."""
    index = device.index if isinstance(device, torch.device) else device
    return target(index).l2_bytes


@dataclass
class GPUTimer:
    """Measures candidates on CUDA: verify (fresh random inputs, float64 eager reference), then
    the median of ``do_bench`` over the kernel launch alone. When the buffers are under ~2x the
    L2 size, launches rotate among several input/output sets so consecutive runs do not find
    them in cache. Compile errors, out-of-resources and wrong results are failures."""

    warmup_ms: float = 25
    rep_ms: float = 100
    verify: bool = True
    flush_l2: bool = True
    rotate: bool = True
    seed: int = 0
    max_sets: int = 16
    device: str = "cuda"

    source = "measured"

    def measure(self, candidate: Candidate) -> Measurement:
        if not torch.cuda.is_available():
            return Measurement.failed("no CUDA device: GPUTimer needs a GPU", "measured")
        device = torch.device(self.device)
        if self.verify:
            why = verify_candidate(candidate, device, self.seed)
            if why:
                return Measurement.failed(why, "measured")

        try:
            sub, info, kernel = build_kernel(candidate)
            sets = self._buffer_sets(sub, info, device)
            calls = [kernel_args(kernel, bufs) for bufs in sets]
            launch = launcher_for(kernel)  # launched as plans launch it
            for pos in calls:  # compiles on the first launch
                launch(pos)
            torch.cuda.synchronize(device)
            state = [0]

            def run() -> None:
                pos = calls[state[0]]
                state[0] = (state[0] + 1) % len(calls)
                launch(pos)

            ms = _bench_ms(run, self.warmup_ms, self.rep_ms, self.flush_l2)
        except Exception as e:  # noqa: BLE001
            return Measurement.failed(describe_error(e), "measured")
        if not (ms > 0 and math.isfinite(ms)):
            return Measurement.failed(f"timer returned {ms!r} ms", "measured")
        return Measurement(ms * 1e-3, None, "measured")

    def _buffer_sets(self, sub: Graph, info: GroupInfo, device) -> list[list[torch.Tensor]]:
        size = sum(nbytes(sub, j) for j in info.loads) + sum(nbytes(sub, s) for s in info.stored)
        n = 1
        l2 = l2_cache_bytes(device)
        if self.rotate and size < 2 * l2:
            n = max(2, min(self.max_sets, math.ceil(4 * l2 / max(size, 1))))
        out = []
        for k in range(n):
            ins = random_inputs(sub, device, self.seed + 1 + k)
            outs = poisoned_outputs(sub, info, device)
            out.append([*ins, *outs])
        return out

    def eager_time(self, graph: Graph, i: int) -> float:
        """Measured time of eager op ``i`` on random inputs (integer inputs are zeros here, so
        index-like arguments stay in range); falls back to the model if it cannot run."""
        try:
            return self.eager_time_of(eager_subgraph(graph, i))
        except Exception as e:  # noqa: BLE001
            logs.log.warning("eager op %%%d could not be timed (%s): modeled", i, describe_error(e))
            return CostModel().eager_time(graph, i)

    def eager_time_of(self, sub: Graph) -> float:
        device = torch.device(self.device)
        ins = random_inputs(sub, device, self.seed)
        ins = [x if x.is_floating_point() else torch.zeros_like(x) for x in ins]
        run_graph(sub, ins)
        torch.cuda.synchronize(device)
        return time_callable(run_graph, (sub, ins), self.warmup_ms, self.rep_ms, self.flush_l2)


def config_timer(
    timer: GPUTimer | None = None,
) -> Callable[[Graph, GroupInfo, Any], float | None] | None:
    """The untuned plan's config timer (``plan/config_choice.py``): a group's kernel under a
    config, verified against float64 eager on fresh random inputs, then timed alone (short
    runs: a few configs per kernel); seconds, or None where it failed or was wrong. None (no
    timer: the default configs) under ``AUTOFUSE_TIME_CONFIGS=0``."""
    if not settings().time_configs:
        return None
    timer = timer or GPUTimer(warmup_ms=5, rep_ms=25)

    def seconds(graph: Graph, info: GroupInfo, config: Any) -> float | None:
        m = timer.measure(Candidate(graph, info, config))
        if not m.ok:
            logs.emit("search", f"config {config!r} not kept: {m.failure}")
        return m.seconds if m.ok else None

    return seconds
