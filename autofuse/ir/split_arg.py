"""Split argmax / argmin (an IR -> IR step of ``ir/split.py``): the index of a long row's first
winner, from per-chunk winners.

An arg reduction returns an index, so its partials cannot be combined by the same op. Per chunk
``j`` (``L`` elements each) the pass takes the chunk's best value ``m_j`` (amax / amin) and its
global index ``i_j = argmax(x_j) + j * L``; the row's best ``M`` is the best of the ``m_j`` and
the result is the smallest ``i_j`` among the chunks whose ``m_j`` is ``M``::

    r = amin(where(m_j == M | (m_j != m_j & M != M), i_j, BIG))   over the chunks

Eager's argmax / argmin return the first winner and let a NaN win: a chunk holding a NaN has
``m_j`` NaN (amax / amin propagate it), ``M`` is NaN, and the first such chunk's first NaN is
the result. Ties across chunks resolve to the earliest chunk, within one to its first index:
the first winner of the row. Every op is a pointwise op or a plain reduction the kinds render,
so the chunk stage fuses with what produces ``x``."""

from __future__ import annotations

from autofuse.ir.graph import Node, numel
from autofuse.ir.split_chunks import SplitDecision, chunk_layout
from autofuse.ir.split_chunks import new_node as _node

__all__ = ["ARG_BEST", "rewrite_arg"]

ARG_BEST = {"argmax": "amax", "argmin": "amin"}  # the value each arg reduction's winner has


def rewrite_arg(node: Node, shape: tuple[int, ...], x: int, dec: SplitDecision, add) -> int:
    """Append the split form of arg reduction ``node`` reading node ``x`` (shaped ``shape``);
    the index of the node that replaces it."""
    dims = tuple(sorted(j % len(shape) for j in node.attr("dims")))
    name, best, dt = node.name or node.op, ARG_BEST[node.op], add.nodes[x].dtype
    cut, part_dims, _ = chunk_layout(shape, dims, dec)
    length = numel(cut[j] for j in part_dims)
    keep = tuple(1 if j in part_dims else s for j, s in enumerate(cut))
    top_shape = tuple(1 if j == dec.dim else s for j, s in enumerate(keep))  # chunks reduced
    v = add(_node("reshape", (x,), cut, dt, f"{name}.chunks", shape=cut))
    local = add(_node(node.op, (v,), keep, "int64", f"{name}.part", dims=part_dims, keepdim=True))
    m = add(_node(best, (v,), keep, dt, f"{name}.best", dims=part_dims, keepdim=True))
    start = add(_node("iota", (), (dec.k,), "int64", f"{name}.starts", start=0, step=length))
    at = tuple(dec.k if j == dec.dim else 1 for j in range(len(keep)))
    start = add(_node("reshape", (start,), at, "int64", f"{name}.starts_at", shape=at))
    idx = add(_node("add", (local, start), keep, "int64", f"{name}.index"))
    top = add(_node(best, (m,), top_shape, dt, f"{name}.top", dims=(dec.dim,), keepdim=True))
    hit = add(_node("eq", (m, top), keep, "bool", f"{name}.hit"))
    nan_m = add(_node("ne", (m, m), keep, "bool", f"{name}.nan"))
    nan_top = add(_node("ne", (top, top), top_shape, "bool", f"{name}.nan_top"))
    both = add(_node("logical_and", (nan_m, nan_top), keep, "bool", f"{name}.nans"))
    win = add(_node("logical_or", (hit, both), keep, "bool", f"{name}.wins"))
    big = add(_node("const", (), (), "int64", f"{name}.none", value=2**62))
    cand = add(_node("where", (win, idx, big), keep, "int64", f"{name}.candidates"))
    r = add(
        _node("amin", (cand,), top_shape, "int64", f"{name}.first", dims=(dec.dim,), keepdim=True)
    )
    return add(_node("reshape", (r,), node.shape, "int64", name, shape=node.shape))
