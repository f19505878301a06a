"""Which tiles an attention backward kernel may skip: those an index-expression mask hides.

The forward's mask (a select of a constant C, or an added ``where(cond, 0, C)`` with C at most
-2**127: ``attention_bounds.key_bound``) makes the softmax input C on the tiles it hides, so P
is ``exp(C - max) / sum`` there: exactly 0.0 when ``C - max < -200`` (exp underflows), for every
row whose max is a live score. When each gradient matmul's tile operand is zero wherever P is
(a product with P, a difference of such, a select of such and 0: the softmax backward and the
mask's backward; checked on the graph), a hidden tile adds nothing and the loops skip it. A row
the mask hides entirely (its max is C itself, or -inf, or NaN) is *within reach*: a query program
holding it walks every key; a key program walks the rows outside its live range with a guard
that visits only the row blocks within reach.

Limits ``col <= row + b`` / ``col >= row + b`` (causal, sliding windows) and row-independent ones
(``col <= b``) bound both loops; other slopes keep every tile.

When the limits are exact (the mask is just their conjunction), the tiles inside every limit for
all the tile's rows and keys are *whole*: the mask passes the scores on each of their elements,
so a key program can compute them without the mask (``kv_full`` splits its live loop in masked
edges and an unmasked middle, as the forward kernel does; config ``whole``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autofuse.ir.graph import Graph
from autofuse.kernels.attention.bounds import (
    ColumnLimit,
    key_bound,
    live_columns,
    whole_range_lines,
)
from autofuse.kernels.attention_bwd.analysis import recomputed_softmax
from autofuse.kernels.common.base import GroupInfo
from autofuse.kernels.common.memory import ancestors
from autofuse.kernels.common.render import literal
from autofuse.kernels.common.views import broadcast_index

_UNDERFLOW = -200.0  # exp(x) is 0.0 in fp32 below this


@dataclass(frozen=True)
class SkipPlan:
    """The mask's column limits, the softmax input's value ``const`` on the tiles it hides
    and the loaded row max ``amax`` (to tell the rows within reach of it)."""

    limits: tuple[ColumnLimit, ...]
    const: float
    amax: int
    t: int
    tk: int
    exact: bool = False  # the live elements are exactly those within every limit
    select: int | None = None  # the mask's node (a select, or the add of an additive mask)
    passed: int | None = None  # what it gives on a live element
    cond: int | None = None  # a select's condition, and its value on a live element
    cond_live: bool = False

    def reach(self, em, what: str) -> str:
        """A scalar: some valid row of the tile's rows is within reach of the constant."""
        g = em.g
        m = em.value(self.amax, broadcast_index(g[self.amax].shape, em.info.domain, em.full))
        c, m = literal(self.const, "float32"), m.code  # -inf as float("-inf")
        cond = f'(({c} - {m}) > {_UNDERFLOW}) | ({m} == float("-inf")) | ({m} != {m})'
        em.line(f"{what} = tl.max(tl.max((({cond}) & xmask).to(tl.int32), 1), 0) > 0  # rows "
                "the mask may hide entirely")  # fmt: skip
        return what

    def q_bounds(self, em) -> tuple[str, str]:
        """The keys a block of rows visits (all of them for a row within reach)."""
        bm, bn = em.blocks()
        em.line("r0 = start_q  # the program's rows")
        em.line(f"r1 = tl.minimum(r0 + {bm} - 1, {em.T1})")
        hi, lo = live_columns(self.limits, "r0", "r1")
        em.line(f"hi_q = {_clamp(hi, em.TK, True)}  # live keys")
        em.line(f"lo_q = {_clamp(lo, 'hi_q')}")
        self.reach(em, "reach")
        em.line(f"lo_q = tl.where(reach, 0, (lo_q // {bn}) * {bn})")
        em.line(f"hi_q = tl.where(reach, {em.TK}, hi_q)")
        return "lo_q", "hi_q"

    def kv_bounds(self, em) -> tuple[str, str]:
        """The rows a block of keys is live for (the others: the guarded passes)."""
        em.line("c0 = start_k  # the program's keys")
        em.line(f"c1 = tl.minimum(c0 + BLOCK_N - 1, {em.TK1})")
        lo = hi = None
        for lim in self.limits:
            if lim.upper and lim.a == 1:  # col <= row + b: rows >= c0 - b
                cur = f"c0 - {lim.b}"
            elif lim.upper:  # col <= b: no row when c0 > b
                cur = f"tl.where(c0 > {lim.b}, {em.T}, 0)"
            elif lim.a == 1:  # col >= row + b: rows <= c1 - b
                cur = f"c1 - {lim.b} + 1"
            else:  # col >= b: no row when c1 < b
                cur = f"tl.where(c1 < {lim.b}, 0, {em.T})"
            if lim.upper:
                lo = cur if lo is None else f"tl.maximum({lo}, {cur})"
            else:
                hi = cur if hi is None else f"tl.minimum({hi}, {cur})"
        em.line(f"hi_k = {_clamp(hi, em.T, True)}  # rows these keys are live for")
        em.line(f"lo_k = {_clamp(lo, 'hi_k')}")
        em.line("lo_k = (lo_k // BLOCK_M) * BLOCK_M")
        em.line(
            "hi_k = lo_k + ((hi_k - lo_k + BLOCK_M - 1) // BLOCK_M) * BLOCK_M  # whole row blocks"
        )
        return "lo_k", "hi_k"

    def kv_full(self, em, lo: str, hi: str) -> tuple[str, str]:
        """The whole row blocks (within ``lo..hi``) live for every key ``c0..c1`` of a key
        program: ``flo_k``, ``fhi_k``."""
        flo = fhi = None
        for lim in self.limits:
            if lim.upper and lim.a == 1:  # col <= row + b for every key: rows >= c1 - b
                cur = f"c1 - {lim.b}"
            elif lim.upper:  # col <= b: every row when c1 <= b, else none
                cur = f"tl.where(c1 <= {lim.b}, 0, {em.T})"
            elif lim.a == 1:  # col >= row + b for every key: rows <= c0 - b
                cur = f"c0 - {lim.b} + 1"
            else:  # col >= b: every row when c0 >= b, else none
                cur = f"tl.where(c0 >= {lim.b}, {em.T}, 0)"
            if lim.upper:
                flo = cur if flo is None else f"tl.maximum({flo}, {cur})"
            else:
                fhi = cur if fhi is None else f"tl.minimum({fhi}, {cur})"
        whole_range_lines(em.line, ("flo_k", "fhi_k"), flo, fhi, lo, hi, "BLOCK_M")
        return "flo_k", "fhi_k"

    def work(self, *tiles: tuple[int, int]) -> float:
        """The fraction of the tiles the live loops visit, over the kinds of programs whose
        (rows, keys) tiles are given."""
        visited = total = 0
        for bm, bn in tiles:
            v, t = self._live(bm, bn)
            visited, total = visited + v, total + t
        return visited / max(total, 1)

    def _live(self, bm: int, bn: int) -> tuple[int, int]:
        """(live tiles, tiles) of the (rows, keys) grid in bm x bn tiles."""
        nm, nn = -(-self.t // bm), -(-self.tk // bn)
        visited = total = 0
        for pm in range(nm):
            r0, r1 = pm * bm, min(pm * bm + bm - 1, self.t - 1)
            for pn in range(nn):
                c0, c1 = pn * bn, min(pn * bn + bn - 1, self.tk - 1)
                live = all(
                    (c0 <= max(lim.a * r0 + lim.b, lim.a * r1 + lim.b))
                    if lim.upper
                    else (c1 >= min(lim.a * r0 + lim.b, lim.a * r1 + lim.b))
                    for lim in self.limits
                )
                visited += live
                total += 1
        return visited, total


def _clamp(expr: str | None, top: str, extent: bool = False) -> str:
    """``expr`` within ``[0, top]``; no expression: ``top`` when it is the ``extent``, else 0."""
    if expr is None:
        return top if extent else "0"
    return f"tl.minimum(tl.maximum({expr}, 0), {top})"


def skip_plan(graph: Graph, info: GroupInfo, parts, full) -> SkipPlan | None:
    """The skipping plan of an attention backward group, or None (every tile is visited)."""
    soft = _softmax(graph, info)
    if soft is None:
        return None
    exp, x, amax = soft
    mm = next((t for t in parts.tiles if t in ancestors(graph, x)), None)
    if mm is None:
        return None
    bound, limits, exact = key_bound(graph, dataclasses.replace(info, matmuls=(mm,)), full)
    if bound is None or any(lim.a not in (0, 1) for lim in limits):
        return None
    const = _const_at(graph, x, bound)
    if const is None:
        return None
    zero = _ZeroWithP(graph, frozenset(info.nodes), exp)
    if not all(zero(g.tile) for g in parts.grads):
        return None
    node = graph[bound.node]
    cond = cond_live = None
    if node.op == "where":  # a select: its condition is constant on a whole tile
        c, a, _ = node.inputs
        cond, cond_live = graph.base_of(c), a == bound.passed
    return SkipPlan(tuple(limits), const, amax, parts.t, parts.tk, exact, bound.node,
                    bound.passed, cond, bool(cond_live))  # fmt: skip


def _softmax(graph: Graph, info: GroupInfo) -> tuple[int, int, int] | None:
    """The group's ``exp(x - amax)`` with ``amax`` loaded (the saved row max): (exp, x, amax)."""
    members = frozenset(info.nodes)
    found = [e for e in info.nodes if recomputed_softmax(graph, members, e)]
    if len(found) != 1:
        return None
    sub = graph[graph.base_of(graph[found[0]].inputs[0])]
    x, m = (graph.base_of(j) for j in sub.inputs)
    return found[0], x, m


def _const_at(graph: Graph, x: int, bound) -> float | None:
    """The softmax input on the tiles the mask hides: the bound's constant carried to ``x``
    through casts (rounded as eager rounds it), or None when other ops lie between them."""
    import torch

    i = x
    while i != bound.node:
        node = graph[i]
        if node.op != "cast":
            return None
        i = graph.base_of(node.inputs[0])
    c = torch.tensor(float(bound.const), dtype=getattr(torch, graph[bound.node].dtype))
    return float(c.to(getattr(torch, graph[x].dtype)))


class _ZeroWithP:
    """Whether a member is 0.0 wherever ``exp`` (softmax's numerator) is: built from it by
    products, quotients, casts, sums and differences of such and selects of such and 0."""

    def __init__(self, graph: Graph, members: frozenset[int], exp: int) -> None:
        self.g, self.members, self.exp = graph, members, exp
        self.memo: dict[int, bool] = {}

    def __call__(self, i: int) -> bool:
        i = self.g.base_of(i)
        if i not in self.memo:
            self.memo[i] = False  # a DAG has no cycles: a guard all the same
            self.memo[i] = self._check(i)
        return self.memo[i]

    def _zero_const(self, i: int) -> bool:
        node = self.g[self.g.base_of(i)]
        return node.op == "const" and float(node.attr("value")) == 0.0

    def _check(self, i: int) -> bool:
        if i == self.exp:
            return True
        if i not in self.members:
            return False
        node = self.g[i]
        ins = node.inputs
        if node.op in ("cast", "neg", "copy"):
            return self(ins[0])
        if node.op == "mul":
            return self(ins[0]) or self(ins[1])
        if node.op == "div":
            return self(ins[0])
        if node.op in ("add", "sub"):
            return self(ins[0]) and self(ins[1])
        if node.op == "where":
            return all(self._zero_const(j) or self(j) for j in ins[1:])
        return False
