"""What the split-reduction passes share (``split.py``, ``split_variance.py``): the decision
record for one reduction, how a decision cuts the reduced extent into chunks, and new nodes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autofuse.ir.graph import Node, contiguous_strides, make_attrs, numel


@dataclass(frozen=True)
class SplitDecision:
    """What the pass does with one reduction: ``k`` chunks (1: left alone) and why."""

    node: int
    k: int
    reason: str
    dim: int = 0  # the first dim of the run of adjacent reduced dims that is cut
    last: int = -1  # the run's last dim (-1: ``dim`` alone), merged with ``dim`` before the cut
    # "m2": a sum((x - mean(x))^2) computed as chunk means and M2s combined by Chan's formula
    # (ir/split_variance.py); "mean": a mean of that x replaced by the combined mean
    role: str = ""
    # the chunked view's dims as memory holds them, outermost first, where the reduction reads
    # a non-contiguous layout (ir/split_layout.py): the partials read the view permuted so
    # (() : the view's own order)
    order: tuple[int, ...] = ()


def new_node(
    op: str, inputs: tuple[int, ...], out_shape, out_dtype: str, name: str, **attrs
) -> Node:
    """A node with a contiguous result of ``out_shape``."""
    shape = tuple(int(s) for s in out_shape)
    strides = contiguous_strides(shape)
    return Node(op, tuple(inputs), shape, out_dtype, strides, make_attrs(**attrs), name)


def chunk_layout(
    shape: tuple[int, ...], dims: tuple[int, ...], dec: SplitDecision
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """How ``dec`` cuts a reduction of ``shape`` over (sorted) ``dims``: the chunked view's
    shape, the dims of that view a chunk's partial reduces, and the shape of the partials
    viewed for the second stage (``shape`` with k at ``dec.dim``, 1 at the other reduced dims,
    reduced over ``dims`` again). The run ``dec.dim .. dec.last`` (adjacent reduced dims) is
    merged and cut in ``(k, run / k)``; the reduced dims outside it are reduced whole by each
    chunk's partial (BatchNorm's ``(N, H, W)``: N whole, ``H * W`` cut)."""
    k, d = dec.k, dec.dim
    e = max(dec.last, d)
    extent = numel(shape[d : e + 1])
    cut = shape[:d] + (k, extent // k) + shape[e + 1 :]
    part_dims = tuple(
        sorted({j for j in dims if j < d} | {d + 1} | {j + 1 - e + d for j in dims if j > e})
    )
    q_shape = tuple(k if j == d else 1 if j in dims else s for j, s in enumerate(shape))
    return cut, part_dims, q_shape


@dataclass(frozen=True)
class ChunkView:
    """``chunk_layout``'s chunked view as the partials read it: permuted by ``order`` (a
    decision's, () for none). ``shape`` and ``dims`` are the permuted view's shape and the dims
    of it the partials reduce; ``q_shape`` is the partials' shape for the second stage."""

    cut: tuple[int, ...]
    part_dims: tuple[int, ...]
    q_shape: tuple[int, ...]
    order: tuple[int, ...] = ()

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.cut[j] for j in self.order) if self.order else self.cut

    @property
    def dims(self) -> tuple[int, ...]:
        if not self.order:
            return self.part_dims
        return tuple(sorted(self.order.index(j) for j in self.part_dims))

    def view(self, add: Any, x: int, dtype: str, name: str) -> int:
        """Append the view of node ``x`` the partials read; its index."""
        # (``chunks``: the split's view, a domain of its own even where its shape is one the
        # graph reads x in already: GroupNorm's (N, G, C/G, HxW) cut in C/G chunks)
        view = new_node("reshape", (x,), self.cut, dtype, f"{name}.chunks", shape=self.cut,
                        chunks=True)  # fmt: skip
        v = add(view)
        if not self.order:
            return v
        return add(
            new_node("permute", (v,), self.shape, dtype, f"{name}.chunks_t", dims=self.order)
        )

    def back(self, add: Any, p: int, dtype: str, name: str, keepdim: bool) -> int:
        """Append the views of partials ``p`` (reduced over ``dims``, with ``keepdim``) that
        give them ``q_shape``; the index of the last."""
        if self.order:
            kept = [j for j in self.order if keepdim or j not in self.part_dims]
            perm = tuple(sorted(range(len(kept)), key=kept.__getitem__))
            if perm != tuple(range(len(perm))):
                shape = tuple(add.nodes[p].shape[j] for j in perm)
                p = add(new_node("permute", (p,), shape, dtype, f"{name}_t", dims=perm))
        if tuple(add.nodes[p].shape) == self.q_shape:
            return p
        return add(new_node("reshape", (p,), self.q_shape, dtype, name, shape=self.q_shape))


def chunk_view(shape: tuple[int, ...], dims: tuple[int, ...], dec: SplitDecision) -> ChunkView:
    """The chunked view of ``chunk_layout`` read in ``dec.order``."""
    return ChunkView(*chunk_layout(shape, dims, dec), dec.order)
