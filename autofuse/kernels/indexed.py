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

from autofuse.ir.indexing import Expr, Term
from autofuse.kernels.render import Val, cast, compute_dtype


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
    if not e.vars:  # the index along dim is known: read that input alone
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


def _take(em: Any, i: int, index: tuple[Expr, ...]) -> Val:
    """take: out[A, B, C] = src[A, idx[B], C]; gather: out[I] = src[I with I[dim] = idx[I]]."""
    g, node = em.g, em.g[i]
    src, idx = node.inputs
    d = node.attr("dim")
    n = g[src].shape[d]
    if node.op == "gather":
        at, before, after = index, index[:d], index[d + 1 :]
    else:
        k = len(g[idx].shape)
        at, before, after = index[d : d + k], index[:d], index[d + k :]
    iv = em.value(idx, at)
    t = em.tmp(cast(iv, "int64"), iv.cls, "int64", f"index into {g[src].name}")
    if node.attr("wrap"):  # advanced indexing: a negative index counts from the end
        t = em.tmp(f"tl.where({t.code} < 0, {t.code} + {n}, {t.code})", t.cls, "int64")
    ok = f"(({t.code} >= 0) & ({t.code} < {n}))"
    mask = em.active_mask(t.cls)
    msg = f"index out of range in self: {node.name} reads dim {d} of size {n} of {g[src].name}"
    em.line(f'tl.device_assert({ok}{f" | ~({mask})" if mask else ""}, "{msg}")')
    em.checked = True
    vars_ = frozenset() if t.cls == 0 else {1: {"xindex"}, 2: {"xindex", "rindex"}}[t.cls]
    if not em.red:
        vars_ = frozenset(vars_) & {"xindex"}
    term = Expr(((Term(t.code, 1, None, n, frozenset(vars_)), 1),))
    sub = before + (term,) + after
    v = guarded(em, ok, t.cls, lambda: em.value(src, sub))
    cd = compute_dtype(node.dtype)
    return em.tmp(cast(v, cd), max(v.cls, t.cls), cd, node.name)


_RULES = {"cat": _cat, "take": _take, "gather": _take}
