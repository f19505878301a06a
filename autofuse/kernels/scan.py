"""Kernel kind ``scan``: a reduction kernel with a scan among its row ops (``cumsum``,
``cumprod``), with the pointwise ops and reductions over the same rows before and after it.

The scan runs over the whole row in one block (``tl.associative_scan``, see ``rowops.py``), so
every config is persistent (RBLOCK >= the row); a row longer than ``rowops.MAX_ROW`` elements
is refused and the scan runs in eager.
"""

from __future__ import annotations

from autofuse.ir.graph import Graph
from autofuse.kernels.base import FusionRefused, GroupInfo, next_pow2
from autofuse.kernels.pointwise import KernelConfig
from autofuse.kernels.reduction import ReductionKind
from autofuse.kernels.rowops import MAX_ROW, is_scan


class ScanKind(ReductionKind):
    name = "scan"

    def claims(self, graph: Graph, members: frozenset[int]) -> bool:
        return super().claims(graph, members) and any(is_scan(graph[m].op) for m in members)

    def probe_config(self, info: GroupInfo) -> KernelConfig:
        r = next_pow2(info.rnumel)
        if r > MAX_ROW:
            raise FusionRefused(
                f"a scan holds its whole row in one block: a row of {info.rnumel} elements is "
                f"over the {MAX_ROW} a block holds"
            )
        return KernelConfig(1, r)

    def config_space(self, graph: Graph, info: GroupInfo) -> list[KernelConfig]:
        out = [c for c in super().config_space(graph, info) if c.RBLOCK >= info.rnumel]
        return out or [self.default_config(graph, info)]

    def default_config(self, graph: Graph, info: GroupInfo) -> KernelConfig:
        r = next_pow2(info.rnumel)
        if r <= 4096:
            return self.row_config(info)
        return KernelConfig(1, r, 16)

    def check_config(self, info: GroupInfo, config: KernelConfig) -> None:
        super().check_config(info, config)
        if config.RBLOCK < info.rnumel:
            raise ValueError(
                f"a scan kernel holds its whole row: RBLOCK must be >= {info.rnumel}, "
                f"got {config.RBLOCK}"
            )

    def prefix(self, info: GroupInfo, config: KernelConfig) -> str:
        return "scan"
