"""Kernel kind ``pointwise``: a chain of elementwise ops (through views and broadcasts) over
one output shape, one loop over the flattened domain.

A group that reads a buffer kept in another layout than the one it writes (a convolution's
channels-last result, ``ir/conv_layout.py``, read by an epilogue that writes eager's contiguous
output) is tiled in two: rows over the other dims by the dim that buffer holds innermost
(``tile_dim``), as a row kernel's ``XBLOCK x RBLOCK`` tile, without reducing anything. Each
access is then contiguous along one axis of the tile (the load along the columns, the store
along the rows), where a flat loop would read the buffer at a stride of the channel count."""

from __future__ import annotations

from autofuse.interpreter import interpreting
from autofuse.ir.graph import Graph, kept_strides, numel
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
from autofuse.settings import settings


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
        domain, loads = tuple(graph[stored[0]].shape), loaded_nodes(graph, members)
        tile = tile_dim(graph, domain, loads + stored)
        info = GroupInfo(
            nodes=tuple(sorted(members)),
            kind=self.name,
            domain=domain,
            reduce_dims=() if tile is None else (tile,),
            stored=stored,
            loads=loads,
        )
        Emitter(graph, info, self.default_config(graph, info)).emit()  # index checks
        return info

    def config_space(self, graph: Graph, info: GroupInfo) -> list[KernelConfig]:
        if info.reduces:  # a two-axis tile: every column in one block
            r = next_pow2(info.rnumel)
            return [KernelConfig(x, r, w) for x in (8, 16, 32, 64, 128) for w in (2, 4, 8)
                    if 1024 <= x * r <= 16384 and x * r >= 128 * w]  # fmt: skip
        top = max(16, next_pow2(config_xnumel(info)))
        xs = [b for b in (128, 256, 512, 1024, 2048, 4096) if b <= top] or [top]
        return [KernelConfig(x, 0, w) for x in xs for w in (2, 4, 8) if x >= 32 * w or x == top]

    def default_config(self, graph: Graph, info: GroupInfo) -> KernelConfig:
        if info.reduces:
            r = next_pow2(info.rnumel)
            return KernelConfig(max(8, 4096 // r), r, 4)
        if interpreting():
            x = min(settings().interpreter_block, max(16, next_pow2(config_xnumel(info))))
            return KernelConfig(x, 0, 4 if x >= 128 else 1)
        x = min(1024, max(16, next_pow2(config_xnumel(info))))
        if x == 1024 and self.strided(graph, info):
            return STRIDED_CONFIG
        return KernelConfig(x, 0, 4 if x >= 128 else 1)

    def strided(self, graph: Graph, info: GroupInfo) -> bool:
        """Whether the flat loop takes ``STRIDED_CONFIG`` (:func:`strided_lanes`)."""
        return strided_lanes(graph, info)

    def quick_configs(self, graph: Graph, info: GroupInfo) -> list[KernelConfig]:
        """A flat loop of 1024 or more elements: eight outputs a thread (1024 x 4 warps) and
        two (512 x 8: a pooling window's strided loads, ``STRIDED_CONFIG``), and 512 x 2, the
        pair Inductor times for its pointwise kernels; the default among them. A two-axis
        tile: :meth:`tile_quick`."""
        if interpreting():
            return []
        if info.reduces:
            return self.tile_quick(graph, info)
        if config_xnumel(info) < 1024:
            return []
        return [KernelConfig(1024, 0, 4), STRIDED_CONFIG, KernelConfig(512, 0, 2)]

    def tile_quick(self, graph: Graph, info: GroupInfo) -> list[KernelConfig]:
        """A two-axis tile (a layout turned: L2_52's normalization reads the channels-last
        result and writes eager's strides, 448 us against torch.compile's 378 on the H100 in
        fp32) with half and twice the default's rows, each whole column run in the block."""
        d = self.default_config(graph, info)
        xs = [x for x in (d.XBLOCK // 2, d.XBLOCK * 2) if x >= 8 and 1024 <= x * d.RBLOCK <= 16384]
        return [KernelConfig(x, d.RBLOCK, 4 if x * d.RBLOCK <= 4096 else 8) for x in xs]

    def check_config(self, info: GroupInfo, config: KernelConfig) -> None:
        check_pow2(XBLOCK=config.XBLOCK, num_warps=config.num_warps)
        if info.reduces:
            if config.RBLOCK < info.rnumel:
                raise ValueError(
                    f"a two-axis pointwise tile holds every column: RBLOCK >= {info.rnumel}, "
                    f"got {config.RBLOCK}"
                )
            return
        if config.RBLOCK:
            raise ValueError(f"a pointwise kernel takes RBLOCK=0, got {config.RBLOCK}")

    def prefix(self, info: GroupInfo, config: KernelConfig) -> str:
        return "poi"

    def generate(self, graph: Graph, info: GroupInfo, config: KernelConfig, index: int) -> Kernel:
        name = kernel_name(graph, info, self.prefix(info, config), index)
        return render_loop_kernel(Emitter(graph, info, config), name, self.name)


MAX_TILE_COLUMNS = 1024  # a two-axis tile holds a whole column run in one block
# A flat kernel whose loads step 2-4 elements per lane (a pooling window's reads: every other
# element, in L2_38's 2 x 2 x 2 average pool): two outputs per thread, not eight. Triton
# places a thread's outputs side by side (the store vectorized), so at eight per thread one
# warp's load of a stride-2 operand spans 32 sectors using 4 bytes of each, at two 16; the
# other 7 loads of the window re-read the same sectors from L1. Inductor's pointwise kernels
# time exactly these two configs (1024 x 4 warps, 512 x 8) and keep the faster; on an H100 its
# L2_38 pool kernel took 201 us where ours, one load per window element at 1024 x 4, took 443
# (results/h100/kb_b3c07c8; which config Inductor kept is not recorded, and this rule is not
# yet timed). A rule until the greedy plan times configs itself; the tuned search explores
# both.
STRIDED_CONFIG = KernelConfig(512, 0, 8)
_STRIDED: dict[tuple[str, tuple[int, ...]], bool] = {}


def strided_lanes(graph: Graph, info: GroupInfo) -> bool:
    """Whether a flat pointwise kernel of ``info`` loads some buffer 2-4 elements apart per
    lane (found by emitting it once at the plain config; remembered per graph and group)."""
    key = (graph.key, info.nodes)
    if key not in _STRIDED:
        if len(_STRIDED) > 4096:
            _STRIDED.clear()
        em = Emitter(graph, info, KernelConfig(1024, 0, 4))
        em.emit()
        _STRIDED[key] = any(2 <= s <= 4 for s in em.lane_steps)
    return _STRIDED[key]


def tile_dim(graph: Graph, domain: tuple[int, ...], buffers: tuple[int, ...]) -> int | None:
    """The domain dim a buffer kept in another layout (loaded or stored) holds innermost (its
    stride 1) while the domain's last dim is not innermost in it: the tile's column dim; None
    where every buffer is read and written along the domain's last dim. Only layouts the plan
    chose (a convolution's kept channels-last result or input) count: a buffer of the domain's
    rank whose innermost dim has the domain's extent there (the domain's own shape, or a pooled
    one: L2_82's 4 x 4 max-pool of a channels-last [128, 64, 254, 254] result, read along the
    flat [128, 64, 63, 63] output, loaded 64 channels apart per lane, took 11.6 ms against the
    contiguous plan's 4.7)."""
    if len(domain) < 2 or domain[-1] == 1:
        return None
    for j in buffers:
        strides, shape = kept_strides(graph[j]), tuple(graph[j].shape)
        if strides is None or len(shape) != len(domain):
            continue
        inner = [d for d, (st, n) in enumerate(zip(strides, shape)) if st == 1 and n > 1]
        if not inner or inner[0] == len(domain) - 1 or shape[inner[0]] != domain[inner[0]]:
            continue
        if 8 <= domain[inner[0]] <= MAX_TILE_COLUMNS:
            return inner[0]
    return None
