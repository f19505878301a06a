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
