"""Building a plan: a partition of the graph and one implementation per group, as steps in an
order that runs.

A group's choice is one of its offers (``kernels.offers``): a :class:`KernelChoice` (a kind's
kernel under a config), a :class:`LibraryCall` (the group runs as that call) or :data:`EAGER`
(its ops run in eager); or a launch config of the first kind that claims it (None: its default
config). The rule for a group without a choice of call or eager: a lone matmul
is the library's call (cuBLAS; a config given for it is not used), a lone convolution its ATen
call (cuDNN) unless ``kernels/conv/rule.py`` says otherwise, any other group the kind's
kernel at the config given or its default one. An op autofuse does not generate (outside every
group) runs as the call its library provider prefers (SDPA: the backend torch picked when
tracing), else as traced (an eager step); a group of one such op with a :class:`LibraryCall`
choice runs as that call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autofuse.ir.graph import Graph
from autofuse.kernels import (
    EAGER,
    INLINE_OPS,
    LONE_RULE,
    KernelChoice,
    LibraryCall,
    analyze_group,
    call_reason,
    default_config,
    fusible,
    generate,
    library_calls,
    library_note,
    lone_library,
    preferred_call,
    rule_note,
    unlowerable,
)
from autofuse.plan.code_log import output_code
from autofuse.plan.steps import EagerStep, KernelStep, LibraryStep, Plan, Step


def eager_reason(graph: Graph, i: int) -> str:
    node = graph[i]
    note = library_note(graph, i)
    if note is not None:
        return note
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
    GPU; a lone convolution its rule keeps in the library: its ATen call, cuDNN on GPU) rather
    than as a generated kernel."""
    return library_group(graph, group) is not None or lone_library(graph, group)


RULE_LIBRARY = "rule: a lone matmul runs as its library call"
RULE_KERNEL = "rule: the first kind that claims the group, at its default config"
RULE_PREFERRED = "rule: the call its library prefers unmeasured"


def build_plan(
    graph: Graph,
    groups: Sequence[frozenset[int]],
    configs: Sequence[Any] | None = None,
    label: str = "plan",
) -> Plan:
    """Order the groups (and the eager ops) topologically and make one step per group by its
    choice in ``configs`` (see the module docstring; None throughout: the rule). Each step
    says why it is that implementation (the rule, or that it was chosen)."""
    choices = list(configs) if configs is not None else [None] * len(groups)
    covered = set().union(*groups) if groups else set()
    missing = [i for i in graph.compute_nodes() if fusible(graph, i) and i not in covered]
    refused = {i: unlowerable(graph, i) for i in missing}
    if any(r is None for r in refused.values()):
        raise ValueError(f"partition leaves nodes {missing} in no group")
    units = [u for group, choice in zip(groups, choices) for u in _units(graph, group, choice)]
    units += [
        _outside(graph, i, refused.get(i))
        for i in graph.compute_nodes()
        if ((not fusible(graph, i) and graph[i].op not in INLINE_OPS) and i not in covered)
        or i in refused
    ]
    steps: list[Step] = []
    for u in _topo_units(graph, units):
        kind, v = units[u]
        if kind == "kernel":
            info, cfg, why = v
            kernel = generate(graph, info, cfg or default_config(info, graph), index=len(steps))
            steps.append(KernelStep(kernel, reason=why))
        elif kind == "library":
            call, why = v
            steps.append(LibraryStep(call, f"{call_reason(graph, call)}; {why}"))
        else:
            steps.append(EagerStep(*v))
    plan = Plan(graph, tuple(steps), label)
    output_code(plan)
    return plan


def _outside(graph: Graph, i: int, refused: str | None) -> tuple[str, Any]:
    """The step of node ``i``, in no group: its library's preferred call, else eager."""
    call = None if refused else preferred_call(graph, i)
    if call is not None:
        return ("library", (call, RULE_PREFERRED))
    return ("eager", (i, refused or eager_reason(graph, i)))


def _units(graph: Graph, group: frozenset[int], choice: Any) -> list[tuple[str, Any]]:
    """The step(s) ``group`` becomes under ``choice``: ("kernel", (info, config, why)),
    ("library", (call, why)) or one ("eager", (node, why)) per op."""
    group = frozenset(group)
    if isinstance(choice, LibraryCall):
        if choice not in library_calls(graph, group):
            raise ValueError(f"no library offers {choice.label} for the group {sorted(group)}")
        return [("library", (choice, "chosen among the group's implementations"))]
    if isinstance(choice, str) and choice == EAGER:
        return [("eager", (i, "chosen among the group's implementations")) for i in sorted(group)]
    if isinstance(choice, KernelChoice):
        info = analyze_group(graph, group, choice.kind)
        return [("kernel", (info, choice.config, "chosen among the group's implementations"))]
    call = library_group(graph, group)  # a config given for a lone matmul is not used
    if call is not None:
        return [("library", (call, RULE_LIBRARY))]
    if lone_library(graph, group):  # its ATen call, as an op autofuse does not generate
        return [("eager", (next(iter(group)), LONE_RULE))]
    info = analyze_group(graph, group)
    why = RULE_KERNEL if choice is None else "the config chosen for it"
    note = rule_note(graph, info)
    return [("kernel", (info, choice, f"{why} ({note})" if note else why))]


def _unit_nodes(unit: tuple[str, Any]) -> tuple[int, ...]:
    kind, v = unit
    if kind == "kernel":
        return v[0].nodes
    return v[0].nodes if kind == "library" else (v[0],)


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


__all__ = [
    "EAGER",
    "RULE_KERNEL",
    "RULE_LIBRARY",
    "RULE_PREFERRED",
    "build_plan",
    "eager_group",
    "eager_reason",
    "library_group",
]
