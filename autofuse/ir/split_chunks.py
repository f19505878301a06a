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
    dim: int = 0  # the first dim of the run of adjacent reduced dims that is cut
    last: int = -1  # the run's last dim (-1: ``dim`` alone), merged with ``dim`` before the cut
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
