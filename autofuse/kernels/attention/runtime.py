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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autofuse.ir.graph import dense
from autofuse.ir.indexing import Expr
from autofuse.kernels.common.base import Kernel
from autofuse.kernels.common.literals import with_probe_arguments, with_size_arguments

__all__ = ["BAKED", "KEY_VARS", "ROW_VARS", "Sizes", "grown_strides", "sized_kernel"]

ROW_VARS = ("xindex", "offs_m")  # the variables of a tile's query rows
KEY_VARS = ("rindex", "offs_n")  # and of its keys


@dataclass(frozen=True)
class Sizes:
    """How an attention kernel writes its sequence lengths: as numbers, or (``runtime``) as
    the arguments ``T`` and ``TK``; ``grown``: the probe of such a kernel, whose buffers'
    strides are :func:`grown_strides`."""

    runtime: bool = False
    grown: bool = False

    def names(self, t: int, tk: int) -> tuple[str, str, str, str]:
        """T, TK, T - 1 and TK - 1 as the kernel writes them."""
        if self.runtime:
            return "T", "TK", "T - 1", "TK - 1"
        return str(t), str(tk), str(t - 1), str(tk - 1)


BAKED = Sizes()  # outside runtime sizes


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


def sized_kernel(render: Callable[[Sizes], Kernel], runtime: bool) -> Kernel:
    """The kernel ``render(Sizes(runtime))`` gives; under runtime sizes with the strides that
    hold T or TK as arguments (found against ``render(Sizes(True, grown=True))``), and in a
    traced graph with the literals that differ between its shapes as arguments too."""
    kernel = render(Sizes(runtime))
    if runtime:
        kernel = with_probe_arguments(kernel, render(Sizes(True, True)).source, subscripts=True)
    return with_size_arguments(kernel, subscripts=True)
