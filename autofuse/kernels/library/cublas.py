"""The cuBLAS provider: matmuls run by torch's own ``mm`` / ``bmm`` / ``addmm`` (cuBLAS on a
GPU, the CPU BLAS elsewhere): a lone matmul, or a matmul and the bias added to it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from autofuse.ir.graph import Graph
from autofuse.kernels.library.call import LibraryCall, provided

_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "mm": torch.mm,
    "bmm": torch.bmm,
    "addmm": torch.addmm,
}
_LONE = ("mm", "bmm")  # the IR's matmul ops, each its own function


class CublasProvider:
    name = "cublas"

    def offers(self, graph: Graph, group: frozenset[int]) -> tuple[LibraryCall, ...]:
        if len(group) == 1:
            (i,) = group
            node = graph[i]
            if node.kind == "matmul" and node.op in _LONE:
                return (LibraryCall(self.name, node.op, node.inputs, i, (i,)),)
            return ()
        call = _addmm(graph, group)
        return (call,) if call is not None else ()

    def function(self, name: str) -> Callable[..., Any]:
        return provided(_FUNCTIONS, "cuBLAS", name)

    def reason(self, graph: Graph, call: LibraryCall) -> str:
        op = graph[call.out].op if call.name in _LONE else call.name
        return f"{op} runs as torch.{call.name} (cuBLAS on GPU)"

    def preferred(self, graph: Graph, group: frozenset[int]) -> LibraryCall | None:
        return None  # matmuls are generated groups: the plan's rule places their calls

    def note(self, graph: Graph, i: int) -> str | None:
        return None

    def key_parts(self, graph: Graph) -> dict[str, str]:
        return {}  # torch's version, in every key, names its cuBLAS


def _addmm(graph: Graph, group: frozenset[int]) -> LibraryCall | None:
    """``mm(a, b) + bias`` as ``addmm(bias, a, b)``: the group is the mm and the add alone, the
    mm read by nothing else, one dtype throughout and a bias of at most two dims that
    broadcasts to the product."""
    if len(group) != 2:
        return None
    mm, add = sorted(group)
    m, a = graph[mm], graph[add]
    if m.op != "mm" or a.op != "add" or list(a.inputs).count(mm) != 1 or a.attrs:
        return None
    (bias,) = [j for j in a.inputs if j != mm]
    b = graph[bias]
    if graph.users[mm] != (add,) or mm in graph.outputs or len(b.shape) > 2:
        return None
    if not (m.dtype == a.dtype == b.dtype) or a.shape != m.shape:
        return None
    if torch.broadcast_shapes(tuple(b.shape), tuple(m.shape)) != tuple(m.shape):
        return None
    return LibraryCall("cublas", "addmm", (bias, *m.inputs), add, (mm, add))
