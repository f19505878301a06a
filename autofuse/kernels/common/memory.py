"""Where a node's elements live: item sizes by dtype, a node's bytes, its offset into the buffer
behind its views (and a loaded node's, as loop kernels address it), and its ancestors (the
matmul kinds walk them)."""

from __future__ import annotations

from autofuse.ir.graph import Graph, buffer_strides, contiguous_strides, numel
from autofuse.ir.indexing import Expr, linearize
from autofuse.kernels.common.views import flat_of, view_source_index

ITEM = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
ITEMSIZE = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4,
    "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}  # fmt: skip


def nbytes(graph: Graph, i: int) -> int:
    """The bytes of node ``i``'s value (an unknown dtype counted as 4 bytes an element)."""
    n = graph[i]
    return numel(n.shape) * ITEMSIZE.get(n.dtype, 4)


def memory_offset(graph: Graph, i: int, idx) -> Expr:
    """Offset into the buffer behind node ``i`` (through its views) of element ``idx``."""
    while graph[i].kind == "view":
        idx = view_source_index(graph, i, idx)
        i = graph[i].inputs[0]
    node = graph[i]
    strides = buffer_strides(node)
    return linearize(idx, strides, node.shape)


def load_offset(graph: Graph, i: int, index: tuple[Expr, ...]) -> Expr:
    """The offset of ``index`` in node ``i``'s buffer (a loaded node: no views above it)."""
    node = graph[i]
    strides = buffer_strides(node)
    if strides == contiguous_strides(node.shape):  # a reshape's flat offset, as it is
        return flat_of(index, node.shape)
    return linearize(index, strides, node.shape)


def ancestors(graph: Graph, i: int) -> set[int]:
    out, todo = set(), list(graph.compute_inputs(i))
    while todo:
        j = todo.pop()
        if j not in out:
            out.add(j)
            todo.extend(graph.compute_inputs(j))
    return out
