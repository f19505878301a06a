"""Sampled partitions the cost model rules out before any of their kernels is built.

A sampled trial that splits a fused kernel into several costs seconds of compiling and timing
(the model-style functions' searches spent 2-5 of their 3-6 trials on partitions 3-16x slower
than the greedy plan), time a small budget would rather give to the configs of plausible
plans. Before measuring, a sampled partition's kernels at their sampled configs are put
through the analytical cost model; one the model puts at more than ``PRUNE_RATIO`` times the
greedy plan (its model cost at the default configs) is pruned with that reason and never
built. The model only orders partitions here: its numbers are never reported as times. The
starting points the search enqueues (greedy, cuBLAS + epilogues, untuned, unfused and the
option switches) are never pruned, and neither is a partition the model cannot cost.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from autofuse.measure import Candidate, CostModel

PRUNE_RATIO = 4.0


class ModelPrune:
    """``check(partition_key, groups)``: why a sampled partition is not worth measuring, or
    None. ``groups``: its (GroupInfo, config) pairs, eager matmuls left out (both sides run
    them alike)."""

    def __init__(self, graph: Any, ratio: float | None = None) -> None:
        self.graph = graph
        self.ratio = PRUNE_RATIO if ratio is None else ratio
        self.model = CostModel()
        self.memo: dict[tuple, float | None] = {}  # (group nodes, config) -> model seconds
        self.fixed: set[Any] = set()
        self.reference: float | None = None

    def start(self, fixed: Iterable[Any], greedy: Sequence[tuple[Any, Any]]) -> None:
        """The partitions never pruned (their keys) and the greedy plan's groups at their
        default configs, the reference."""
        self.fixed = set(fixed)
        self.reference = self.cost(greedy)

    def cost(self, groups: Sequence[tuple[Any, Any]]) -> float | None:
        """The model's seconds for these groups (each (group, config) costed once), or None
        where it cannot cost one."""
        total = 0.0
        for info, cfg in groups:
            key = (info.nodes, cfg)
            if key not in self.memo:
                self.memo[key] = self._one(info, cfg)
            t = self.memo[key]
            if t is None:
                return None
            total += t
        return total

    def _one(self, info: Any, cfg: Any) -> float | None:
        try:
            m = self.model.measure(Candidate(self.graph, info, cfg))
        except Exception:  # noqa: BLE001 - a kernel the model cannot cost: no verdict
            return None
        return m.seconds if m.ok else None

    def check(self, key: Any, groups: Sequence[tuple[Any, Any]]) -> str | None:
        if key in self.fixed or not self.reference:
            return None
        cost = self.cost(groups)
        if cost is None or cost <= self.ratio * self.reference:
            return None
        return (
            f"pruned before building: the cost model puts this partition at "
            f"{cost / self.reference:.1f}x the greedy plan's model cost (limit {self.ratio}x)"
        )
