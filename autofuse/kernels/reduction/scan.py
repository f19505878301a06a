"""Kernel kind ``scan``: a reduction kernel with a scan among its row ops (``cumsum``,
``cumprod``), with the pointwise ops and reductions over the same rows before and after it.

A row of up to ``rowops.MAX_ROW`` elements is scanned in one block (``tl.associative_scan``,
see ``rowops.py``): those configs are persistent (RBLOCK >= the row). A longer row is walked in
RBLOCK chunks: each chunk is scanned and combined with a carry, the combine of the chunks
before it (the looped configs).
"""

from __future__ import annotations

from autofuse.ir.graph import Graph
from autofuse.kernels.common.base import GroupInfo, next_pow2
from autofuse.kernels.common.configs import KernelConfig
from autofuse.kernels.common.rowops import MAX_ROW, is_scan
from autofuse.kernels.reduction.kind import ReductionKind


class ScanKind(ReductionKind):
    name = "scan"

    def claims(self, graph: Graph, members: frozenset[int]) -> bool:
        return super().claims(graph, members) and any(is_scan(graph[m].op) for m in members)

    def probe_config(self, info: GroupInfo) -> KernelConfig:
        r = next_pow2(info.rnumel)
        return KernelConfig(1, r) if r <= MAX_ROW else KernelConfig(1, 1024)

    def config_space(self, graph: Graph, info: GroupInfo) -> list[KernelConfig]:
        if info.rnumel > MAX_ROW:  # looped: RBLOCK chunks and a carry
            out = [c for c in super().config_space(graph, info) if c.RBLOCK >= 256]
        else:
            out = [c for c in super().config_space(graph, info) if c.RBLOCK >= info.rnumel]
        return out or [self.default_config(graph, info)]

    def quick_configs(self, graph: Graph, info: GroupInfo) -> list[KernelConfig]:
        return []  # a scan's rows: the default, or the search's

    def default_config(self, graph: Graph, info: GroupInfo) -> KernelConfig:
        r = next_pow2(info.rnumel)
        if r <= 4096:
            return self.row_config(info)
        return KernelConfig(1, r, 16) if r <= MAX_ROW else KernelConfig(1, 4096, 8)

    def check_config(self, info: GroupInfo, config: KernelConfig) -> None:
        super().check_config(info, config)
        if config.RBLOCK < info.rnumel <= MAX_ROW:
            raise ValueError(
                f"a scan kernel holds a row of up to {MAX_ROW} elements whole: RBLOCK must be "
                f">= {info.rnumel}, got {config.RBLOCK}"
            )

    def prefix(self, info: GroupInfo, config: KernelConfig) -> str:
        return "scan"
