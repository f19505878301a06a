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

An additive mask (Hugging Face's ``scores + where(cond, 0.0, finfo.min)``, or ``where(cond, C,
0.0)``, or ``zeros.masked_fill(cond, C)``, through views) bounds the loop the same way when C
is -inf or at most -2**127 in the add's dtype (finfo.min of float32 or bfloat16): on a skipped
tile ``s + C`` rounds to C (exactly, for |s| < 2**103 ~ 1e31: beyond that eager's sum moves
off C and the guarded pass over the skipped keys, which adds C, would differ on a row the mask
hides entirely), and on a tile of live keys ``s + 0.0`` is s. A smaller C (float16's finfo.min,
-1e9) keeps the general path: every key tile.
"""

from __future__ import annotations

from dataclasses import dataclass

from autofuse.ir.graph import Graph
from autofuse.ir.indexing import Expr
from autofuse.kernels.common.base import GroupInfo
from autofuse.kernels.common.memory import ancestors
from autofuse.kernels.common.selects import constant_selects, only_through
from autofuse.kernels.common.views import broadcast_index, domain_index, view_source_index

_FLT_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class KeyBound:
    """The node whose condition bounds the key loop (a select of the scores, or their add of
    an index-expression mask): on a key tile of live keys only (when the limits are exact) it
    is its input ``passed``; on a skipped tile it is ``const`` (in its dtype, as eager
    rounds it), or in the log2 domain of a scale fold the fold's constant ``const_node``
    (a select's) or ``log2`` (an additive mask's C times log2 e, kept finite as the kernel
    keeps the added mask)."""

    node: int
    passed: int
    const: float
    const_node: int | None = None
    log2: float = 0.0

    def folded(self, fold) -> float:
        return fold.consts[self.const_node] if self.const_node is not None else self.log2


def scores_index(domain: tuple[int, ...]) -> tuple[Expr, ...]:
    """The forward kernel's index of a score: the batch and head dims over ``bh`` (one
    program's), its query row over ``xindex``, its key over ``rindex``."""
    return (
        *domain_index(domain[:-2], "bh"),
        Expr.dim("xindex", 1, domain[-2], True),
        Expr.dim("rindex", 1, domain[-1], True),
    )


