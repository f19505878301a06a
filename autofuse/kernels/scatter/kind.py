"""Kernel kind ``scatter``: values written at indexed places (``index_put``, ``scatter``,
``scatter_add``, embedding's gradient), with the pointwise ops that compute the values and
the indices.

A ``scatter`` node (``OpDef.scatter``) is a tensor of its own shape that starts as zeros (the
runtime allocates it zero-filled) and receives each value of its *domain* (the values' shape
as broadcast over the index tensors) at the place the indices name: ``tl.atomic_add`` when it
accumulates (repeated indices add up; float sums are accumulated in fp32, capture makes a
16-bit result a cast of an fp32 scatter), a plain ``tl.store`` when it does not (a repeated
index keeps one of its values, as eager leaves it unspecified). The kernel loops over that
domain like a pointwise kernel. Every index is checked: an index out of range fails
``tl.device_assert`` (debug build; the interpreter runs its asserts), and its store is masked
off, so nothing is written out of bounds. Readers of a scatter's result run in a later kernel
(the result is complete only when every program has finished).
"""

from __future__ import annotations

from autofuse.ir.graph import Graph, buffer_strides
from autofuse.ir.indexing import linearize
from autofuse.ir.ops import TL_DTYPE, op_def
from autofuse.kernels.common.base import (
    FusionRefused,
    GroupInfo,
    Kernel,
    describe,
    kernel_name,
    loaded_nodes,
    stored_nodes,
)
from autofuse.kernels.common.configs import KernelConfig
from autofuse.kernels.common.emitter import Emitter
from autofuse.kernels.common.indexed import (
    broadcast_shapes,
    index_layout,
    index_term,
    indexed_position,
)
from autofuse.kernels.common.loop_kernel import render_loop_kernel
from autofuse.kernels.common.render import cast, compute_dtype, tile_address
from autofuse.kernels.common.views import broadcast_index
from autofuse.kernels.pointwise.kind import PointwiseKind

# element types Triton's atomic_add refuses (8- and 16-bit integers, bool); 16-bit floats are
# accumulated in float32 (capture makes their scatter a cast of a float32 one)
NO_ATOMIC_ADD = frozenset({"bool", "int8", "uint8", "int16", "uint16"})


def is_scatter(graph: Graph, i: int) -> bool:
    return op_def(graph[i].op).scatter


def scatter_domain(graph: Graph, i: int) -> tuple[int, ...]:
    """The shape a scatter node iterates over: the index tensor's (``along`` a dim), or the
    result of advanced indexing its own shape with its index tensors (index_put)."""
    node = graph[i]
    idxs = node.inputs[1:]
    if node.attr("along") is not None:
        return tuple(graph[idxs[0]].shape)
    bshape = broadcast_shapes(*(graph[j].shape for j in idxs))
    return index_layout(node.shape, tuple(node.attr("dims")), bshape)[1]


class ScatterEmitter(Emitter):
    """A pointwise loop over the scatter's domain; scatter nodes are written at their indexed
    places, the other stored members at the domain index."""

    def emit(self) -> list[str]:
        idx_t = ".to(tl.int64)" if self.int64 else ""
        self.line(f"xoffset = tl.program_id(0){idx_t} * XBLOCK")
        self.line("xindex = xoffset + tl.arange(0, XBLOCK)")
        self.line(self.mask_line("x", "[XBLOCK]"))
        for s in self.info.stored:
            if is_scatter(self.g, s):
                self.scatter_store(s)
            else:
                self.store(s, self.value(s, self.full), self.full, 2)
        return self.lines

    def scatter_store(self, s: int) -> None:
        g, node, full = self.g, self.g[s], self.full
        values, *idxs = node.inputs
        what = f"{node.name} writes"
        if node.attr("along") is not None:
            d = node.attr("along")
            _, ok, term = index_term(self, s, d, idxs[0], full, False, what)
            pos = full[:d] + (term,) + full[d + 1 :]
            v = self.value(values, full if g[values].shape else ())
        else:
            dims = node.attr("dims")
            pos, ok, _ = indexed_position(self, s, dims, idxs, full, True, what)
            v = self.value(values, broadcast_index(g[values].shape, self.info.domain, full))
        off = linearize(pos, buffer_strides(node), node.shape)
        dt = TL_DTYPE[node.dtype]
        code = cast(v, compute_dtype(node.dtype))
        if v.cls == 0:
            code = f"tl.full([XBLOCK], {code}, {dt})"
        elif compute_dtype(node.dtype) != node.dtype:
            code = f"{code}.to({dt})"
        # ``!= 0``: an index read once per program (a scalar) makes Triton's interpreter type
        # ``block_mask & scalar_condition`` as int32, which its stores refuse as a mask
        mask = f"({' & '.join(m for m in (self.active_mask(2), ok) if m)}) != 0"
        # a block of pointers (as the value and the mask are) even where every lane's place is
        # one index read once per program (a one-element domain)
        ptr = f"{self.out_ptr[s]} + ({tile_address(off, self.tile_axes(2))})"
        if node.attr("accumulate"):
            self.line(f"tl.atomic_add({ptr}, {code}, {mask})")
        else:
            self.line(f"tl.store({ptr}, {code}, {mask})")


