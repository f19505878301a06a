"""Values that select where to read their inputs: ``cat`` (a ``tl.where`` chain over the
index along its dim, each branch reading its input at the shifted index) and ``take`` /
``gather`` (an index tensor's value, computed in the kernel, becomes a term of the source's
index: ``tl.load(ptr + idx * stride + ...)``).

Every read such a value makes is guarded: a cat branch's loads are masked to the lanes that
branch selects, and an indirect read to the lanes whose index is in range, so no lane reads out
of bounds. An index out of range fails ``tl.device_assert`` (the kernel is built in debug mode;
the interpreter runs its asserts through ``autofuse.interpreter``) instead of reading anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autofuse.ir.graph import numel
from autofuse.ir.indexing import Expr, Term
from autofuse.kernels.common.guards import inactive
from autofuse.kernels.common.render import Val, cast, compute_dtype, literal
from autofuse.kernels.common.views import broadcast_index


def indexed_value(em: Any, i: int, index: tuple[Expr, ...]) -> Val:
    """Node ``i`` (an ``indexed`` op of the table) at ``index``, emitted by emitter ``em``."""
    return _RULES[em.g[i].op](em, i, index)


def guarded(em: Any, cond: str, cls: int, fn: Callable[[], Val]) -> Val:
    """``fn()`` with every load it emits also masked by ``cond`` (of value class ``cls``); the
    values it computes are not reused outside (a fresh cache scope)."""
    em.guards.append((cond, cls))
    em.scopes.append(type(em.scopes[-1])())
    try:
        return fn()
    finally:
        em.scopes.pop()
        em.guards.pop()


def _cat(em: Any, i: int, index: tuple[Expr, ...]) -> Val:
    g, node = em.g, em.g[i]
    d, cd = node.attr("dim"), compute_dtype(node.dtype)
    e = index[d]
    spans, lo = [], 0
    for j in node.inputs:
        hi = lo + g[j].shape[d]
        if hi > lo:
            spans.append((j, lo, hi))
        lo = hi
    if not spans:  # every input empty along dim: so is the output, no element is read
        return Val(literal(0, cd), 0, cd, True)
    if not e.terms:  # the index along dim is known: read that input alone (an indirect index
        # read once per program has no tile variable but is no constant)
        j, lo, _ = next(s for s in spans if s[1] <= e.const < s[2])
        return em.value(j, index[:d] + (e.shift(-lo),) + index[d + 1 :])
    code, ecls, size = f"({e.render()})", em.cls_of(e), node.shape[d]
    branches = []
    for j, lo, hi in spans:
        conds = ([f"({code} >= {lo})"] if lo > 0 else []) + (
            [f"({code} < {hi})"] if hi < size else []
        )
        sub = index[:d] + (e.shift(-lo),) + index[d + 1 :]
        v = guarded(em, " & ".join(conds), ecls, lambda j=j, sub=sub: em.value(j, sub))
        branches.append((f"({code} < {hi})", v))
    out = cast(branches[-1][1], cd)
    for cond, v in reversed(branches[:-1]):
        out = f"tl.where({cond}, {cast(v, cd)}, {out})"
    cls = max([ecls] + [v.cls for _, v in branches])
    return em.tmp(out, cls, cd, node.name)


def index_term(em: Any, src: int, d: int, idx: int, at: tuple[Expr, ...], wrap: bool, what: str):
    """Index tensor ``idx`` read at ``at`` as an index into dim ``d`` of ``src``: the int64
    value (negative ones counted from the end when ``wrap``), the in-range condition, and the
    index expression term. Every lane in use asserts the index is in range."""
    g = em.g
    n = g[src].shape[d]
    iv = em.value(idx, at)
    t = em.tmp(cast(iv, "int64"), iv.cls, "int64", f"index into {g[src].name}")
    if wrap:  # advanced indexing: a negative index counts from the end
        t = em.tmp(f"tl.where({t.code} < 0, {t.code} + {n}, {t.code})", t.cls, "int64")
    ok = f"(({t.code} >= 0) & ({t.code} < {n}))"
    mask = em.active_mask(t.cls)
    of = "" if what.endswith("writes") else f" of {g[src].name}"
    # the index tensor by its graph name (a candidate's subgraph renumbers its inputs)
    msg = f"index out of range in self: {what} dim {d} of size {n}{of} (index tensor {g[idx].name})"
    if numel(g[idx].shape) and numel(em.info.domain):  # else no lane reads: nothing to check
        em.line(f'tl.device_assert({ok}{f" | {inactive(mask)}" if mask else ""}, "{msg}")')
        em.checked = True
    vars_ = frozenset() if t.cls == 0 else {1: {"xindex"}, 2: {"xindex", "rindex"}}[t.cls]
    if not em.red:
        vars_ = frozenset(vars_) & {"xindex"}
    return t, ok, Expr(((Term(t.code, 1, None, n, frozenset(vars_)), 1),))


def index_layout(shape: tuple[int, ...], dims: tuple[int, ...], bshape: tuple[int, ...]):
    """Where advanced indexing puts the broadcast index shape ``bshape`` among the kept dims of
    ``shape``: at the first indexed dim when the indexed ``dims`` are adjacent, else in front
    (as torch does). Returns that position and the result's shape."""
    kept = tuple(s for j, s in enumerate(shape) if j not in dims)
    p = dims[0] if dims == tuple(range(dims[0], dims[0] + len(dims))) else 0
    return p, kept[:p] + tuple(bshape) + kept[p:]


