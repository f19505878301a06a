"""The plan to run without a search, chosen by one measurement where two are in doubt.

A fused matmul kind (attention forward and backward, matmul + row softmax) removes the round
trips of the score matrix through memory, but its kernel is not always faster than cuBLAS with
the rest of its group fused around it: on the H200 the backward graph of the suite's llama_eager
took 4369 us with the fused attention backward and 3987 us with cuBLAS, while ViT's took 4821 us
fused and 5753 us with cuBLAS (results/h200/models_07dd1a2.json). So where the untuned plan
fuses a matmul, the planner (``planner.py``) also builds the plan with every matmul in cuBLAS and times
both end to end on inputs of the graph's shapes (:func:`choose_plan`, the timer injected); off
CUDA, or under the interpreter, the fused plan is kept without timing.

Ops autofuse does not generate may be offered as several library calls (SDPA's backends, whose
speed ranks differently by GPU, cuDNN version and shape): :func:`library_variants` lists, per
call name, the plan with that call wherever it is offered, and the planner times them against
the rule's plan (the backend torch picked) the same way, untuned and after a search.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from autofuse.ir.graph import Graph
from autofuse.kernels import (
    INLINE_OPS,
    LibraryCall,
    call_reason,
    fusible,
    library_calls,
    preferred_call,
)
from autofuse.plan.graph_choice import Timer, beats, end_to_end_seconds
from autofuse.plan.steps import LibraryStep, Plan


@dataclass(frozen=True)
class PlanChoice:
    """Which of the untuned plans ran, each one's seconds per call (None: not timed), why."""

    chosen: str
    times: tuple[tuple[str, float | None], ...]
    why: str


ROUNDS = 2  # interleaved timing rounds, the order reversed in the second (none always hottest)


def choose_plan(
    plans: Sequence[Any],
    run: Callable[[Any], Any],
    on_cuda: bool,
    timer: Timer = end_to_end_seconds,
    rounds: int = ROUNDS,
) -> tuple[Any, PlanChoice]:
    """The first of ``plans`` unless another :func:`beats` the best before it (its best round
    against the incumbent's rounds: a lead inside their spread is no lead); ``run(plan)`` is one
    call of it. The plans are timed in ``rounds`` interleaved rounds, so a clock that drifts
    during the planning (launch-bound plans of a few ms) favours none. A plan that fails when
    run is skipped, with its error in ``why``."""
    first = plans[0]
    if not on_cuda or len(plans) == 1:
        why = (
            "not timed: not on CUDA (or under the interpreter)" if on_cuda is False else "one plan"
        )
        return first, PlanChoice(first.label, ((first.label, None),), why)
    timed, notes = timed_rounds(plans, run, timer, rounds)
    best = None
    for k, ts in enumerate(timed):
        if ts and (best is None or beats(min(ts), timed[best])):
            best = k
    times = tuple((p.label, min(ts) if ts else None) for p, ts in zip(plans, timed))
    shown = ", ".join(f"{lb} {s * 1e6:.1f} us" for lb, s in times if s is not None)
    why = "; ".join([f"timed end to end ({rounds} interleaved rounds, best): {shown}", *notes])
    chosen = first if best is None else plans[best]
    return chosen, PlanChoice(chosen.label, times, why)


def timed_rounds(
    plans: Sequence[Any], run: Callable[[Any], Any], timer: Timer, rounds: int
) -> tuple[list[list[float]], list[str]]:
    """Each plan's seconds per call in each round (empty where it failed) and the failures."""
    timed: list[list[float]] = [[] for _ in plans]
    failed: dict[int, str] = {}
    for r in range(rounds):
        order = range(len(plans)) if r % 2 == 0 else reversed(range(len(plans)))
        for k in order:
            if k in failed:
                continue
            plan = plans[k]
            try:
                with torch.no_grad():
                    timed[k].append(timer(lambda plan=plan: run(plan)))
            except Exception as e:  # noqa: BLE001 - a plan that cannot run here is not chosen
                failed[k] = f"{plan.label}: {type(e).__name__}: {e}"[:200]
                timed[k] = []
    return timed, list(failed.values())


Variant = tuple[str, tuple[tuple[int, LibraryCall], ...]]  # a call name, (node, its call) each


def library_variants(graph: Graph) -> list[Variant]:
    """For the ops outside every group that providers offer calls for (SDPA's backends): per
    call name, that call at each op that offers it (the rule's step elsewhere), except where
    that is the rule's plan already."""
    offered = {}
    for i in graph.compute_nodes():
        if not fusible(graph, i) and graph[i].op not in INLINE_OPS:
            calls = library_calls(graph, frozenset({i}))
            if calls:
                offered[i] = calls
    rule = {i: preferred_call(graph, i) for i in offered}
    names = dict.fromkeys(c.name for calls in offered.values() for c in calls)
    out: list[Variant] = []
    for name in names:
        pick = tuple((i, c) for i, calls in offered.items() for c in calls if c.name == name)
        if any(rule[i] != c for i, c in pick):
            out.append((name, pick))
    return out


def with_calls(plan: Plan, variant: Variant, why: str = "timed against the rule's call") -> Plan:
    """``plan`` with the step of each op of ``variant`` replaced by its call (the other steps,
    kernels included, kept as they are); labelled ``<plan's label>, <call>``."""
    name, pick = variant
    calls = dict(pick)
    g = plan.graph
    steps = tuple(
        LibraryStep(calls[s.out], f"{call_reason(g, calls[s.out])}; {why}")
        if getattr(s, "out", None) in calls
        else s
        for s in plan.steps
    )
    label = pick[0][1].label if pick else name
    return Plan(g, steps, f"{plan.label}, {label}")


def merged(choices: Sequence[PlanChoice]) -> PlanChoice:
    """Timed choices made one after the other, as one (the last one's pick)."""
    times = tuple(t for c in choices for t in c.times)
    return PlanChoice(choices[-1].chosen, times, "; then ".join(c.why for c in choices))
