"""The plan that runs without a search (``optimize`` without ``trials``, the backend's default).

Every legal fusion at default configs, GEMMs with an epilogue in cuBLAS
(``Partitioner.untuned``). Where that still fuses a matmul (attention forward or backward, a
row GEMM) and the inputs are on CUDA, the plan with every matmul in cuBLAS is built too and the
two are timed end to end (``plan/plan_choice.py``): which one is faster depends on the shapes
(see there). Off CUDA, or under the interpreter, the fused plan is kept and nothing is timed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from autofuse import logs
from autofuse.interpreter import interpreting
from autofuse.ir import Graph
from autofuse.partition import Partitioner
from autofuse.plan import Plan, build_plan, execute
from autofuse.plan.plan_choice import PlanChoice, choose_plan
from autofuse.plan.steps import annotated


def untuned_plan(
    graph: Graph,
    label: str,
    on_cuda: bool,
    inputs: Callable[[], Sequence[torch.Tensor]],
    space: Partitioner | None = None,
) -> tuple[Plan, PlanChoice | None]:
    """The untuned plan of ``graph`` and, where two were timed, the choice (else None);
    ``inputs()`` gives the graph's inputs to time on (called only when timing)."""
    space = space or Partitioner(graph)
    base = space.untuned()
    plan = build_plan(graph, base.groups, label=label)
    alt = space.library_gemms(base)
    if alt is None or not on_cuda or interpreting():
        return plan, None
    try:
        other = build_plan(graph, alt.groups, label=f"{label}, matmuls in cuBLAS")
        ins: Any = list(inputs())
    except Exception as e:  # noqa: BLE001 - a measurement never fails the plan: the fused one
        why = f"not timed: {type(e).__name__}: {e}"[:300]
        return plan, PlanChoice(plan.label, ((plan.label, None),), why)
    chosen, choice = choose_plan([plan, other], lambda p: execute(p, ins), True)
    logs.emit("search", f"{label}: {choice.why} -> {choice.chosen}")
    if any(t is not None for _, t in choice.times):
        measured = f"measured: {choice.why} -> {choice.chosen}"
        chosen = annotated(chosen, lambda s: f"{s.reason}; {measured}" if s.reason else measured)
    return chosen, choice
