"""The attention kernel under runtime sizes (``common/sizes.py``): its query and key counts are
the arguments ``T`` and ``TK``, and the strides that hold them are arguments too.

The emitter writes ``T`` and ``TK`` where it would write the counts (the row and key masks,
always on; the key loop's end; the causal bounds), and renders the kernel twice: as it is, and
as a probe whose buffers' strides are those of the same layouts with every query-row and key
dim one longer (:func:`grown_strides`). The literals the two texts differ in are the strides
that hold ``T`` or ``TK``: they become arguments (``common/literals.with_probe_arguments``),
passed their values at each shape, so the lengths of one bucket share one kernel text from the
first. A buffer whose layout is not dense keeps its strides as literals (made arguments from
a traced graph's second shape on, ``common/literals.with_size_arguments``).
"""

from __future__ import annotations

from collections.abc import Sequence

from autofuse.ir.graph import dense
from autofuse.ir.indexing import Expr

__all__ = ["KEY_VARS", "ROW_VARS", "grown_strides"]

ROW_VARS = ("xindex", "offs_m")  # the variables of a tile's query rows
KEY_VARS = ("rindex", "offs_n")  # and of its keys


def grown_strides(
    shape: Sequence[int], index: Sequence[Expr], strides: Sequence[int]
) -> tuple[int, ...]:
    """``strides`` of a buffer of ``shape`` read at ``index``, as they would be were each dim
    that ``index`` reads by a query row or a key one longer (the layout kept: the dims in the
    same order in memory); as they are where the layout is not dense or no such dim is read."""
    grown = list(shape)
    for k, e in enumerate(index):
        if grown[k] > 1 and any(v.startswith(ROW_VARS + KEY_VARS) for v in e.vars):
            grown[k] += 1
    if grown == list(shape) or not dense(shape, strides):
        return tuple(strides)
    out, acc = list(strides), 1
    for k in sorted(range(len(grown)), key=lambda k: (strides[k], -k)):  # innermost first
        out[k] = acc
        acc *= grown[k]
    return tuple(out)
