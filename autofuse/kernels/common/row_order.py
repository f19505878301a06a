"""The order a row reduction walks its row in (``AUTOFUSE_REDUCTION_ORDER=stride``, an
experiment; the default walks a row in its logical order).

A GroupNorm row of a channels-last convolution's result is the group's channels then its
pixels, flattened: element ``c * HW + p`` of the row sits at offset ``c + C * p`` of the
buffer, so neighbouring columns are a whole pixel (C elements) apart and a block of the row
reads one channel of every pixel, a 2- or 4-byte read per 128-byte line (L2_92's statistics:
973 us on the H100 where the contiguous plan's took 305). Where every row the group reads from
memory is two digits of that kind (a high digit of ``a`` values with the smaller stride and a
low digit of ``b`` with the larger), :func:`row_swap` asks for the row walked low digit
outermost: column ``r`` is element ``b * (r % a) + r // a`` (``views.loop_index``), so a block
reads each pixel's channels together. Only where the walk's order changes nothing but a sum's
rounding: sums, means, maxima, minima and products over the row, no index-valued (argmax: the
first maximum's column) or running (cumsum) reduction.
"""

from __future__ import annotations

from collections.abc import Iterator

from autofuse.ir.graph import Graph
from autofuse.ir.indexing import Expr
from autofuse.kernels.common.base import GroupInfo
from autofuse.kernels.common.memory import load_offset
from autofuse.kernels.common.views import broadcast_index, loop_index, view_source_index
from autofuse.settings import settings

ORDER_FREE = frozenset({"sum", "mean", "amax", "amin", "prod", "any"})


def row_swap(graph: Graph, info: GroupInfo) -> tuple[int, int] | None:
    """(a, b) where the group's row is best walked low digit outermost (see the module), else
    None: the setting off, more than two reduced dims (two: the digits are those dims, a
    GroupNorm row's (C/G, HxW)), a GEMM's row (the row GEMM kind bounds its columns on the
    logical walk), a reduction whose result depends on the order, or a row read that is not
    two such digits."""
    if settings().reduction_order != "stride" or len(info.reduce_dims) not in (1, 2):
        return None
    if info.matmuls:
        return None
    reds = [graph[i] for i in info.nodes if graph[i].kind == "reduction"]
    if not reds or any(n.op not in ORDER_FREE for n in reds):
        return None
    full = loop_index(info.domain, info.reduce_dims)
    reads = [(off, _digits(off, info.rnumel)) for off in _row_reads(graph, info, full)]
    pairs = {d for _, d in reads if d != HIGH_ONLY}
    if len(pairs) != 1 or None in pairs:
        return None
    (swap,) = pairs
    if len(info.reduce_dims) == 2 and swap != tuple(info.domain[d] for d in info.reduce_dims):
        return None  # the digits are not the two dims
    # a read over the high digit alone (a per-channel weight) is the same in either walk
    if any(d == HIGH_ONLY and not _high_only(off, swap) for off, d in reads):
        return None
    return swap


def _row_reads(graph: Graph, info: GroupInfo, full: tuple[Expr, ...]) -> Iterator[Expr]:
    """The offsets of the group's loads that the row's columns move (those over ``rindex``):
    the domain's index pushed back from the reductions' inputs through views and the members
    computing them (a bias added before the row's reshape)."""
    members = set(info.nodes)
    stack = [(k, full) for i in info.nodes if graph[i].kind == "reduction" for k in graph[i].inputs]
    seen: set[int] = set()
    while stack:
        j, idx = stack.pop()
        while j not in members and graph[j].kind == "view":
            idx = view_source_index(graph, j, idx)
            j = graph[j].inputs[0]
        if j in info.loads:
            off = load_offset(graph, j, idx)
            if "rindex" in off.vars:
                yield off
        elif j in members and graph[j].kind not in ("view", "reduction") and j not in seen:
            seen.add(j)  # (a member's index is the same from every reader: its domain's)
            shape = graph[j].shape
            stack += [(k, broadcast_index(graph[k].shape, shape, idx)) for k in graph[j].inputs]


HIGH_ONLY = (0, 0)  # _digits: a read over one column term, ``r // b``


def _high_only(off: Expr, swap: tuple[int, int]) -> bool:
    """Whether ``off``'s one column term is the high digit of ``swap``'s row: ``r // b``."""
    a, b = swap
    ((t, _),) = [(t, k) for t, k in off.terms if "rindex" in t.vars]
    return t.var == "rindex" and t.div == b and t.mod in (None, a)


def _digits(off: Expr, rnumel: int) -> tuple[int, int] | None:
    """(a, b) where ``off``'s column terms are ``c1 * (r // b)`` and ``c2 * (r % b)`` with
    ``a * b == rnumel`` and 0 < c1 < c2 (the high digit nearer in memory); HIGH_ONLY where its
    one column term is a ``r // d``; else None."""
    terms = [(t, k) for t, k in off.terms if "rindex" in t.vars]
    if len(terms) == 1 and terms[0][0].var == "rindex" and terms[0][0].div > 1:
        return HIGH_ONLY
    if len(terms) != 2 or any(t.var != "rindex" for t, _ in terms):
        return None
    high = [(t, k) for t, k in terms if t.div > 1]
    low = [(t, k) for t, k in terms if t.div == 1 and t.mod is not None]
    if len(high) != 1 or len(low) != 1:
        return None
    (th, c1), (tl, c2) = high[0], low[0]
    b = tl.mod
    if th.div != b or rnumel % b:
        return None
    a = rnumel // b
    if th.mod not in (None, a) or not 0 < c1 < c2 or a < 2:
        return None
    return a, b
