"""Hill climbing over one kernel's launch configs (the polish after the search) and the
config neighbourhoods it and the tuner's option switches walk."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

from autofuse.kernels import switches


def _one_field_changes(cfg: Any, space: Sequence[Any]) -> dict[str, list[Any]]:
    """The configs of ``space`` that differ from ``cfg`` in exactly one field, by that field
    (fields in declaration order, configs in ``space`` order)."""
    names = [f.name for f in dataclasses.fields(cfg)]
    out: dict[str, list[Any]] = {n: [] for n in names}
    for c in space:
        if type(c) is not type(cfg):
            continue
        diff = [n for n in names if getattr(c, n) != getattr(cfg, n)]
        if len(diff) == 1:
            out[diff[0]].append(c)
    return out


def option_switches(cfg: Any, space: Sequence[Any]) -> list[Any]:
    """For each field that ``cfg``'s class switches on and off (``kernels.switches``), the first
    config of ``space`` that differs from ``cfg`` in that field alone (in ``space`` order)."""
    firsts = [
        cs[0] for n, cs in _one_field_changes(cfg, space).items() if n in switches(cfg) and cs
    ]
    return sorted(firsts, key=list(space).index)


def polish_plan(objective: Any, best: Any, budget: int, deadline: float | None = None) -> Any:
    """The best plan's partition with each kernel's config improved by hill climbing over its
    config space (``_climb``). The sampler spends its trials across partitions and may have
    timed only a default config of the winner's kernels; the plan's cost is a sum over kernels,
    so each climbs alone. None where nothing got faster."""
    configs, value = list(best.configs), best.value
    for k, group in enumerate(best.partition.groups):
        if configs[k] is None:  # a lone matmul run by torch
            continue
        info = objective.space.check(group)
        start = objective.measure(info, configs[k])
        if start.ok:
            configs[k], end = _climb(objective, info, configs[k], start, budget, deadline)
            value -= start.seconds - end.seconds
    if tuple(configs) == best.configs:
        return None
    return dataclasses.replace(best, configs=tuple(configs), value=value)


def _climb(objective: Any, info: Any, cfg: Any, now: Any, budget: int,
           deadline: float | None) -> tuple[Any, Any]:  # fmt: skip
    """From ``cfg`` (timed ``now``), move to the first neighbour (one field changed) that times
    faster, until none does, ``budget`` configs are timed or ``deadline`` (perf_counter) passes."""
    space = objective.configs_for(info)
    tried = {cfg}
    spent = _new_measurements(objective, tried)
    moved = True
    while moved and spent() < budget:
        moved = False
        for other in neighbours(cfg, space):
            if spent() >= budget or (deadline is not None and time.perf_counter() > deadline):
                break
            if other in tried:
                continue
            tried.add(other)
            m = objective.measure(info, other)
            if m.ok and m.seconds < now.seconds:
                cfg, now, moved = other, m, True
                break
    return cfg, now


def _new_measurements(objective: Any, tried: set) -> Any:
    """A counter of the configs measured since now: the memo's new (inner) measurements where
    the objective has a memo (a config timed during the search costs nothing again), else the
    configs tried."""
    memo = getattr(objective, "measurer", None)
    if isinstance(getattr(memo, "calls", None), int):
        start = memo.calls
        return lambda: memo.calls - start
    return lambda: len(tried) - 1


def neighbours(cfg: Any, space: Sequence[Any]) -> list[Any]:
    """Configs of ``space`` that differ from ``cfg`` in one field: on/off options first, then
    round by round the nearest value of each field not yet taken (every field's nearest
    neighbour comes before any field's second nearest: a small budget tries each direction)."""
    if not dataclasses.is_dataclass(cfg):
        return []

    def distance(c: Any, n: str) -> float:
        a, b = getattr(cfg, n), getattr(c, n)
        if isinstance(a, bool) or not isinstance(a, int) or a <= 0 or b <= 0:
            return 0.0
        return abs(math.log2(b / a))

    changes = _one_field_changes(cfg, space)
    options = switches(cfg)
    out = [c for n in changes if n in options for c in changes[n]]
    ranked = [sorted(cs, key=lambda c, n=n: distance(c, n)) for n, cs in changes.items()
              if n not in options]  # fmt: skip
    for r in range(max(map(len, ranked), default=0)):
        out += [cs[r] for cs in ranked if r < len(cs)]
    return out
