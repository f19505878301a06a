"""Where a step's GPU time goes, kernel by kernel (``torch.profiler``), for the benchmarks'
records: which of autofuse's kernels lose against which of torch.compile's.

``kernel_times(step)`` runs ``step`` a few times under the profiler and returns the kernels
(generated Triton kernels, cuBLAS / cuDNN kernels, eager ATen kernels) by total device time per
step, largest first, with their launches per step and their share of the step's kernel time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def kernel_times(
    step: Callable[[], Any], runs: int = 3, top: int = 20, device: str = "cuda"
) -> dict:
    """{"total_us": device time per step, "kernels": [[name, us per step, launches, share]]}.
    ``device="cpu"`` ranks the ATen ops by CPU time instead (for tests)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    step()
    sync()
    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        for _ in range(runs):
            step()
        sync()
    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    rows: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type != kind or (not cuda and not e.name.startswith("aten::")):
            continue
        r = rows.setdefault(e.name, [0.0, 0])
        r[0] += e.device_time_total if cuda else e.self_cpu_time_total
        r[1] += 1
    total = sum(us for us, _ in rows.values()) / runs
    ranked = sorted(rows.items(), key=lambda kv: kv[1][0], reverse=True)[:top]
    return {
        "total_us": total,
        "kernels": [
            [name[:160], us / runs, n / runs, (us / runs) / total if total else 0.0]
            for name, (us, n) in ranked
        ],
    }


def host_times(step: Callable[[], Any], runs: int = 5, top: int = 25, device: str = "cuda") -> dict:
    """The host's side of a step: the time until the call returns with its work enqueued
    (``enqueue_us``; the queue drained before each call) against the time until the device has
    done it (``wall_us``), best of ``runs``; and the Python functions that take the host's
    time (``cProfile``, per step, by own time). Where ``enqueue_us`` is close to ``wall_us``
    the step is bound by the host (or waits on the device inside the call)."""
    import cProfile
    import pstats
    import time

    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    step()
    sync()
    enq, wall = [], []
    for _ in range(runs):
        sync()
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        sync()
        enq.append(t1 - t0)
        wall.append(time.perf_counter() - t0)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3):
        step()
    prof.disable()
    sync()
    stats = pstats.Stats(prof).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    ranked = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    return {
        "enqueue_us": min(enq) * 1e6,
        "wall_us": min(wall) * 1e6,
        "functions": [
            [
                f"{f.rsplit('/', 2)[-1] if '/' in f else f}:{line}({name})",
                nc / 3,
                tt / 3 * 1e6,
                ct / 3 * 1e6,
            ]
            for (f, line, name), (_, nc, tt, ct, _) in ranked
        ],  # fmt: skip
    }
