"""The attention backward's tile operands read through TMA tensor descriptors (config ``TMA``).

Every tile the backward kernel loads (Q, dO and K, V, held by a program or read a step at a
time) is a block of consecutive sequence positions by the whole head dim of one (batch, head):
rows of ``d`` contiguous elements at a pitch. A 2-D descriptor over the buffer seen as rows of
that pitch loads it with the copy engine (``desc.load([first row, 0])``, transposed where the
kernel reads it head dim first), with no address arithmetic per element. Whether that is faster
than the pipelined pointer loads is the machine's to say (the search times it: ``TMA`` is one
of its option switches); ptxas for sm_90 gives mixed register counts (Triton 3.6, causal
d = 128: 173 against 206 registers at 32 x 64 swapped tiles, more spilled bytes at 64 x 64).

A tile is read this way where it needs no bounds mask (its rows never run past the sequence, so
a tile never reaches into the next head's rows, and the head dim is one power-of-two block),
its offset splits into ``row * pitch + position * pitch + dim``
(``attention.tma.split_offset``) and the pitch is 16-byte aligned; any other tile keeps its
pointer load. One descriptor per buffer and tile height, made once per program before its loops
(Triton's scratch allocator: the kernel's ``needs_allocator``; the runtime checks the buffers'
alignment, ``input_alignment``, before such a launch).
"""

from __future__ import annotations

from typing import Any

from autofuse.ir.indexing import Expr
from autofuse.kernels.attention.tma import descriptor_rows, split_offset

_SEQ = ("offs_m", "offs_n")


def tile(em: Any, base: int, off: Expr, pair: tuple[Expr, Expr], mask: str | None) -> str | None:
    """The descriptor load of the tile at ``off`` of buffer ``base`` (``pair``: its sequence
    and head dim index, in the tile's orientation) as an expression, or None where the tile
    keeps a pointer load."""
    if not em.cfg.TMA or mask is not None:
        return None
    seq = [v for e in pair for v in e.vars if v.startswith(_SEQ)]
    head = [e for e in pair if any(v.startswith("offs_h") for v in e.vars)]
    if len(seq) != 1 or len(head) != 1 or len(head[0].terms) != 1:
        return None
    size = head[0].terms[0][0].size
    (head_name,) = head[0].vars
    split = split_offset(off, seq[0], head_name)
    rows = None if split is None else descriptor_rows(em.g[base], split[0], size)
    if rows is None:
        return None
    pitch, row = split
    block = _block(em, seq[0])
    desc = _descriptor(em, base, pitch, rows, size, block)
    start = _start(em, seq[0])
    code = f"{desc}.load([{row.render()} + {start}, 0])"
    return code if seq[0].endswith("[:, None]") else f"tl.trans({code})"


def _block(em: Any, seq: str) -> str:
    """The constexpr sizing the tile's sequence positions in the current role."""
    rows, keys = em.blocks()
    return rows if seq.startswith("offs_m") else keys


def _start(em: Any, seq: str) -> str:
    """The tile's first sequence position: the held block's or the loop step's."""
    if seq.startswith("offs_m"):
        return "start_m" if em.role == "kv" else "start_q"
    return "start_k" if em.role == "kv" else "start_n"


def _descriptor(em: Any, base: int, pitch: int, rows: int, size: int, block: str) -> str:
    """The role's descriptor over ``base`` (``rows`` of ``pitch``) for tiles of ``block`` rows,
    made before the role's first loop the first time a tile needs it (names differ between the
    roles' branches)."""
    name = f"{em.role}_desc{em.info.loads.index(base)}_{block.lower()}"
    if name not in em.descriptors:
        node = em.g[base]
        em.loops[-1].before(
            em,
            f"{name} = tl.make_tensor_descriptor({em.ptr[base]}, shape=[{rows}, "
            f"{size}], strides=[{pitch}, 1], block_shape=[{block}, {size}])  # {node.name}, "
            f"rows of {pitch}",
        )
        em.descriptors.add(name)
    return name
