"""Library calls that fuse a generated kernel's work, as plan variants (plan -> plans).

A plan runs a convolution as its library call and the epilogue after it in a generated kernel.
A provider may run more of that chain in one call (``kernels/library/cudnn.py``: the
convolution, its bias add, a residual add and a ReLU as cuDNN's fused convolution-bias-
activation). :func:`fused_call_plans` builds, per call name, the plan with every such chain run
as its call — the rest of the kernel that held the chain's epilogue still generated — for the
planner to time end to end against the plan as it is (``planner.py``), after
:func:`agreeing` has checked each variant's outputs against the plan's on the same inputs
(:func:`tolerance_of`: float32 under cuDNN's TF32 at float16's tolerance): a call whose result
differs is never chosen.

The chains are found without knowing any provider: from each lone step (a node run alone as a
library call or in eager), the path of single readers into the kernel that reads it, each
prefix of it offered to the providers as a group (``kernels.library_calls``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from autofuse.ir.graph import Graph
from autofuse.ir.tolerance import compare
from autofuse.kernels import (
    FusionRefused,
    LibraryCall,
    analyze_group,
    call_reason,
    default_config,
    generate,
    library_calls,
)
from autofuse.plan.plan_choice import PlanChoice, choose_plan
from autofuse.plan.steps import KernelStep, LibraryStep, Plan, Step

__all__ = [
    "agreeing",
    "choose_fused",
    "fused_call_plans",
    "fusions",
    "tolerance_of",
    "with_fused_variants",
]

Fusion = tuple[int, KernelStep, LibraryCall]  # the lone step's index, the kernel, the call


def _path(graph: Graph, start: int, members: frozenset[int]) -> list[int]:
    """From ``start``, each node's single reader while it is among ``members``."""
    path, cur = [], start
    outs = {graph.base_of(o) for o in graph.outputs}
    while cur not in outs and len(graph.users[cur]) == 1 and graph.users[cur][0] in members:
        cur = graph.users[cur][0]
        path.append(cur)
    return path


def fusions(plan: Plan) -> list[Fusion]:
    """Each lone step whose result one kernel reads through a chain some provider runs with
    it in one call (the longest chain offered), with that kernel and the call."""
    g, out = plan.graph, []
    kernel_of = {i: s for s in plan.steps if isinstance(s, KernelStep) for i in s.nodes}
    for k, step in enumerate(plan.steps):
        if isinstance(step, KernelStep) or len(step.nodes) != 1:
            continue
        (lone,) = step.nodes
        reader = kernel_of.get(g.users[lone][0]) if len(g.users[lone]) == 1 else None
        if reader is None:
            continue
        path = _path(g, lone, frozenset(reader.nodes))
        for n in range(len(path), 0, -1):
            calls = library_calls(g, frozenset({lone, *path[:n]}))
            if calls and _rest_ok(g, reader, frozenset(path[:n])):
                out.append((k, reader, calls[0]))
                break
    return out


def _rest_ok(graph: Graph, reader: KernelStep, taken: frozenset[int]) -> bool:
    rest = frozenset(reader.nodes) - taken
    if not rest:
        return True
    try:
        analyze_group(graph, rest)
    except FusionRefused:
        return False
    return True


def _with_fusions(plan: Plan, chosen: Sequence[Fusion], name: str) -> Plan:
    """``plan`` with each fusion's call in place of its kernel (the kernel's other nodes in a
    kernel of their own, at its default config) and its lone step dropped."""
    g = plan.graph
    lone = {k for k, _, _ in chosen}
    at = {id(reader): call for _, reader, call in chosen}
    steps: list[Step] = []
    for k, step in enumerate(plan.steps):
        if k in lone:
            continue
        call = at.get(id(step))
        if call is None:
            steps.append(step)
            continue
        why = f"{call_reason(g, call)}; timed against the convolution and its epilogue kernel"
        steps.append(LibraryStep(call, why))
        rest = frozenset(step.nodes) - frozenset(call.nodes)
        if rest:
            info = analyze_group(g, rest)
            kernel = generate(g, info, default_config(info, g), index=len(steps))
            steps.append(KernelStep(kernel, reason="the rest of a kernel a library call fuses"))
    return Plan(g, tuple(steps), f"{plan.label}, {name}")


def fused_call_plans(plan: Plan) -> list[Plan]:
    """Per call name on offer, ``plan`` with every chain that call runs fused into it."""
    found = fusions(plan)
    names = dict.fromkeys(call.label for _, _, call in found)
    return [_with_fusions(plan, [f for f in found if f[2].label == name], name) for name in names]


def tolerance_of(dtype: torch.dtype) -> str:
    """The tolerance a variant's output of ``dtype`` is held to against the plan's: float32
    computed by cuDNN with TF32 allowed (``torch.backends.cudnn.allow_tf32``, torch's default)
    carries products of a 10-bit mantissa in both, as float16's: that type's tolerance."""
    name = str(dtype).removeprefix("torch.")
    return "float16" if name == "float32" and torch.backends.cudnn.allow_tf32 else name


def _differs(outs: Sequence[Any], ref: Sequence[Any]) -> str | None:
    for k, (o, r) in enumerate(zip(outs, ref)):
        if isinstance(o, torch.Tensor) and isinstance(r, torch.Tensor):
            expect = r.double() if r.is_floating_point() else r
            why = compare(o, expect, tolerance_of(r.dtype), k)
            if why is not None:
                return why
    return None


def agreeing(
    plan: Plan, variants: Sequence[Plan], run: Callable[[Plan], Any]
) -> tuple[list[Plan], list[str]]:
    """The ``variants`` whose outputs match ``plan``'s on one run (``run(p)``: the outputs of
    one call of ``p``), and why each other one was dropped."""
    if not variants:
        return [], []
    with torch.no_grad():
        ref = list(run(plan))
    kept, notes = [], []
    for v in variants:
        try:
            with torch.no_grad():
                why = _differs(list(run(v)), ref)
        except Exception as e:  # noqa: BLE001 - a variant that cannot run is not chosen
            why = f"{type(e).__name__}: {e}"
        if why is None:
            kept.append(v)
        else:
            notes.append(f"{v.label}: not a candidate, {why}"[:300])
    return kept, notes


def choose_fused(plan: Plan, run: Callable[[Plan], Any]) -> tuple[Plan, PlanChoice] | None:
    """``plan`` or one of its fused-call variants, timed end to end (``run(p)``: one call of
    ``p`` on CUDA inputs) among those that agree with it; None where none is on offer."""
    variants = fused_call_plans(plan)
    if not variants:
        return None
    kept, notes = agreeing(plan, variants, run)
    chosen, choice = choose_plan([plan, *kept], run, True)
    if notes:
        choice = replace(choice, why="; ".join([choice.why, *notes]))
    return chosen, choice


def with_fused_variants(plans: Sequence[Plan], run: Callable[[Plan], Any]) -> list[Plan]:
    """Each of ``plans`` followed by its fused-call variants that agree with it: an alternative
    whose gain lies in the calls it opens (BatchNorm folded into a convolution's weight makes
    its shift a bias cuDNN's fused call takes) is timed with them, not only as it is."""
    out: list[Plan] = []
    for plan in plans:
        out.append(plan)
        out.extend(agreeing(plan, fused_call_plans(plan), run)[0])
    return out