class ScatterKind(PointwiseKind):
    name = "scatter"
    library_first = False

    def claims(self, graph: Graph, members: frozenset[int]) -> bool:
        return any(is_scatter(graph, m) for m in members)

    def quick_configs(self, graph: Graph, info: GroupInfo) -> list[KernelConfig]:
        return []  # atomics' contention changes with the block: the search's to time

    def strided(self, graph: Graph, info: GroupInfo) -> bool:
        """No strided-lanes rule: a pointwise emitter cannot render the scatter to look (on a
        GPU that raised FusionRefused while the plan was built: GPU fuzz graph 309 of seed
        13, the backward of ``index_select(cat([repeat(x), ...]))``), and its block is the
        search's to time."""
        return False

    def analyze(self, graph: Graph, members: frozenset[int]) -> GroupInfo:
        scatters = [m for m in sorted(members) if is_scatter(graph, m)]
        domain = scatter_domain(graph, scatters[0])
        for m in sorted(members):
            if graph[m].kind != "pointwise":
                raise FusionRefused(
                    f"{describe(graph, m)} is a {graph[m].kind}: a scatter kernel holds only "
                    "pointwise ops"
                )
            read = [j for j in graph.compute_inputs(m) if j in scatters]
            if read:
                raise FusionRefused(
                    f"{describe(graph, m)} reads {describe(graph, read[0])}, which is complete "
                    "only when every program of its kernel has written: it runs in a later kernel"
                )
        for s in scatters:
            if graph[s].attr("accumulate") and graph[s].dtype in NO_ATOMIC_ADD:
                raise FusionRefused(
                    f"{describe(graph, s)} adds up {graph[s].dtype} values: tl.atomic_add takes "
                    "no integer narrower than 32 bits (it runs in eager)"
                )
        for s in scatters[1:]:
            if scatter_domain(graph, s) != domain:
                raise FusionRefused(
                    f"{describe(graph, s)} writes values over {list(scatter_domain(graph, s))} "
                    f"but {describe(graph, scatters[0])} over {list(domain)}: one kernel, one loop"
                )
        stored = stored_nodes(graph, members)
        for s in stored:
            if s not in scatters and graph[s].shape != domain:
                raise FusionRefused(
                    f"{describe(graph, s)} must be stored but its shape is not the scatter's "
                    f"domain {list(domain)}"
                )
        info = GroupInfo(
            nodes=tuple(sorted(members)),
            kind=self.name,
            domain=domain,
            reduce_dims=(),
            stored=stored,
            loads=loaded_nodes(graph, members),
        )
        ScatterEmitter(graph, info, KernelConfig(16, 0)).emit()  # index checks
        return info

    def prefix(self, info: GroupInfo, config: KernelConfig) -> str:
        return "sct"

    def generate(self, graph: Graph, info: GroupInfo, config: KernelConfig, index: int) -> Kernel:
        name = kernel_name(graph, info, self.prefix(info, config), index)
        return render_loop_kernel(ScatterEmitter(graph, info, config), name, self.name)
