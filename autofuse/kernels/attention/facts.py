"""What both attention kinds know of a group, found once: the record their analyses extend
(``AttentionParts`` of the forward, ``BwdParts`` of the backward), its memo, and the operand
code both kernels share (an operand read through its views and clones, loaded as a tile).

The two kinds analyse a group in ``analyze``; every later reader (the config space, the
default, the emitter, the cost facts, the TMA probes) takes the same record from the memo
instead of working it out again."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from autofuse.ir.graph import Graph, buffer_strides, numel
from autofuse.ir.indexing import Expr, linearize
from autofuse.kernels.attention.runtime import grown_strides
from autofuse.kernels.common.base import INLINE_OPS, FusionRefused
from autofuse.kernels.common.render import tile_address
from autofuse.kernels.common.views import view_source_index


@dataclass(frozen=True)
class AttentionGroup:
    """The facts both attention kinds share: one program column per (batch, head), its query
    rows and keys, the shape the pointwise ops on a score tile see, and the clones in front
    of the operands (grouped-query heads shared by an expand + reshape) read through."""

    heads: int  # programs along the batch: the matmuls' batch (batch x heads)
    t: int  # query rows
    tk: int  # keys
    domain: tuple[int, ...]  # a score tile's ops' shape (batch dims first, then T, Tk)
    copies: frozenset[int]  # clones in front of operands, read through as views

    def operand_base(self, graph: Graph, j: int) -> int:
        """The loaded buffer behind operand ``j`` (:meth:`operand_offset`'s)."""
        while graph[j].kind == "view" or j in self.copies:
            j = graph[j].inputs[0]
        return j

    def operand_offset(
        self, graph: Graph, j: int, index: tuple[Expr, ...], grown: bool = False
    ) -> tuple[int, Expr]:
        """The loaded buffer behind operand ``j`` (through views and read-through copies) and
        the offset of ``index`` in it (``grown``: at the strides of ``runtime.grown_strides``,
        the probe of a kernel under runtime sizes)."""
        while True:
            if graph[j].kind == "view":
                index = view_source_index(graph, j, index)
                j = graph[j].inputs[0]
            elif j in self.copies:
                j = graph[j].inputs[0]
            else:
                break
        node, strides = graph[j], buffer_strides(graph[j])
        if node.op in INLINE_OPS or not numel(node.shape):  # a constant, an empty tensor
            raise FusionRefused(f"an attention operand ({node.op} {node.name}) is no buffer")
        if grown:
            strides = grown_strides(node.shape, index, strides)
        return j, linearize(index, strides, node.shape)


def read_through_copies(graph: Graph, members: frozenset[int], j: int, copies: set[int]) -> int:
    """The node behind input ``j`` past the group's clones (added to ``copies``)."""
    i = graph.base_of(j)
    while i in members and graph[i].op == "copy":
        copies.add(i)
        i = graph.base_of(graph[i].inputs[0])
    return i


def tile_load(ptr: str, off: Expr, tile: tuple[str, ...], mask: str | None) -> str:
    """The load of an operand tile whose axes are ``tile`` at ``off`` from ``ptr`` (rows past
    the mask read as zero)."""
    masked = f", {mask}, other=0.0" if mask else ""
    return f"tl.load({ptr} + ({tile_address(off, tile)}){masked})"


Facts = TypeVar("Facts", bound=AttentionGroup)

_MEMO: dict[tuple[int, str, frozenset[int]], tuple[weakref.ref, Any]] = {}
_MEMO_SIZE = 256


def group_facts(
    graph: Graph, kind: str, members: frozenset[int], find: Callable[[], Facts]
) -> Facts:
    """The ``kind`` facts of the group ``members`` of ``graph``: ``find()`` once, then the
    record it gave (a graph is frozen: its facts never change)."""
    key = (id(graph), kind, members)
    hit = _MEMO.get(key)
    if hit is not None and hit[0]() is graph:
        return hit[1]
    facts = find()
    if len(_MEMO) >= _MEMO_SIZE:
        _MEMO.clear()
    _MEMO[key] = (weakref.ref(graph), facts)
    return facts
