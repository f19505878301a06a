"""The physical layout a split reduction reads (a step of ``ir/split.py``).

Whether a reduction is *inner* (its reduced elements are neighbours in memory: ``x.sum(-1)``)
or *outer* (its outputs are: column sums) is a question of the buffer its kernel reads, not of
the logical shape. A convolution kept channels-last (``ir/conv_layout.py``) holds its channels
innermost: the global average pool ``mean(dims=(2, 3))`` of its ``(N, C, H, W)`` result reduces
the innermost dims logically but walks memory with stride ``C``, the channels (the kept dim)
being the neighbours: physically an outer reduction. On the H100, KernelBench's L2_42 pooled a
ConvTranspose2d's (16, 128, 514, 514) channels-last result as an inner reduction left whole
(2048 rows fill 132 SMs): 128 programs of 16 rows, 1628 us against Inductor's split 732 us.

:func:`read_layouts` follows every node's elements through views (a pool's strided windows too)
and same-shaped pointwise ops
(the ones fused into a reduction's kernel) to the buffer a kernel reads, in one pass, and
:func:`read_strides` gives the strides a reduction's input is read with; :func:`physically_inner` classifies the reduction by
them; :func:`chunk_order` orders the split's chunked view as memory holds it (outermost first),
so the first stage's kept dims end with the innermost one (the channels) and its rows index the
buffer contiguously (coalesced loads) instead of a stride of a whole chunk.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from autofuse.ir.conv_layout import channels_last_strides
from autofuse.ir.graph import Graph, Node, buffer_strides, contiguous_strides, dense
from autofuse.ir.split_chunks import SplitDecision, chunk_layout

__all__ = [
    "chunk_order",
    "layout_label",
    "nested",
    "outermost",
    "physically_inner",
    "read_layouts",
    "read_strides",
]


def _same(shape: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether strides ``a`` and ``b`` lay ``shape`` out alike (size-1 dims aside)."""
    return all(x == y for n, x, y in zip(shape, a, b) if n > 1)


def _through_view(src: Node, strides: tuple[int, ...], view: Node) -> tuple[int, ...] | None:
    """The strides of ``view`` of ``src`` laid out with ``strides`` (None: not one strided
    layout, or a view this walk does not follow)."""
    if view.op == "permute":
        return tuple(strides[d] for d in view.attr("dims"))
    if view.op == "slice":  # a pool's window: every step-th element along one dim
        d = view.attr("dim")
        return strides[:d] + (strides[d] * view.attr("step"),) + strides[d + 1 :]
    if view.op not in ("reshape", "squeeze", "unsqueeze"):
        return None
    if _same(src.shape, strides, contiguous_strides(src.shape)):
        return contiguous_strides(view.shape)
    t = torch.empty_strided(src.shape, strides, device="meta")
    try:
        out = t.unsqueeze(view.attr("dim")) if view.op == "unsqueeze" else t.view(view.shape)
    except (RuntimeError, ValueError):  # a reshape that is no view of this layout
        return None
    return tuple(out.stride())


def _read(graph: Graph, node: Node, reads: list) -> tuple[int, ...] | None:
    """``read_layouts``' entry for ``node`` (``reads``: the earlier nodes')."""
    if node.kind == "view":
        below = reads[node.inputs[0]]
        out = None if below is None else _through_view(graph[node.inputs[0]], below, node)
        return out if out is not None and (dense(node.shape, out) or _windows(node, out)) else None
    strides = tuple(buffer_strides(node))
    if not dense(node.shape, strides):
        return None
    contiguous = contiguous_strides(node.shape)
    if node.kind == "pointwise" and _same(node.shape, strides, contiguous):
        for j in node.inputs:  # the same-shaped operands, fused into the reduction's kernel
            found = reads[j] if graph[j].shape == node.shape else None
            if found is not None and not _same(node.shape, found, contiguous):
                return found
    return strides


def _windows(node: Node, strides: tuple[int, ...]) -> bool:
    """Whether ``strides`` of slice ``node`` are a pool window's: every element apart, in
    order (not one dense layout, but its order is memory's: a kept channels-last result's
    max pool still holds its channels innermost)."""
    return node.op == "slice" and len(set(strides)) == len(strides) and min(strides, default=1) > 0


