"""Launch configs an untuned plan times on a GPU, a few per kernel.

A kind's default config is a rule; where the kind offers a few others (``quick_configs``:
pointwise loops at one, two or eight outputs a thread, row reductions at 1 to 128 rows a
block), the planner times each on the group's kernel alone, verified first, and keeps the
fastest, as Inductor times a handful of configs per kernel before it runs one. The timer is
injected (``ConfigTimer``: ``measure.config_timer`` on a GPU); the default stays unless another
config beats it by more than :data:`MARGIN`, and a kernel whose default takes under
:data:`WORTH_S` (launch-bound) is not timed further: each config timed is one more compile. The
plan with the timed configs is then checked
against the rule's plan and timed end to end beside it (``planner.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from autofuse.ir.graph import Graph
from autofuse.kernels import GroupInfo, config_label, quick_configs
from autofuse.plan.steps import KernelStep, Plan

# seconds of a group's kernel under a config, verified first; None where it failed or was wrong
ConfigTimer = Callable[[Graph, GroupInfo, Any], "float | None"]

MARGIN = 0.03  # another config replaces the default only when faster by more than this
WORTH_S = 10e-6  # a default config faster than this is kept without timing the others


def timed_configs(
    plan: Plan, groups: Sequence[frozenset[int]], time_config: ConfigTimer
) -> tuple[list[Any], dict[frozenset[int], str]] | None:
    """A config per group of ``groups`` (None: the rule's) for ``plan``'s kernels whose kind
    offers quick configs, each timed by ``time_config``; with, per group timed, the reason its
    step gives. None where no group's timed pick differs from its default (nothing to change)."""
    kernels = {frozenset(s.kernel.info.nodes): s.kernel for s in plan.steps
               if isinstance(s, KernelStep)}  # fmt: skip
    choices: list[Any] = []
    reasons: dict[frozenset[int], str] = {}
    for group in groups:
        kernel = kernels.get(frozenset(group))
        offered = quick_configs(kernel.info, plan.graph) if kernel is not None else []
        if len(offered) < 2:
            choices.append(None)
            continue
        times = timed(plan.graph, kernel.info, offered, time_config)
        pick = fastest(kernel.config, times)
        choices.append(None if pick == kernel.config else pick)
        reasons[frozenset(group)] = describe(pick, times)
    if all(c is None for c in choices):
        return None
    return choices, reasons


def timed(
    graph: Graph, info: GroupInfo, offered: Sequence[Any], time_config: ConfigTimer
) -> list[tuple[Any, float | None]]:
    """Each offered config's seconds, the default (first) alone where it takes under
    :data:`WORTH_S`: a kernel that short is launch-bound, and every config timed is a compile."""
    first = time_config(graph, info, offered[0])
    if first is not None and first < WORTH_S:
        return [(offered[0], first)]
    return [(offered[0], first), *((c, time_config(graph, info, c)) for c in offered[1:])]


def fastest(default: Any, times: Sequence[tuple[Any, float | None]]) -> Any:
    """The config to run: the fastest that worked, where it beats ``default``'s time by more
    than :data:`MARGIN` (or ``default`` failed); else ``default``."""
    ok = [(s, c) for c, s in times if s is not None]
    if not ok:
        return default
    best_s, best = min(ok, key=lambda t: t[0])
    base = next((s for c, s in times if c == default), None)
    if base is None or best_s < base * (1 - MARGIN):
        return best
    return default


def describe(pick: Any, times: Sequence[tuple[Any, float | None]]) -> str:
    """The step's reason: each config's time and the one kept."""
    shown = ", ".join(
        f"{config_label(c)} {'failed' if s is None else f'{s * 1e6:.1f} us'}" for c, s in times
    )
    return f"measured: configs timed alone ({shown}) -> {config_label(pick)}"


__all__ = ["MARGIN", "WORTH_S", "ConfigTimer", "describe", "fastest", "timed", "timed_configs"]
