"""Building a plan: a partition of the graph and one implementation per group, as steps in an
order that runs.

A group's choice is a launch config of the kind that claims it (a generated kernel; None: the
kind's default config), a :class:`LibraryCall` (the group runs as that call) or :data:`EAGER`
(its ops run in eager). The rule for a group without a choice of call or eager: a lone matmul
is the library's call (cuBLAS; a config given for it is not used), any other group the kind's
kernel at the config given or its default one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autofuse.ir.graph import Graph
from autofuse.kernels import (
    INLINE_OPS,
    LibraryCall,
    analyze_group,
    call_reason,
    default_config,
    fusible,
    generate,
    library_calls,
    unlowerable,
)
from autofuse.plan.code_log import output_code
from autofuse.plan.steps import EagerStep, KernelStep, LibraryStep, Plan, Step

EAGER = "eager"  # a group's choice: its ops run in eager


def eager_reason(graph: Graph, i: int) -> str:
    node = graph[i]
    if node.kind == "matmul":
        return f"{node.op} runs as torch.{node.op} (cuBLAS on GPU)"
    if node.op == "getitem":
        return "output of a multi-output op"
    return f"unsupported op {node.attr('target', node.op)}: runs in eager"


def library_group(graph: Graph, group: frozenset[int]) -> LibraryCall | None:
    """The library call the rule gives ``group`` (a group of one matmul and nothing else: the
    cuBLAS provider's), or None (the group is a generated kernel)."""
    if len(group) != 1 or graph[next(iter(group))].kind != "matmul":
        return None
    calls = library_calls(graph, frozenset(group))
    return calls[0] if calls else None


def eager_group(graph: Graph, group: frozenset[int]) -> bool:
    """Whether the rule runs ``group`` as a library call (a lone matmul: torch.mm, cuBLAS on
    GPU) rather than as a generated kernel."""
    return library_group(graph, group) is not None


def build_plan(
    graph: Graph,
    groups: Sequence[frozenset[int]],
    configs: Sequence[Any] | None = None,
    label: str = "plan",
) -> Plan:
    """Order the groups (and the eager ops) topologically and make one step per group by its
    choice in ``configs`` (see the module docstring; None throughout: the rule)."""
    choices = list(configs) if configs is not None else [None] * len(groups)
    covered = set().union(*groups) if groups else set()
    missing = [i for i in graph.compute_nodes() if fusible(graph, i) and i not in covered]
    refused = {i: unlowerable(graph, i) for i in missing}
    if any(r is None for r in refused.values()):
        raise ValueError(f"partition leaves nodes {missing} in no group")
    units: list[tuple[str, Any]] = []
    for group, choice in zip(groups, choices):
        call = choice if isinstance(choice, LibraryCall) else None
        if call is not None and call not in library_calls(graph, frozenset(group)):
            raise ValueError(f"no library offers {call.label} for the group {sorted(group)}")
        if call is None and not isinstance(choice, str):  # a config: a lone matmul's ignored
            call = library_group(graph, group)
        if call is not None:
            units.append(("library", call))
        elif isinstance(choice, str) and choice == EAGER:
            units += [("eager", i) for i in sorted(group)]
        else:
            units.append(("kernel", (analyze_group(graph, frozenset(group)), choice)))
    units += [
        ("eager", i)
        for i in graph.compute_nodes()
        if (not fusible(graph, i) and graph[i].op not in INLINE_OPS) or i in refused
    ]
    steps: list[Step] = []
    for u in _topo_units(graph, units):
        kind, v = units[u]
        if kind == "kernel":
            info, cfg = v
            cfg = cfg or default_config(info, graph)
            steps.append(KernelStep(generate(graph, info, cfg, index=len(steps))))
        elif kind == "library":
            steps.append(LibraryStep(v, call_reason(graph, v)))
        else:
            steps.append(EagerStep(v, refused.get(v) or eager_reason(graph, v)))
    plan = Plan(graph, tuple(steps), label)
    output_code(plan)
    return plan


def _unit_nodes(unit: tuple[str, Any]) -> tuple[int, ...]:
    kind, v = unit
    if kind == "kernel":
        return v[0].nodes
    return v.nodes if kind == "library" else (v,)


def _topo_units(graph: Graph, units: list[tuple[str, Any]]) -> list[int]:
    owner = {n: u for u, unit in enumerate(units) for n in _unit_nodes(unit)}
    deps: list[set[int]] = []
    for unit in units:
        d = set()
        for n in _unit_nodes(unit):
            for j in graph.compute_inputs(n):
                if j in owner and owner[j] != owner[n]:
                    d.add(owner[j])
        deps.append(d)
    done: list[int] = []
    placed: set[int] = set()
    pending = sorted(range(len(units)), key=lambda u: min(_unit_nodes(units[u])))
    while pending:
        for u in pending:
            if deps[u] <= placed:
                done.append(u)
                placed.add(u)
                pending.remove(u)
                break
        else:
            raise ValueError("the partition has a cycle between groups (a group is not convex)")
    return done


__all__ = ["EAGER", "build_plan", "eager_group", "eager_reason", "library_group"]