def read_layouts(graph: Graph) -> tuple[tuple[int, ...] | None, ...]:
    """Per node, the strides a kernel that reads it (through its views and the same-shaped
    pointwise ops fused before it) reads its elements with: the layout a buffer keeps (a
    channels-last convolution's result, ``eager_strides``), an input's own, else contiguous
    (None: not one dense layout). One pass in graph order."""
    reads: list[tuple[int, ...] | None] = []
    for node in graph.nodes:
        reads.append(_read(graph, node, reads))
    return tuple(reads)


def read_strides(
    graph: Graph, i: int, reads: Sequence[tuple[int, ...] | None] | None = None
) -> tuple[int, ...] | None:
    """The strides a reduction of node ``i`` reads its elements with, where they are not
    contiguous (None: contiguous, or not one dense layout); ``reads``: ``read_layouts(graph)``
    where the caller has it."""
    found = (reads if reads is not None else read_layouts(graph))[i]
    shape = graph[i].shape
    if found is None or _same(shape, found, contiguous_strides(shape)):
        return None
    return found


def physically_inner(shape: tuple[int, ...], strides: tuple[int, ...], dims) -> bool:
    """Whether a reduction of ``shape`` over ``dims`` read with ``strides`` is inner: every kept
    dim (size-1 dims aside) further apart in memory than every reduced one."""
    red = [strides[d] for d in dims if shape[d] > 1]
    kept = [st for j, (n, st) in enumerate(zip(shape, strides)) if j not in dims and n > 1]
    return not red or not kept or min(kept) > max(red)


def nested(shape: tuple[int, ...], strides: tuple[int, ...] | None, first: int, last: int) -> bool:
    """Whether dims ``first .. last`` (size-1 dims aside) are nested in memory as in logical
    order, each at least its inner neighbour's whole extent apart (a pool's windows leave gaps:
    nested), so merging them walks memory in order; always where ``strides`` is None
    (contiguous)."""
    if strides is None:
        return True
    run = [j for j in range(first, last + 1) if shape[j] > 1]
    return all(strides[a] >= strides[b] * shape[b] for a, b in zip(run, run[1:]))


def outermost(shape: tuple[int, ...], strides: tuple[int, ...], dims: tuple[int, ...]) -> int:
    """The dim of ``dims`` furthest apart in memory (size-1 dims aside; the first where all
    are size 1): a chunk cut along it holds the other reduced dims whole, each chunk's reads
    runs of memory (a channels-last GroupNorm row over (C/G, HxW): the pixels, every chunk a
    group's channels of some pixels)."""
    wide = [d for d in dims if shape[d] > 1]
    return max(wide, key=lambda d: strides[d]) if wide else dims[0]


def layout_label(shape: tuple[int, ...], strides: tuple[int, ...]) -> str:
    """``channels-last`` for a 4-D / 5-D channels-last layout, else the strides."""
    if len(shape) in (4, 5) and _same(shape, strides, channels_last_strides(shape)):
        return "channels-last"
    return f"strides {list(strides)}"


def chunk_order(
    shape: tuple[int, ...], strides: tuple[int, ...], dims: tuple[int, ...], dec: SplitDecision
) -> tuple[int, ...]:
    """The permutation of ``dec``'s chunked view (``chunk_layout``) that lists its dims as
    memory holds them, outermost first (size-1 dims stay in place); () where that is the
    view's own order or the cut run of dims is not nested in memory (each dim at least its
    inner neighbour's whole extent apart)."""
    d, e = dec.dim, max(dec.last, dec.dim)
    run = [j for j in range(d, e + 1) if shape[j] > 1]
    if not nested(shape, strides, d, e):
        return ()
    cut = chunk_layout(shape, dims, dec)[0]
    step = strides[run[-1]] if run else 1
    cut_strides = strides[:d] + (step * cut[d + 1], step) + strides[e + 1 :]
    slots = [j for j, n in enumerate(cut) if n > 1]
    order = list(range(len(cut)))
    for slot, j in zip(slots, sorted(slots, key=lambda j: -cut_strides[j])):
        order[slot] = j
    return () if order == sorted(order) else tuple(order)
