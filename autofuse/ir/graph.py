"""The one IR of autofuse: a frozen graph of frozen nodes, from capture to codegen.

A :class:`Graph` is a tuple of :class:`Node` in topological order; a node names its inputs by
their position in that tuple. Every stage of the pipeline (capture, partition, codegen, plan)
reads a graph and never mutates it. ``Graph.key`` is a structural hash: two graphs with the same
ops, shapes, dtypes, strides and attributes have the same key whatever their debug names.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from autofuse.ir.ops import FLOAT_DTYPES, op_def

__all__ = [
    "FLOAT_DTYPES",
    "Graph",
    "Lowering",
    "Node",
    "buffer_strides",
    "kept_strides",
    "contiguous_strides",
    "dedupe",
    "make_attrs",
    "numel",
]


def op_class(op: str) -> str:
    """One of 'input', 'pointwise', 'reduction', 'view', 'matmul', 'opaque' (the op table's)."""
    return op_def(op).kind


def contiguous_strides(shape: Iterable[int]) -> tuple[int, ...]:
    shape = tuple(shape)
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(strides))


def numel(shape: Iterable[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# ---------------------------------------------------------------------------------------------
# Nodes and graphs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """One value of the program.

    ``attrs`` is a sorted tuple of (name, value) pairs of hashable values: reduction dims and
    keepdim, view arguments, constant values, cast dtypes, the ATen target of an opaque op.
    ``name`` is for humans (the FX node name) and is not part of the structural key.
    """

    op: str
    inputs: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    name: str = field(default="", compare=False)

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    @property
    def kind(self) -> str:
        return op_class(self.op)

    def signature(self) -> str:
        return f"{self.op}{self.inputs}{self.shape}{self.dtype}{self.strides}{self.attrs!r}"


EAGER_LAYOUT_OPS = ("opaque", "getitem")  # ops a plan runs in eager, kept as they come out


def dense(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether ``strides`` lay ``shape`` out densely (a permutation of a contiguous layout;
    size-1 dims aside): no gaps, no overlaps."""
    dims = sorted((st, n) for n, st in zip(shape, strides) if n > 1)
    acc = 1
    for st, n in dims:
        if st != acc:
            return False
        acc *= n
    return True


def buffer_strides(node: Node) -> tuple[int, ...]:
    """The strides a kernel reads node's buffer with: an input's own (checked per call); an
    op the plan runs in eager (an opaque ATen op, a multi-output op's item) as traced when that
    layout is dense (cuDNN attention's output is (B, T, H, D) in memory for a (B, H, T, D)
    tensor: no copy to read it); a buffer whose layout the plan keeps (``eager_strides``
    recorded: a convolution's channels-last input or result, ``ir/conv_layout.py``) in that
    layout, kernels writing and reading it so; anything else contiguous (kernels write
    contiguous buffers, and the runtime makes any other buffer so before a kernel reads it)."""
    if node.kind == "input":
        return node.strides
    if node.op in EAGER_LAYOUT_OPS and node.strides and dense(node.shape, node.strides):
        return node.strides
    return kept_strides(node) or contiguous_strides(node.shape)


def kept_strides(node: Node) -> tuple[int, ...] | None:
    """The strides of a layout the plan keeps for ``node``'s buffer (``eager_strides``
    recorded, ``ir/conv_layout.py``: kernels write and read it so), None where it keeps none."""
    if node.attr("eager_strides") is not None and dense(node.shape, node.strides):
        return tuple(node.strides)
    return None


def scalar_const(node: Node) -> float | None:
    """The value of ``node`` where it is a scalar constant, else None."""
    if node.op != "const" or node.shape != () or node.attr("value") is None:
        return None
    return float(node.attr("value"))


def make_attrs(**kwargs: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(kwargs.items()))


@dataclass(frozen=True)
class Lowering:
    """Where a graph came from: the graph the layout-reading passes (split reductions, values
    computed again) made it from, on a CUDA target or not, and the graph they made (one that
    no longer equals it, changed since, does not use it): ``ir/pipeline.relaid`` makes another
    layout's graph from it."""

    graph: Graph
    cuda: bool
    made: Graph


@dataclass(frozen=True)
class Graph:
    """A frozen, topologically ordered op graph with numbered inputs and outputs; ``lowering``
    (not part of its identity) says what the pipeline made it from, where it did."""

    nodes: tuple[Node, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    lowering: Lowering | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for i, node in enumerate(self.nodes):
            for j in node.inputs:
                if not 0 <= j < i:
                    raise ValueError(
                        f"node {i} ({node.op}) reads node {j}: expected an earlier node "
                        "(graphs are topologically ordered)"
                    )
        for j in self.outputs:
            if not 0 <= j < len(self.nodes):
                raise ValueError(f"output {j} is not a node of this {len(self.nodes)}-node graph")

    @cached_property
    def key(self) -> str:
        h = hashlib.sha256()
        for node in self.nodes:
            h.update(node.signature().encode())
            h.update(b";")
        h.update(repr((self.inputs, self.outputs)).encode())
        return h.hexdigest()[:24]

    @cached_property
    def users(self) -> tuple[tuple[int, ...], ...]:
        users: list[list[int]] = [[] for _ in self.nodes]
        for i, node in enumerate(self.nodes):
            for j in dict.fromkeys(node.inputs):
                users[j].append(i)
        return tuple(tuple(u) for u in users)

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, i: int) -> Node:
        return self.nodes[i]

    def base_of(self, i: int) -> int:
        """Follow view ops back to the node that owns the memory (or computes the value)."""
        while self.nodes[i].kind == "view":
            i = self.nodes[i].inputs[0]
        return i

    def compute_nodes(self) -> tuple[int, ...]:
        """Nodes that need a kernel or an eager op: everything but inputs and views."""
        return tuple(i for i, n in enumerate(self.nodes) if n.kind not in ("input", "view"))

    def compute_inputs(self, i: int) -> tuple[int, ...]:
        """The base nodes that node i reads, through any chain of views."""
        return tuple(dict.fromkeys(self.base_of(j) for j in self.nodes[i].inputs))

    @cached_property
    def compute_users(self) -> tuple[tuple[int, ...], ...]:
        """For each node, the compute nodes that read it through views (or directly)."""
        out: list[list[int]] = [[] for _ in self.nodes]
        for i in self.compute_nodes():
            for j in self.compute_inputs(i):
                out[j].append(i)
        return tuple(tuple(u) for u in out)

    def pretty(self) -> str:
        lines = []
        for i, n in enumerate(self.nodes):
            args = ", ".join(f"%{j}" for j in n.inputs)
            attrs = " ".join(f"{k}={v}" for k, v in n.attrs if k != "args")
            lines.append(
                f"%{i} = {n.op}({args}) {attrs} : {n.dtype}{list(n.shape)}  # {n.name}".rstrip()
            )
        lines.append(f"return {', '.join(f'%{j}' for j in self.outputs)}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Passes
# ---------------------------------------------------------------------------------------------

_PURE = frozenset({"pointwise", "reduction", "view", "matmul"})


def dedupe(graph: Graph) -> Graph:
    """Common-subexpression elimination: a pure node equal to an earlier one (same op, inputs,
    shape, dtype, strides and attributes) is replaced by it, e.g. the two means of x that a
    decomposed layer_norm computes. Inputs, opaque ops, constants and aranges are never merged,
    and a graph output keeps its own node (two outputs never alias)."""
    remap: dict[int, int] = {}
    seen: dict[str, int] = {}
    nodes: list[Node] = []
    outputs = set(graph.outputs)
    for i, node in enumerate(graph.nodes):
        node = replace(node, inputs=tuple(remap[j] for j in node.inputs))
        # constants and aranges cost nothing per use: each stays with its users' subgraph
        pure = node.kind in _PURE and node.op not in ("const", "iota")
        key = node.signature() if pure else None
        if key is not None and key in seen and i not in outputs:
            remap[i] = seen[key]
            continue
        nodes.append(node)
        remap[i] = len(nodes) - 1
        if key is not None:
            seen.setdefault(key, remap[i])
    return Graph(
        tuple(nodes), tuple(remap[i] for i in graph.inputs), tuple(remap[o] for o in graph.outputs)
    )
