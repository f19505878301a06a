"""The plan to run without a search, chosen by one measurement where two are in doubt.

A fused matmul kind (attention forward and backward, matmul + row softmax) removes the round
trips of the score matrix through memory, but its kernel is not always faster than cuBLAS with
the rest of its group fused around it: on the H200 the backward graph of the suite's llama_eager
took 4369 us with the fused attention backward and 3987 us with cuBLAS, while ViT's took 4821 us
fused and 5753 us with cuBLAS (results/h200/models_07dd1a2.json). So where the untuned plan
fuses a matmul, the planner (``planner.py``) also builds the plan with every matmul in cuBLAS and times
both end to end on inputs of the graph's shapes (:func:`choose_plan`, the timer injected); off
CUDA, or under the interpreter, the fused plan is kept without timing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from autofuse.plan.graph_choice import Timer, beats, end_to_end_seconds


@dataclass(frozen=True)
class PlanChoice:
    """Which of the untuned plans ran, each one's seconds per call (None: not timed), why."""

    chosen: str
    times: tuple[tuple[str, float | None], ...]
    why: str


def choose_plan(
    plans: Sequence[Any],
    run: Callable[[Any], Any],
    on_cuda: bool,
    timer: Timer = end_to_end_seconds,
) -> tuple[Any, PlanChoice]:
    """The first of ``plans`` unless another :func:`beats` the best before it (``run(plan)``
    is one call of it); a plan that fails when run is skipped, with its error in ``why``."""
    first = plans[0]
    if not on_cuda or len(plans) == 1:
        why = (
            "not timed: not on CUDA (or under the interpreter)" if on_cuda is False else "one plan"
        )
        return first, PlanChoice(first.label, ((first.label, None),), why)
    times: list[tuple[str, float | None]] = []
    best, best_s, notes = None, float("inf"), []
    for plan in plans:
        try:
            with torch.no_grad():
                s = timer(lambda plan=plan: run(plan))
        except Exception as e:  # noqa: BLE001 - a plan that cannot run here is not chosen
            times.append((plan.label, None))
            notes.append(f"{plan.label}: {type(e).__name__}: {e}"[:200])
            continue
        times.append((plan.label, s))
        if best is None or beats(s, [best_s]):
            best, best_s = plan, s
    best = best if best is not None else first
    timed = ", ".join(f"{lb} {s * 1e6:.1f} us" for lb, s in times if s is not None)
    why = "; ".join([f"timed end to end: {timed}", *notes])
    return best, PlanChoice(best.label, tuple(times), why)