def key_fraction(t: int, tk: int, limits: list[ColumnLimit], bm: int, bn: int) -> float:
    """The fraction of the (``bm`` rows, ``bn`` keys) tiles of a ``t`` x ``tk`` score matrix
    that the live key loop visits under ``limits``, over all programs."""
    programs, tiles = -(-t // bm), -(-tk // bn)
    if not limits:
        return 1.0
    visited = 0
    for pid in range(programs):
        r0, r1 = pid * bm, min(pid * bm + bm - 1, t - 1)
        lo, hi = 0, tk
        for lim in limits:
            ends = (lim.a * r0 + lim.b, lim.a * r1 + lim.b)
            if lim.upper:
                hi = min(hi, max(ends) + 1)
            else:
                lo = max(lo, min(ends))
        hi = min(max(hi, 0), tk)
        visited += -(-hi // bn) - min(max(lo, 0), hi) // bn
    return visited / (programs * tiles)


def key_bound(
    graph: Graph, info: GroupInfo, full
) -> tuple[KeyBound | None, list[ColumnLimit], bool]:
    """The first select, else the first additive mask, whose index-expression condition bounds
    the key loop, with its limits and whether they are exact (see ``live_limits``)."""
    for sel in constant_selects(graph, info):
        limits, exact = live_limits(graph, sel.node, sel.cond, sel.const_when, full)
        if limits:
            passed = graph[sel.node].inputs[2 if sel.const_when else 1]
            return (
                KeyBound(sel.node, passed, graph[sel.const].attr("value"), sel.const),
                limits,
                exact,
            )
    for bound, where, cond, const_when, index in _additive_masks(graph, info, full):
        limits, exact = live_limits(graph, where, cond, const_when, index)
        if limits:
            return bound, limits, exact
    return None, [], False


def _additive_masks(graph: Graph, info: GroupInfo, full):
    """``add(x, where(cond, 0, C))`` of the group through which every use of the first matmul
    passes, ``x`` reading the matmul and the mask not, C large enough (see above): each as its
    bound, the where, its condition, the value of cond giving C, and the where's index."""
    import torch  # C as eager rounds it on the way to the add

    mm = info.matmuls[0]
    for a in info.nodes:
        node = graph[a]
        if node.op != "add" or node.shape != info.domain or len(node.inputs) != 2:
            continue
        for m, x in (node.inputs, node.inputs[::-1]):
            if mm in ancestors(graph, m) | {graph.base_of(m)}:
                continue
            if mm not in ancestors(graph, x) | {graph.base_of(x)}:
                continue
            if not only_through(graph, info, mm, a):
                continue
            index, j = broadcast_index(graph[m].shape, node.shape, full), m
            while graph[j].kind == "view":
                index = view_source_index(graph, j, index)
                j = graph[j].inputs[0]
            if graph[j].op != "where":
                continue
            cond, t, f = graph[j].inputs
            vals = [graph[graph.base_of(k)].attr("value") if graph[graph.base_of(k)].op == "const"
                    else None for k in (t, f)]  # fmt: skip
            for const_when, (c, zero) in ((True, vals), (False, vals[::-1])):
                if c is None or zero != 0 or isinstance(c, bool):
                    continue
                v = torch.tensor(float(c), dtype=getattr(torch, graph[j].dtype))
                v = float(v.to(getattr(torch, node.dtype)))
                if not (v == float("-inf") or v <= -(2.0**127)):
                    continue
                log2 = max(v * 1.4426950408889634, -_FLT_MAX) if v > float("-inf") else v
                yield KeyBound(a, x, v, None, log2), j, cond, const_when, index
                break


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


def live_columns(limits, first: str, last: str) -> tuple[str | None, str | None]:
    """The columns some row ``first..last`` keeps live under every limit: (the end past the
    last one, the first one), each None where no limit bounds that side. Unclamped."""
    hi = lo = None
    for lim in limits:
        if lim.upper:
            cur = f"{lim.render(first, last)} + 1"
            hi = cur if hi is None else f"tl.minimum({hi}, {cur})"
        else:
            cur = lim.render(first, last)
            lo = cur if lo is None else f"tl.maximum({lo}, {cur})"
    return hi, lo


def whole_columns(limits, first: str, last: str) -> tuple[str | None, str | None]:
    """The columns every row ``first..last`` keeps live under every limit: (the first one,
    the end past the last one), each None where no limit bounds that side. Unclamped."""
    lo = hi = None
    for lim in limits:
        cur = lim.render(first, last, inner=True)
        if lim.upper:
            hi = f"{cur} + 1" if hi is None else f"tl.minimum({hi}, {cur} + 1)"
        else:
            lo = cur if lo is None else f"tl.maximum({lo}, {cur})"
    return lo, hi


def whole_range_lines(line, names, flo, fhi, lo: str, hi: str, step: str) -> None:
    """Emit (through ``line``) ``names``, the whole ``step`` tiles within ``lo..hi`` (``lo`` a
    multiple of ``step``) between the unrounded limits ``flo`` and ``fhi`` (None: ``lo`` /
    ``hi``): the tiles a loop runs without the mask."""
    a, b = names
    line(f"{a} = tl.minimum(tl.maximum({flo or lo}, {lo}), {hi})")
    line(f"{a} = (({a} + {step} - 1) // {step}) * {step}  # whole tiles only")
    line(f"{b} = tl.maximum(tl.minimum({fhi or hi}, {hi}), {a})")
    line(f"{b} = tl.maximum(({b} // {step}) * {step}, {a})")


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
