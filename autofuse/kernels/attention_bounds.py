"""Which key columns an index-expression mask leaves live: the loop bounds of the attention
kernel.

A ``where(cond, C, scores)`` whose ``cond`` is computed from aranges over the rows and columns
(``ones(T, T).tril()``, ``i[:, None] >= j[None, :]``, a sliding window ``(i - j) < W``) is read
as a boolean formula over affine forms ``a * row + b * col + c``. The live region (where the
scores pass) is then, as far as it is a conjunction, a set of bounds ``col <= a * row + b`` and
``col >= a * row + b``: the key tiles outside them hold only C and the kernel skips them. Parts
of the formula it cannot read (a mask tensor, an ``or``) are dropped from the conjunction, which
only widens the live region: a skipped tile is always a constant one. When nothing was dropped
the limits are exact, and the tiles inside every limit for all the program's rows need no mask.
"""

from __future__ import annotations

from dataclasses import dataclass

from autofuse.ir.graph import Graph
from autofuse.ir.indexing import Expr
from autofuse.kernels.views import broadcast_index, view_source_index


@dataclass(frozen=True)
class Lin:
    """``row * r + col * c + k``."""

    r: int
    c: int
    k: int

    def __add__(self, o: Lin) -> Lin:
        return Lin(self.r + o.r, self.c + o.c, self.k + o.k)

    def scale(self, s: int) -> Lin:
        return Lin(self.r * s, self.c * s, self.k * s)


@dataclass(frozen=True)
class ColumnLimit:
    """``col <= a * row + b`` (``upper``) or ``col >= a * row + b`` for every live element."""

    upper: bool
    a: int
    b: int

    def render(self, first: str, last: str, inner: bool = False) -> str:
        """The loosest limit over the program's rows ``first..last`` (affine: taken at an
        end), or with ``inner`` the tightest (the columns within it for every row)."""
        lo, hi = f"{self.a} * {first} + {self.b}", f"{self.a} * {last} + {self.b}"
        return f"tl.maximum({lo}, {hi})" if self.upper != inner else f"tl.minimum({lo}, {hi})"


_CMP = ("lt", "le", "gt", "ge")
_NOT = {"lt": "ge", "ge": "lt", "gt": "le", "le": "gt"}
_AND = ("logical_and", "bitwise_and")
_OR = ("logical_or", "bitwise_or")
_NEG = ("logical_not", "bitwise_not")
UNKNOWN = ("unknown",)


def live_limits(
    graph: Graph, where: int, cond: int, const_when: bool, full
) -> tuple[list[ColumnLimit], bool]:
    """The column limits of the elements where ``where`` passes its non-constant operand
    (``cond`` is ``not const_when``), and whether they are exact (the live elements are those
    within every limit: no part of the condition was dropped). ``full`` is the domain index
    (rows ``xindex``, columns ``rindex``)."""
    index = broadcast_index(graph[cond].shape, graph[where].shape, full)
    f = _formula(graph, cond, index)
    if const_when:
        f = ("not", f)
    atoms, exact = _conjuncts(_nnf(f))
    out = [lim for lim in (_limit(*a) for a in atoms) if lim is not None]
    return out, exact and len(out) == len(atoms)


def _formula(g: Graph, i: int, index) -> tuple:
    while g[i].kind == "view":
        index = view_source_index(g, i, index)
        i = g[i].inputs[0]
    node = g[i]
    if node.op == "const" and node.dtype == "bool":
        return ("const", bool(node.attr("value")))
    if node.dtype != "bool":
        return UNKNOWN
    subs = [_sub_index(g, j, node.shape, index) for j in node.inputs]
    if node.op in _CMP:
        a, b = (_affine(g, j, ix) for j, ix in zip(node.inputs, subs))
        if a is None or b is None:
            return UNKNOWN
        return ("atom", a + b.scale(-1), node.op)  # a - b op 0
    if node.op in _AND + _OR:
        parts = [_formula(g, j, ix) for j, ix in zip(node.inputs, subs)]
        return ("and" if node.op in _AND else "or", *parts)
    if node.op in _NEG:
        return ("not", _formula(g, node.inputs[0], subs[0]))
    return UNKNOWN


def _sub_index(g: Graph, j: int, shape, index):
    return broadcast_index(g[j].shape, shape, index)


def _affine(g: Graph, i: int, index) -> Lin | None:
    while g[i].kind == "view":
        index = view_source_index(g, i, index)
        i = g[i].inputs[0]
    node = g[i]
    if node.op == "const":
        v = node.attr("value")
        return Lin(0, 0, int(v)) if isinstance(v, (int, bool)) else None
    if node.op == "iota":
        return _from_expr(index[0].scale(node.attr("step")).shift(node.attr("start")))
    if node.op in ("add", "sub", "mul", "neg"):
        subs = [_sub_index(g, j, node.shape, index) for j in node.inputs]
        args = [_affine(g, j, ix) for j, ix in zip(node.inputs, subs)]
        if None in args:
            return None
        if node.op == "neg":
            return args[0].scale(-1)
        if node.op == "add":
            return args[0] + args[1]
        if node.op == "sub":
            return args[0] + args[1].scale(-1)
        a, b = args
        if a.r == a.c == 0:
            return b.scale(a.k)
        if b.r == b.c == 0:
            return a.scale(b.k)
    return None


def _from_expr(e: Expr) -> Lin | None:
    r = c = 0
    for t, k in e.terms:
        if t.div != 1 or t.mod is not None or t.var not in ("xindex", "rindex"):
            return None
        if t.var == "xindex":
            r += k
        else:
            c += k
    return Lin(r, c, e.const)


def _nnf(f: tuple) -> tuple:
    """Negations pushed down to the atoms (De Morgan)."""
    if f[0] != "not":
        if f[0] in ("and", "or"):
            return (f[0], *(_nnf(p) for p in f[1:]))
        return f
    g = f[1]
    if g[0] == "not":
        return _nnf(g[1])
    if g[0] == "const":
        return ("const", not g[1])
    if g[0] == "atom":
        return ("atom", g[1], _NOT[g[2]])
    if g[0] in ("and", "or"):
        return ("or" if g[0] == "and" else "and", *(_nnf(("not", p)) for p in g[1:]))
    return UNKNOWN


def _conjuncts(f: tuple) -> tuple[list[tuple[Lin, str]], bool]:
    """The atoms every live element satisfies (an ``or`` or an unknown part: none), and
    whether the formula is exactly their conjunction."""
    if f[0] == "and":
        parts = [_conjuncts(p) for p in f[1:]]
        return [a for atoms, _ in parts for a in atoms], all(ok for _, ok in parts)
    if f[0] == "atom":
        return [(f[1], f[2])], True
    return [], f == ("const", True)


def _limit(lin: Lin, op: str) -> ColumnLimit | None:
    """``lin op 0`` as a limit on the column (its coefficient must be +-1)."""
    if lin.c not in (1, -1):
        return None
    if lin.c == -1:  # -col + rest op 0  <=>  col flip(op) rest
        lin, op = lin.scale(-1), {"lt": "gt", "gt": "lt", "le": "ge", "ge": "le"}[op]
    a, b = -lin.r, -lin.k  # col op a * row + b
    if op == "lt":
        return ColumnLimit(True, a, b - 1)
    if op == "le":
        return ColumnLimit(True, a, b)
    if op == "gt":
        return ColumnLimit(False, a, b + 1)
    return ColumnLimit(False, a, b)
