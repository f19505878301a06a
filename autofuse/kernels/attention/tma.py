"""The attention kind's K and V tiles read through TMA tensor descriptors (config ``TMA``).

A key tile of K (or V) is ``BLOCK_N`` consecutive rows of ``d`` contiguous elements, starting
at a row that depends on the program's (batch, head) alone: a 2-D descriptor over the buffer
seen as rows of its key pitch (``[rows, d]``, strides ``[pitch, 1]``) loads it with the copy
engine, no address arithmetic per element. Grouped-query heads read through ``expand`` views
qualify too: their row is ``(bh // group) * T``.

Eligible where, for both operands: the head dim is a power of two (one block, no dim mask),
the key pitch is 16-byte aligned, the element offset splits into ``row * pitch + key * pitch +
dim`` with the key and dim read plainly, and the key count is a multiple of ``BLOCK_N`` (a tile
never runs into the next head's rows; configs with another ``BLOCK_N`` keep pointer loads).
The descriptors are made once per program on the device (Triton's scratch allocator; the
runtime checks the buffers' 16-byte alignment before such a launch, ``plan/runtime.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autofuse.ir.graph import buffer_strides
from autofuse.ir.indexing import Expr
from autofuse.kernels.attention.analysis import head_block
from autofuse.kernels.common.memory import ITEM


@dataclass(frozen=True)
class Operand:
    """One operand read through a descriptor: its loaded buffer, the buffer's rows of ``pitch``
    elements, and the program's first row (an expression of ``bh``)."""

    base: int
    pitch: int
    rows: int
    row: Expr


def split_offset(off: Expr, key: str, dim: str) -> tuple[int, Expr] | None:
    """``off`` as ``pitch * key + dim + row`` (row free of key and dim, a multiple of the
    pitch): (pitch, row / pitch), else None."""
    pitch, unit, rest = None, False, []
    for t, k in off.terms:
        if t.vars == {key}:
            if pitch is not None or t.div != 1 or t.mod is not None:
                return None
            pitch = k
        elif t.vars == {dim}:
            if unit or k != 1 or t.div != 1 or t.mod is not None:
                return None
            unit = True
        elif key in t.vars or dim in t.vars:
            return None
        else:
            rest.append((t, k))
    if pitch is None or not unit or pitch <= 0:
        return None
    if off.const % pitch or any(k % pitch for _, k in rest):
        return None
    return pitch, Expr(tuple((t, k // pitch) for t, k in rest), off.const // pitch)


def operand(em: Any, which: str) -> Operand | None:
    """The descriptor read of operand ``which`` ("k" or "v") of emitter ``em``, or None."""
    d = em.dims
    key = "rindex" if which == "k" else "offs_n[:, None]"
    dim = "offs_d[:, None]" if which == "k" else "offs_dv[None, :]"
    size = d.d if which == "k" else d.dv
    dim_e = Expr.dim(dim, 1, size, True)
    key_e = em.full[-1] if which == "k" else Expr.dim(key, 1, d.tk, True)
    index = (*em.bh3, dim_e, key_e) if which == "k" else (*em.bh3, key_e, dim_e)
    base, off = em.parts.operand_offset(em.g, em.parts.operand(em.g, which), index)
    split = split_offset(off, key, dim)
    rows = None if split is None else descriptor_rows(em.g[base], split[0], size)
    return None if rows is None else Operand(base, split[0], rows, split[1])


def descriptor_rows(node: Any, pitch: int, size: int) -> int | None:
    """The rows of ``pitch`` elements a 2-D descriptor over ``node``'s buffer spans, for rows
    read ``size`` contiguous elements at a time; None where a descriptor cannot read them (an
    element type it does not take, ``size`` not one power-of-two block, a pitch or a row under
    16 bytes, a pitch shorter than the row)."""
    item = ITEM.get(node.dtype)
    if item is None or size is None or size != head_block(size):
        return None
    if (pitch * item) % 16 or size * item < 16 or pitch < size:
        return None
    extent = 1 + sum((s - 1) * st for s, st in zip(node.shape, buffer_strides(node)))
    return -(-extent // pitch)


def readable(em: Any) -> bool:
    """Whether the attention kernel emitter ``em`` can read K and V through descriptors (key
    tiles must also divide the key count: ``AttentionConfig.BLOCK_N``, checked by the kind)."""
    return operand(em, "k") is not None and operand(em, "v") is not None


def setup(em: Any) -> dict[str, Operand]:
    """Make the K and V descriptors, once per program (before the key loops)."""
    out = {}
    for which, size, block in (("k", em.dims.d, "BLOCK_D"), ("v", em.dims.dv, "BLOCK_DV")):
        op = operand(em, which)
        if op is None:  # readable() admitted the config: a kind bug, not a user error
            raise RuntimeError(f"attention TMA config on an operand {which} that cannot take it")
        em.note_load(op.base)
        em.line(
            f"{which}_desc = tl.make_tensor_descriptor({em.ptr[op.base]}, shape=[{op.rows}, "
            f"{size}], strides=[{op.pitch}, 1], block_shape=[BLOCK_N, {block}])  # "
            f"{em.g[op.base].name}, rows of {op.pitch}"
        )
        em.line(f"{which}_row = {op.row.render()}  # this program's first {which} row")
        out[which] = op
    return out


def load(em: Any, which: str, var: str) -> None:
    """Operand ``which``'s tile at ``start_n`` into ``var`` (K transposed, as ``kt``)."""
    em.note_load(em.tma[which].base)
    tile = f"{which}_desc.load([{which}_row + start_n, 0])"
    em.line(f"{var} = {f'tl.trans({tile})' if which == 'k' else tile}  # TMA")
