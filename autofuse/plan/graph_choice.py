"""``cuda_graph="auto"``: replay a plan as a CUDA graph only where that is faster end to end.

A CUDA graph removes the host's cost of a call (the launches, the program's bookkeeping) and
adds copies (a new batch into the graph's buffers, the outputs out of its static ones). Which
side wins depends on the plan: a plan of many short kernels is bound by the host and gains, a
plan of a few long kernels loses the copies. So the choice is measured: the call is timed as it
runs (host and device, back to back: :func:`end_to_end_seconds`) kernel by kernel and by
replay, and the replay is kept when it :func:`beats` the plain call. The timer is
injected (tests pass their own); off CUDA, or under Triton's interpreter, nothing is timed and
the plan runs kernel by kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from autofuse.interpreter import interpreting

MIN_GAIN = 0.02


def beats(challenger_s: float, incumbent_s: Sequence[float]) -> bool:
    """The one rule by which a timed alternative replaces the incumbent (the untuned fused plan,
    the plain call against its CUDA graph replay, the greedy plan against the tuned ones): it is
    faster than the incumbent's best round by more than ``MIN_GAIN`` and by more than the spread
    of the incumbent's rounds (``incumbent_s``: one round or several). A win inside the noise is
    no win: the incumbent is the plan that costs nothing more to keep."""
    best = min(incumbent_s)
    noise = (max(incumbent_s) - best) / best if best > 0 else 0.0
    return challenger_s < best * (1.0 - max(MIN_GAIN, noise))


Timer = Callable[[Callable[[], Any]], float]


@dataclass(frozen=True)
class GraphChoice:
    """What the measurement chose: replay or not, with the two times (None where not timed)
    and why."""

    replay: bool
    plain_s: float | None
    graph_s: float | None
    why: str


def end_to_end_seconds(call: Callable[[], Any], reps: int = 50, warmup: int = 5) -> float:
    """Seconds per call of ``call`` run ``reps`` times back to back between two CUDA events:
    the host's cost counts wherever it leaves the device idle (unlike a kernel-only timer)."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(3):
        start.record()
        for _ in range(reps):
            call()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / reps)
    return best


def choose_replay(
    plain: Callable[[], Any],
    replayed: Callable[[], Any],
    on_cuda: bool,
    timer: Timer = end_to_end_seconds,
) -> GraphChoice:
    """Time ``plain`` (kernel by kernel) and ``replayed`` (the same call replaying a CUDA
    graph) with ``timer``; replay when it :func:`beats` the plain call."""
    if not on_cuda:
        return GraphChoice(False, None, None, "not on CUDA (or under the interpreter)")
    t_plain = timer(plain)
    try:
        t_graph = timer(replayed)
    except Exception as e:  # noqa: BLE001 - not capturable: kernel by kernel
        return GraphChoice(False, t_plain, None, f"replay failed: {type(e).__name__}: {e}"[:300])
    if beats(t_graph, [t_plain]):
        why = f"replay {t_graph * 1e6:.1f} us vs {t_plain * 1e6:.1f} us kernel by kernel"
        return GraphChoice(True, t_plain, t_graph, why)
    why = f"kernel by kernel {t_plain * 1e6:.1f} us vs replay {t_graph * 1e6:.1f} us"
    return GraphChoice(False, t_plain, t_graph, why)


def cuda_inputs(args: Any) -> bool:
    """Whether a call on ``args`` can be replayed at all: CUDA tensors, no interpreter."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return bool(tensors) and all(t.is_cuda for t in tensors) and not interpreting()


def parse_cuda_graph(value: Any, where: str) -> bool | str:
    """``cuda_graph``'s value: True, False or "auto"; anything else raises naming it."""
    if value in (True, False, "auto"):
        return value
    raise ValueError(f"{where}: cuda_graph must be True, False or 'auto', got {value!r}")
