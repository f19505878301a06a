"""What the split-reduction passes share (``split.py``, ``split_variance.py``): the decision
record for one reduction, how a decision cuts the reduced extent into chunks, and new nodes."""

from __future__ import annotations

from dataclasses import dataclass

from autofuse.ir.graph import Node, contiguous_strides, make_attrs, numel


@dataclass(frozen=True)
class SplitDecision:
    """What the pass does with one reduction: ``k`` chunks (1: left alone) and why."""

    node: int
    k: int
    reason: str
    dim: int = 0  # the dim of the reduction's input that is cut (the first reduced dim)
    merged: bool = False  # the reduced dims are adjacent and merged into one before the cut
    # "m2": a sum((x - mean(x))^2) computed as chunk means and M2s combined by Chan's formula
    # (ir/split_variance.py); "mean": a mean of that x replaced by the combined mean
    role: str = ""


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
    reduced over ``dims`` again)."""
    k, d = dec.k, dec.dim
    if dec.merged:
        extent = numel(shape[j] for j in dims)
        cut = shape[:d] + (k, extent // k) + shape[dims[-1] + 1 :]
        part_dims: tuple[int, ...] = (d + 1,)
    else:
        cut = shape[:d] + (k, shape[d] // k) + shape[d + 1 :]
        part_dims = (d + 1,) + tuple(j + 1 for j in dims[1:])
    q_shape = tuple(k if j == d else 1 if j in dims else s for j, s in enumerate(shape))
    return cut, part_dims, q_shape
