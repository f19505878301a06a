"""Where a node's elements live: item sizes by dtype, a node's offset into the buffer behind its
views, and a node's ancestors (the matmul kinds walk them)."""

from __future__ import annotations

from autofuse.ir.graph import Graph, buffer_strides
from autofuse.ir.indexing import Expr, linearize
from autofuse.kernels.common.views import view_source_index

ITEM = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def memory_offset(graph: Graph, i: int, idx) -> Expr:
    """Offset into the buffer behind node ``i`` (through its views) of element ``idx``."""
    while graph[i].kind == "view":
        idx = view_source_index(graph, i, idx)
        i = graph[i].inputs[0]
    node = graph[i]
    strides = buffer_strides(node)
    return linearize(idx, strides, node.shape)


def ancestors(graph: Graph, i: int) -> set[int]:
    out, todo = set(), list(graph.compute_inputs(i))
    while todo:
        j = todo.pop()
        if j not in out:
            out.add(j)
            todo.extend(graph.compute_inputs(j))
    return out
