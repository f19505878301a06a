"""Kernel kind ``pointwise``: a chain of elementwise ops (through views and broadcasts) over
one output shape, one loop over the flattened domain."""

from __future__ import annotations

from autofuse.ir.graph import Graph, numel
from autofuse.kernels.common.base import (
    FusionRefused,
    GroupInfo,
    Kernel,
    kernel_name,
    loaded_nodes,
    next_pow2,
    stored_nodes,
)
from autofuse.kernels.common.configs import KernelConfig, check_pow2
from autofuse.kernels.common.cost import LoopKind
from autofuse.kernels.common.emitter import Emitter
from autofuse.kernels.common.loop_kernel import render_loop_kernel
from autofuse.kernels.common.sizes import config_xnumel


class PointwiseKind(LoopKind):
    name = "pointwise"
    runtime_sizes = True  # kernels/common/sizes.py: the row count an argument, configs by bucket
    library_first = False
    config_class = KernelConfig

    def claims(self, graph: Graph, members: frozenset[int]) -> bool:
        return all(graph[m].kind == "pointwise" for m in members)

    def analyze(self, graph: Graph, members: frozenset[int]) -> GroupInfo:
        stored = stored_nodes(graph, members)
        if not stored:
            raise FusionRefused("group has no output")
        shapes = {graph[s].shape for s in stored}
        if len({numel(s) for s in shapes}) > 1:  # one numel: each stored at the flat index
            a, b = sorted(shapes)[:2]
            raise FusionRefused(
                f"outputs of different shapes {list(a)} and {list(b)} cannot share one loop"
            )
        info = GroupInfo(
            nodes=tuple(sorted(members)),
            kind=self.name,
            domain=tuple(graph[stored[0]].shape),
            reduce_dims=(),
            stored=stored,
            loads=loaded_nodes(graph, members),
        )
        Emitter(graph, info, KernelConfig(16, 0)).emit()  # index checks
        return info

    def config_space(self, graph: Graph, info: GroupInfo) -> list[KernelConfig]:
        top = max(16, next_pow2(config_xnumel(info)))
        xs = [b for b in (128, 256, 512, 1024, 2048, 4096) if b <= top] or [top]
        return [KernelConfig(x, 0, w) for x in xs for w in (2, 4, 8) if x >= 32 * w or x == top]

    def default_config(self, graph: Graph, info: GroupInfo) -> KernelConfig:
        x = min(1024, max(16, next_pow2(config_xnumel(info))))
        return KernelConfig(x, 0, 4 if x >= 128 else 1)

    def check_config(self, info: GroupInfo, config: KernelConfig) -> None:
        check_pow2(XBLOCK=config.XBLOCK, num_warps=config.num_warps)
        if config.RBLOCK:
            raise ValueError(f"a pointwise kernel takes RBLOCK=0, got {config.RBLOCK}")

    def prefix(self, info: GroupInfo, config: KernelConfig) -> str:
        return "poi"

    def generate(self, graph: Graph, info: GroupInfo, config: KernelConfig, index: int) -> Kernel:
        name = kernel_name(graph, info, self.prefix(info, config), index)
        return render_loop_kernel(Emitter(graph, info, config), name, self.name)
