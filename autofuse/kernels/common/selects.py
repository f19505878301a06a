"""Constant selects: a ``where(cond, C, mm)`` whose one side is a constant where the condition
holds, read by the matmul kinds to skip a product's tiles (a row GEMM's SKIP configs) or to
bound its column loops (a causal mask from aranges: :class:`ColumnBound`); the attention kind
bounds its key loop by them too.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from autofuse.ir.graph import Graph
from autofuse.ir.indexing import Expr
from autofuse.kernels.common.base import GroupInfo
from autofuse.kernels.common.memory import ancestors
from autofuse.kernels.common.views import broadcast_index, view_source_index


@dataclass(frozen=True)
class ConstantSelect:
    """``where(cond, C, x)`` (or ``where(cond, x, C)``) through which every use of the matmul
    passes: on a tile where ``cond`` is all true (all false) the product is never needed, and
    the row reductions and stores see the constant C (a causal mask's upper triangle)."""

    node: int
    cond: int
    const: int
    const_when: bool  # the value of cond for which the result is C


def constant_select(graph: Graph, info: GroupInfo) -> ConstantSelect | None:
    return next(constant_selects(graph, info), None)


def constant_selects(graph: Graph, info: GroupInfo) -> Iterator[ConstantSelect]:
    """Every ``where`` of the group that replaces the first matmul's product by a constant on
    the elements its condition picks, in node order."""
    members = set(info.nodes)
    mm = info.matmuls[0]
    for w in info.nodes:
        node = graph[w]
        if node.op != "where" or node.shape != info.domain:
            continue
        c, t, f = node.inputs
        for const, other, when in ((t, f, True), (f, t, False)):
            base = graph.base_of(const)
            if graph[base].op != "const" or graph.base_of(other) not in members:
                continue
            if mm in ancestors(graph, c) | {graph.base_of(c)}:
                continue
            if mm in ancestors(graph, other) | {graph.base_of(other)} and only_through(
                graph, info, mm, w
            ):
                yield ConstantSelect(w, c, base, const_when=when)
                break


@dataclass(frozen=True)
class ColumnBound:
    """The select is its constant on every column ``c >= row + offset`` (``upper``) or
    ``c < row + offset`` of a row, with ``row = scale * first_row_of_program + ...`` given by
    ``row`` rendered at the program's first row (``xoffset``): a causal mask, whose constant
    tiles need no product and, in a row reduction, no loads."""

    row: Expr
    scale: int
    offset: int
    upper: bool


_FLIP = {"lt": "gt", "gt": "lt", "le": "ge", "ge": "le"}
_NEGATE = {"lt": "ge", "ge": "lt", "gt": "le", "le": "gt"}


def column_bound(
    g: Graph, full: tuple[Expr, ...], xblock: int, sel: ConstantSelect
) -> ColumnBound | None:
    """Where ``sel``'s condition compares an arange over the rows with one over the columns,
    the columns on which it gives the constant, as a bound the loops can start or stop at
    (``full``: the kernel's domain index, ``xblock`` rows a program)."""
    index = broadcast_index(g[sel.cond].shape, g[sel.node].shape, full)
    c = sel.cond
    while g[c].kind == "view":
        index = view_source_index(g, c, index)
        c = g[c].inputs[0]
    op = g[c].op
    if op not in _FLIP:
        return None
    sides = [_iota_expr(g, j, broadcast_index(g[j].shape, g[c].shape, index)) for j in g[c].inputs]
    if None in sides:
        return None
    row = _row_term(sides[0], xblock)
    col = _col_offset(sides[1])
    if row is None or col is None:  # the column on the left: c op r
        row, col = _row_term(sides[1], xblock), _col_offset(sides[0])
    else:
        op = _FLIP[op]  # r op c == c flip(op) r
    if row is None or col is None:
        return None
    if not sel.const_when:
        op = _NEGATE[op]
    first, scale = row
    # the constant holds for the columns c (rindex + col) with: c op first_row_value
    if op == "gt":  # rindex + col > r  <=>  rindex >= r - col + 1: live below that
        return ColumnBound(first, scale, 1 - col, True)
    if op == "ge":
        return ColumnBound(first, scale, -col, True)
    if op == "lt":  # live from rindex >= r - col
        return ColumnBound(first, scale, -col, False)
    return ColumnBound(first, scale, 1 - col, False)  # le


def _iota_expr(g: Graph, i: int, index) -> Expr | None:
    while g[i].kind == "view":
        index = view_source_index(g, i, index)
        i = g[i].inputs[0]
    if g[i].op != "iota":
        return None
    return index[0].scale(g[i].attr("step")).shift(g[i].attr("start"))


def _row_term(e: Expr, xblock: int) -> tuple[Expr, int] | None:
    """``k * (xindex % M) + c`` with XBLOCK dividing M (no wrap inside a program, so the value
    grows with the row): that expression at the program's first row, and ``k``."""
    if len(e.terms) != 1 or e.vars != frozenset({"xindex"}):
        return None
    ((t, k),) = e.terms
    if t.var != "xindex" or t.div != 1 or k <= 0 or (t.mod is not None and t.mod % xblock):
        return None
    return Expr(((replace(t, var="xoffset", vars=frozenset({"xoffset"})), k),), e.const), k


def _col_offset(e: Expr) -> int | None:
    """``rindex + c``: c."""
    if len(e.terms) != 1 or e.vars != frozenset({"rindex"}):
        return None
    ((t, k),) = e.terms
    if t.var != "rindex" or t.div != 1 or k != 1 or t.mod is not None:
        return None
    return e.const


def only_through(graph: Graph, info: GroupInfo, mm: int, w: int) -> bool:
    """Every path from ``mm`` to a stored node or a reduction of the group passes through
    ``w``."""
    members, stored = set(info.nodes), set(info.stored)
    seen, todo = set(), [mm]
    while todo:
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        if i in stored or (i != mm and graph[i].kind == "reduction"):
            return False
        todo += [u for u in graph.compute_users[i] if u in members and u != w]
    return True
