"""Kernel kind ``reduction``: row reductions over any set of dims, with the pointwise ops
before and after them; persistent (a whole row per block) or looped (RBLOCK chunks), in phases
by dependency level (softmax: max, then sum)."""

from __future__ import annotations

from dataclasses import replace

from autofuse.interpreter import interpreting
from autofuse.ir.graph import Graph, kept_strides, numel
from autofuse.kernels.common.base import (
    FusionRefused,
    GroupInfo,
    Kernel,
    describe,
    kernel_name,
    loaded_nodes,
    next_pow2,
    prev_pow2,
    stored_nodes,
)
from autofuse.kernels.common.configs import KernelConfig, check_pow2
from autofuse.kernels.common.cost import LoopKind
from autofuse.kernels.common.emitter import Emitter
from autofuse.kernels.common.loop_kernel import render_loop_kernel
from autofuse.kernels.common.reads import phase_levels, streamed_loads
from autofuse.kernels.common.sizes import config_xnumel


def reduction_domain(
    graph: Graph, reductions: list[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The (input shape, reduced dims) every reduction of a group shares, or a refusal."""
    first = reductions[0]
    src = graph[graph[first].inputs[0]].shape
    dims = graph[first].attr("dims")
    for r in reductions[1:]:
        s, d = graph[graph[r].inputs[0]].shape, graph[r].attr("dims")
        if (s, d) != (src, dims):
            raise FusionRefused(
                f"{describe(graph, r)} reduces {list(s)} over dims {list(d)} but "
                f"{describe(graph, first)} reduces {list(src)} over dims {list(dims)}: "
                "one kernel has one reduction domain"
            )
    return tuple(src), tuple(dims)


def _row_shapes(domain: tuple[int, ...], rdims: tuple[int, ...]) -> set[tuple[int, ...]]:
    keep = tuple(1 if i in rdims else s for i, s in enumerate(domain))
    squeezed = tuple(s for i, s in enumerate(domain) if i not in rdims)
    return {keep, squeezed}


def check_stored_shapes(graph: Graph, stored, domain, rdims, reshapes: bool = False) -> None:
    """Every stored node is over the whole domain or one value per row (``reshapes``: or over
    a reshape of the whole domain, stored at the domain's flat index)."""
    rows = _row_shapes(domain, rdims)
    for s in stored:
        shape = graph[s].shape
        if shape == domain or shape in rows:
            continue
        if reshapes and numel(shape) == numel(domain):
            continue
        raise FusionRefused(
            f"{describe(graph, s)} must be stored but its shape is neither the reduction "
            f"input {list(domain)}{' (or a reshape of it)' if reshapes else ''} nor a row "
            f"shape {sorted(list(r) for r in rows)}"
        )


class ReductionKind(LoopKind):
    name = "reduction"
    runtime_sizes = True  # kernels/common/sizes.py: the row count an argument, configs by bucket
    library_first = False
    config_class = KernelConfig

    def claims(self, graph: Graph, members: frozenset[int]) -> bool:
        kinds = {graph[m].kind for m in members}
        return "reduction" in kinds and kinds <= {"pointwise", "reduction"}

    def analyze(self, graph: Graph, members: frozenset[int]) -> GroupInfo:
        stored = stored_nodes(graph, members)
        if not stored:
            raise FusionRefused("group has no output")
        reductions = [m for m in sorted(members) if graph[m].kind == "reduction"]
        domain, rdims = reduction_domain(graph, reductions)
        check_stored_shapes(graph, stored, domain, rdims, reshapes=True)
        info = GroupInfo(
            nodes=tuple(sorted(members)),
            kind=self.name,
            domain=tuple(domain),
            reduce_dims=tuple(rdims),
            stored=stored,
            loads=loaded_nodes(graph, members),
        )
        Emitter(graph, info, self.probe_config(info)).emit()  # index checks
        return info

    def probe_config(self, info: GroupInfo) -> KernelConfig:
        """The config ``analyze`` renders the group under, for its index checks."""
        return KernelConfig(16, 16)

    def config_space(self, graph: Graph, info: GroupInfo) -> list[KernelConfig]:
        r = next_pow2(info.rnumel)
        rows = max(1, next_pow2(config_xnumel(info)))
        out = []
        for x in (1, 2, 4, 8, 16, 32, 64):
            if x > rows:
                break
            if x * r <= 32768:  # persistent: a whole row per block, loads in place or hoisted
                out += [
                    KernelConfig(x, r, w, hoist)
                    for hoist in (False, True)
                    for w in (1, 2, 4, 8, 16)
                    if 32 * w <= max(32, x * r)
                ]
            for rb in (4, 16, 64, 256, 1024, 2048, 4096):
                if rb < r and x * rb <= 16384 and x * rb >= 32:
                    ws = [w for w in (1, 2, 4, 8) if 32 * w <= x * rb]
                    ws += [16] if x * rb >= 2048 else []
                    out += [KernelConfig(x, rb, w, ONE_STAGE=one) for one in (False, True)
                            for w in ws]  # fmt: skip
        return out or [KernelConfig(1, r, 4)]

    def default_config(self, graph: Graph, info: GroupInfo) -> KernelConfig:
        r = next_pow2(info.rnumel)
        inner = inner_rows(graph, info)
        if inner >= 16:
            # an outer reduction (column sums, a split reduction's stages): neighbouring outputs
            # are neighbours in memory, so a block spans up to 64 of them (128-byte bf16
            # segments; 16 fp32 channels, L2_44's global pool, fill a 64-byte segment where a
            # row block's XBLOCK=8 filled half), fewer where that leaves under ~128 programs;
            # a reduced extent that fits (x * r <= _WHOLE_OUTER) is loaded whole, else walked
            # in chunks. On the H200 this took a 65536-row column statistic's chunk pass from
            # 69.2 to 44.8 us (experiments.probes.sweep).
            # A whole block beyond 8192 elements spills its registers: GPT-2's bias gradient of
            # the attention projection (1024 x 6144 bf16, a 32 x 1024 block, 4 warps) took
            # 268 us on the H100 for 25 MB moved (results/h100/breakdown_46a14ad); it loops.
            x = min(64, next_pow2(inner), max(1, prev_pow2(config_xnumel(info) // 128)))
            if x * r <= _WHOLE_OUTER:
                return KernelConfig(x, r, 8 if x * r <= 4096 else 4)
            if phases(graph, info) > 1 and _WHOLE_OUTER // r >= _MIN_WHOLE_X:
                # a looped kernel walks its rows once per phase (a variance: the mean, then the
                # squared deviations), reading them and computing their pointwise prologue
                # again each time; a narrower block holding its rows whole does both once
                # (L2_52's BatchNorm statistics over a mish: 32-byte channel segments, 8 x 1024)
                return KernelConfig(_WHOLE_OUTER // r, r, 8)
            rb = min(r, max(4, 4096 // x))
            return KernelConfig(x, rb, block_warps(x * rb))
        return self.row_config(info)

    def row_config(self, info: GroupInfo) -> KernelConfig:
        """A few whole rows per block (up to 4096 elements), else 4096-element chunks; at most
        8 warps (16 warps on a 4 x 1024 row block took 152 us against 128 us with 8 on the H200,
        a masked causal softmax; 62.8 against 53.0 us, an L2 normalize)."""
        r = next_pow2(info.rnumel)
        if r <= 4096:
            x = max(1, min(8, 4096 // r, next_pow2(config_xnumel(info))))
            return KernelConfig(x, r, block_warps(x * r))
        return KernelConfig(1, 4096, 8)

    def quick_configs(self, graph: Graph, info: GroupInfo) -> list[KernelConfig]:
        """Besides the default (``kernels.quick_configs`` puts it first): for rows of up to 4096
        held whole, 1, 32 and 128 rows a block (the counts Inductor times for a persistent
        reduction; short rows, GroupNorm's 32-element ones in L2_88, get more rows a block than
        the default's 8), at most 8192 elements and as many rows as there are; a longer row,
        2048- and 1024-element chunks beside the default's 4096 (and the whole row, up to 16384,
        where the kernel walks it more than once: :meth:`whole_row`). An outer reduction (neighbouring
        outputs neighbours in memory): its default block's outputs halved and doubled, up to
        16384 elements (its rule sized segments of 8 float32 outputs, 32 bytes; 8 bfloat16 ones
        fill 16)."""
        if interpreting():
            return []
        if inner_rows(graph, info) >= 16:
            return self.outer_quick(graph, info)
        r, rows = next_pow2(info.rnumel), next_pow2(max(1, config_xnumel(info)))
        if r > 4096:
            return self.whole_row(graph, info) + [
                KernelConfig(1, 2048, 8),
                KernelConfig(1, 1024, 4),
            ]
        xs = [x for x in (1, 32, 128) if x * r <= 8192 and x <= rows]
        return [KernelConfig(x, r, block_warps(x * r)) for x in xs]

    def whole_row(self, graph: Graph, info: GroupInfo) -> list[KernelConfig]:
        """A row of up to 16384 elements held whole by one program (16 warps), where a looped
        kernel walks it once per phase and computes its pointwise prologue each time: L2_52's
        BatchNorm statistics over a mish, split into rows of 15876 (one per image and channel),
        took 1004 us on the H100 in two 4096-element loops against torch.compile's 411 us in
        one pass."""
        r = next_pow2(info.rnumel)
        return [KernelConfig(1, r, 16)] if r <= _WHOLE_ROW and phases(graph, info) > 1 else []

    def outer_quick(self, graph: Graph, info: GroupInfo) -> list[KernelConfig]:
        """An outer reduction's default block with its outputs halved and doubled; a whole
        multi-phase block doubled also with 16 warps (L2_52's bf16 BatchNorm statistics, 8
        channels x 1024 rows, read 16 bytes of each 32-byte sector and took 597 us on the H100
        against torch.compile's 411, where fp32's 32-byte rows took 282; 16 channels at 8
        warps hold 64 values a thread)."""
        d = self.default_config(graph, info)
        rows = next_pow2(max(1, config_xnumel(info)))
        xs = [x for x in (d.XBLOCK // 2, d.XBLOCK * 2) if 1 <= x <= rows and x * d.RBLOCK <= 16384]
        out = [replace(d, XBLOCK=x, num_warps=block_warps(x * d.RBLOCK)) for x in xs]
        wide = d.XBLOCK * 2
        if wide in xs and d.RBLOCK >= info.rnumel and phases(graph, info) > 1:
            out.append(replace(d, XBLOCK=wide, num_warps=16))
        return out

    def check_config(self, info: GroupInfo, config: KernelConfig) -> None:
        check_pow2(XBLOCK=config.XBLOCK, num_warps=config.num_warps)
        if config.RBLOCK < 1 or config.RBLOCK & (config.RBLOCK - 1):
            raise ValueError(f"RBLOCK must be a power of two for a reduction, got {config.RBLOCK}")

    def prefix(self, info: GroupInfo, config: KernelConfig) -> str:
        return "per" if config.RBLOCK >= info.rnumel else "red"

    def generate(self, graph: Graph, info: GroupInfo, config: KernelConfig, index: int) -> Kernel:
        name = kernel_name(graph, info, self.prefix(info, config), index)
        em = Emitter(graph, info, config)
        if em.red and not em.persistent:  # the loads read by one loop alone (no render)
            em.streamed = streamed_loads(graph, info)
        return render_loop_kernel(em, name, self.name)


def block_warps(elements: int) -> int:
    """A loop kernel's warps for a block of ``elements``: one per 512, 1 to 8."""
    return min(8, max(1, elements // 512))


_WHOLE_OUTER = 8192  # elements of an outer reduction's block held whole (persistent)
_WHOLE_ROW = 16384  # elements of a multi-phase row a timed config holds whole
_MIN_WHOLE_X = 8  # neighbouring outputs of a whole multi-phase block: a 32-byte fp32 segment


def phases(graph: Graph, info: GroupInfo) -> int:
    """How many passes over its rows a looped kernel of the group makes (reduction levels)."""
    return max(phase_levels(graph, info).values(), default=0)


def inner_rows(graph: Graph, info: GroupInfo) -> int:
    """How many neighbouring rows are neighbours in memory: the kept dims after the last
    reduced one, or, where the group reads a buffer the plan keeps in another layout (a
    convolution's channels-last result, ``ir/conv_layout.py``; read dim for dim, through a
    pool's windows too), the kept dims that buffer holds closer together than any reduced one
    (its channels, for a reduction over H x W)."""
    dom, red = info.domain, info.reduce_dims
    for j in info.loads if red else ():
        strides = kept_strides(graph[j])
        if strides is None:
            continue
        if tuple(graph[j].shape) != tuple(dom) and not _windowed(graph, info, j):
            continue
        low = min(strides[d] for d in red)
        return numel(s for d, s in enumerate(dom) if d not in red and strides[d] < low)
    last = max(red, default=len(dom))
    return numel(s for j, s in enumerate(dom) if j > last)


def _windowed(graph: Graph, info: GroupInfo, j: int) -> bool:
    """Whether the group reads buffer ``j`` dim for dim over its domain through slices alone,
    as a pool's windows do (L2_10's 2 x 2 max pool of a channels-last (128, 64, 256, 256)
    result, averaged over its (128, 128) planes): its readers past the slices are of the
    domain's shape."""
    members, stack, found = set(info.nodes), [j], False
    while stack:
        for u in graph.users[stack.pop()]:
            node = graph[u]
            if node.kind == "view":  # index arithmetic, in no group of its own
                if node.op != "slice":
                    return False
                stack.append(u)
            elif u not in members:
                continue
            elif tuple(node.shape) != tuple(info.domain):
                return False
            else:
                found = True
    return found