def indexed_position(em: Any, src: int, dims, idxs, index, wrap: bool, what: str):
    """The index into ``src`` of the element advanced indexing ``src[..., idx0, idx1, ...]``
    (index tensors ``idxs`` at ``dims``, broadcast together) reads at result ``index``, and
    the in-range conditions of its indirect terms."""
    g = em.g
    bshape = broadcast_shapes(*(g[j].shape for j in idxs))
    p, _ = index_layout(g[src].shape, tuple(dims), bshape)
    at_b, rest = index[p : p + len(bshape)], iter(index[:p] + index[p + len(bshape) :])
    pos, oks, cls = [], [], 0
    for d in range(len(g[src].shape)):
        if d not in dims:
            pos.append(next(rest))
            continue
        j = idxs[list(dims).index(d)]
        t, ok, term = index_term(
            em, src, d, j, broadcast_index(g[j].shape, bshape, at_b), wrap, what
        )
        pos.append(term)
        oks.append(ok)
        cls = max(cls, t.cls)
    return tuple(pos), " & ".join(oks), cls


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    n = max((len(s) for s in shapes), default=0)
    out = [1] * n
    for s in shapes:
        for k, v in enumerate(s):
            j = n - len(s) + k
            out[j] = v if out[j] == 1 else out[j]
    return tuple(out)


def _take(em: Any, i: int, index: tuple[Expr, ...]) -> Val:
    """take: out[A, B, C] = src[A, idx[B], C] (several index tensors: src[A, i0[B], i1[B], C]);
    gather: out[I] = src[I with I[dim] = idx[I]]."""
    node = em.g[i]
    src, *idxs = node.inputs
    what = f"{node.name} reads"
    if node.op == "gather":
        d = node.attr("dim")
        dims = (d,)
        t, ok, term = index_term(em, src, d, idxs[0], index, False, what)
        sub, cls = index[:d] + (term,) + index[d + 1 :], t.cls
    else:
        dims = node.attr("dims") or (node.attr("dim"),)
        sub, ok, cls = indexed_position(em, src, dims, idxs, index, node.attr("wrap"), what)
    v = guarded(em, ok, cls, lambda: em.value(src, sub))
    cd = compute_dtype(node.dtype)
    if all(em.g[src].shape[d] == 1 for d in dims):
        # every index is 0 (else the range check fails): the value is the load's, a scalar
        # where that is (typed as a block, a comparison of it beside a block failed to build
        # in Triton's interpreter: ``x_bool | (scalar < scalar)``, fuzz seed 7 graph 1918)
        cls = v.cls
    return em.tmp(cast(v, cd), max(v.cls, cls), cd, node.name)


_RULES = {"cat": _cat, "take": _take, "gather": _take}
