"""Kernel kind ``fill``: a pointwise group that reads no buffer, its values computed from aranges
and constants alone (position ids, a causal mask built from ``arange``, a ramp, a constant
broadcast to a shape). The kernel only writes: it is rendered by the loop emitter as a
pointwise kernel is, named ``fill`` so a plan says what it is, and its config space leaves
out the narrow blocks that only pay off where loads must be hidden (a write-only kernel has
none): wide blocks of 4 or 8 warps.
"""

from __future__ import annotations

from autofuse.ir.graph import Graph
from autofuse.kernels.common.base import GroupInfo, loaded_nodes, next_pow2
from autofuse.kernels.common.configs import KernelConfig
from autofuse.kernels.common.sizes import config_xnumel
from autofuse.kernels.pointwise.kind import PointwiseKind

BLOCKS = (1024, 2048, 4096)  # elements per program
WARPS = (4, 8)


class FillKind(PointwiseKind):
    name = "fill"

    def claims(self, graph: Graph, members: frozenset[int]) -> bool:
        return super().claims(graph, members) and not loaded_nodes(graph, members)

    def config_space(self, graph: Graph, info: GroupInfo) -> list[KernelConfig]:
        top = max(16, next_pow2(config_xnumel(info)))
        xs = [b for b in BLOCKS if b <= top] or [top]
        return [KernelConfig(x, 0, w) for x in xs for w in WARPS if x >= 32 * w or x == top]

    def prefix(self, info: GroupInfo, config: KernelConfig) -> str:
        return "fill"
