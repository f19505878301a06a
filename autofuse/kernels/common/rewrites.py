"""Rewrites of single values the emitter applies while rendering (each gives a cheaper
expression with the same result, or None where it does not apply): a select whose condition is
known constant on the tile, ``exp(a - rowmax)`` in one expression, a division by a constant or
a row value as a multiply by its reciprocal. A mixin of
:class:`autofuse.kernels.common.emitter.Emitter`: the methods read its graph, values and scopes.
"""

from __future__ import annotations

import math

import torch

from autofuse.ir.indexing import Expr
from autofuse.kernels.common.render import Val, cast, compute_dtype, exp_minus, is_float
from autofuse.kernels.common.views import broadcast_index


def exact_enough_reciprocal(c: float, dtype: str) -> float | None:
    """``1 / c`` for a division by constant ``c`` in float ``dtype``, where a multiply by it
    stays within an ulp of eager's quotient: ``c`` as ``dtype`` holds it (eager divides by the
    scalar cast to the op's dtype) and its reciprocal are normal numbers of ``dtype``. None
    otherwise: a ``c`` subnormal in float32 (3e-39) is held with few bits, so ``1 / c`` is not
    the reciprocal of the divisor eager uses, or overflows (``x * inf`` where ``x / c`` is
    finite)."""
    fi = torch.finfo(getattr(torch, dtype))
    held = torch.tensor(c, dtype=getattr(torch, dtype)).item()
    if not math.isfinite(held) or not fi.tiny <= abs(held) <= fi.max:
        return None
    r = 1.0 / c
    return r if fi.tiny <= abs(r) <= fi.max else None


class ValueRewrites:
    """What the emitter renders in a cheaper form (mixed into ``Emitter``)."""

    def constant_where(self, node, index: tuple[Expr, ...]) -> Val | None:
        """A select whose condition is a literal here (a mask known on the whole tile): the
        operand it picks, in the select's dtype, when that one has the select's class."""

        def at(j: int) -> Val:
            return self.value(j, broadcast_index(self.g[j].shape, node.shape, index))

        cond = at(node.inputs[0])  # the branches only once it is known constant (a branch
        if not cond.literal or cond.code not in ("0", "1"):  # may be a guarded load)
            return None
        picked, other = node.inputs[1:] if cond.code == "1" else node.inputs[:0:-1]
        v = at(picked)
        if v.cls < 2 and v.cls < at(other).cls:  # the other one only when it may be wider
            return None
        cd = compute_dtype(node.dtype)
        if v.dtype == cd:
            return v
        return (
            Val(cast(v, cd), v.cls, cd, True)
            if v.literal
            else self.tmp(cast(v, cd), v.cls, cd, node.name)
        )

    def shifted_exp(self, node, index: tuple[Expr, ...]) -> tuple[str, int] | None:
        """``exp(a - b)`` with ``b`` one value per row (softmax's max), rendered by
        :func:`exp_minus` in one expression."""
        j = node.inputs[0] if node.op == "exp" else None
        if j is None or j not in self.members or self.g[j].op != "sub":
            return None
        cd = compute_dtype(node.dtype)
        if (
            not is_float(cd)
            or self.g[j].shape != node.shape
            or compute_dtype(self.g[j].dtype) != cd
        ):
            return None
        a, b = (
            self.value(k, broadcast_index(self.g[k].shape, node.shape, index))
            for k in self.g[j].inputs
        )
        if b.cls >= a.cls:
            return None
        return exp_minus(cast(a, cd), cast(b, cd)), a.cls

    def divide(self, node, args: list[Val]) -> str | None:
        """A float division by a constant or by a row value, as a multiply by its reciprocal
        (one division per row instead of per element; within an ulp of the quotient)."""
        cd = compute_dtype(node.dtype)
        if node.op != "div" or not is_float(cd):
            return None
        a, b = args
        if b.literal:
            try:
                c = float(b.code)
            except ValueError:
                return None
            r = exact_enough_reciprocal(c, cd)
            return None if r is None else f"{cast(a, cd)} * {r!r}"
        if b.cls >= a.cls:
            return None
        key = ("reciprocal", b.code)
        got = self.lookup(key)
        if got is None:
            got = self.row_reciprocal(cast(b, cd), b.cls, cd)
            self.scopes[-1].cache[key] = got
        r, scale = got
        return f"{cast(a, cd)} * {r.code} * {scale.code}"

    def row_reciprocal(self, b: str, cls: int, cd: str) -> tuple[Val, Val]:
        """``1 / (b * s)`` and ``s`` for a row divisor ``b``: ``a / b`` is ``a * r * s``. ``s``
        is 1 on every row whose ``|b|`` is 2^-64 or more (``a * r * 1.0`` is ``a * r``), 2^64
        below it: the reciprocal of a subnormal ``b`` overflows (``1 / 1e-39`` is inf in
        float32, giving inf and NaN where eager's quotients are finite), that of ``b * 2^64``
        does not, and the scalings by powers of two are exact."""
        scale = self.tmp(
            f"tl.where(tl.abs({b}) < {2.0**-64!r}, {2.0**64!r}, 1.0)", cls, cd, "reciprocal scale"
        )
        return self.tmp(f"1.0 / ({b} * {scale.code})", cls, cd, "reciprocal"), scale
