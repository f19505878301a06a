"""Symbolic index expressions: how a kernel turns its loop variables into memory offsets.

An :class:`Expr` is ``const + sum(coef * ((var // div) % mod))``. View ops (permute, expand,
reshape, slice, unsqueeze) map the index of their output to the index of their input, so a chain
of views becomes index arithmetic inside the kernel instead of copies. The simplifier merges the
terms that a reshape splits and joins again, so a contiguous access renders as plain ``xindex``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Term:
    """``(var // div) % mod`` taking ``size`` values; ``mod=None`` means no modulo is needed."""

    var: str
    div: int
    mod: int | None
    size: int | None  # number of distinct values (exclusive bound), None if unknown
    vars: frozenset[str]

    def render(self) -> str:
        s = self.var
        if self.div != 1:
            s = f"({s} // {self.div})"
        if self.mod is not None:
            s = f"({s} % {self.mod})"
        return s


@dataclass(frozen=True)
class Expr:
    terms: tuple[tuple[Term, int], ...] = ()  # (term, coefficient), normalized
    const: int = 0

    # -- construction ------------------------------------------------------------------------
    @staticmethod
    def constant(c: int) -> Expr:
        return Expr((), c)

    @staticmethod
    def dim(var: str, div: int, size: int, outermost: bool) -> Expr:
        """The index of one dimension of ``size`` elements decoded from a flat ``var``."""
        if size == 1:
            return Expr.constant(0)
        t = Term(var, div, None if outermost else size, size, frozenset({var}))
        return Expr(((t, 1),))

    # -- arithmetic --------------------------------------------------------------------------
    def __add__(self, other: Expr) -> Expr:
        return _normalize(self.terms + other.terms, self.const + other.const)

    def scale(self, c: int) -> Expr:
        if c == 0:
            return Expr.constant(0)
        return _normalize(tuple((t, k * c) for t, k in self.terms), self.const * c)

    def shift(self, c: int) -> Expr:
        return Expr(self.terms, self.const + c)

    def lane_step(self, var: str) -> int:
        """How far the offset moves when ``var`` moves by one inside a run of its lowest digit
        (the coefficients of the undivided terms of ``var``): 1 for a contiguous read, 0 for a
        broadcast one, 2 for every other element (a 2-wide pooling window's reads)."""
        return sum(k for t, k in self.terms if t.var == var and t.div == 1)

    @property
    def vars(self) -> frozenset[str]:
        out: frozenset[str] = frozenset()
        for t, _ in self.terms:
            out |= t.vars
        return out

    def max_value(self) -> int | None:
        total = self.const
        for t, k in self.terms:
            if t.size is None or k < 0:
                return None
            total += k * (t.size - 1)
        return total

    def floordiv_mod(self, d: int, m: int | None) -> Expr:
        """``(self // d) % m`` for a non-negative expression (``m=None``: no modulo)."""
        if not self.terms:
            v = self.const // d
            return Expr.constant(v if m is None else v % m)
        q = self._floordiv(d)
        if q is None:
            return _opaque(self, d, m)
        return q if m is None else q._mod(m)

    def _floordiv(self, d: int) -> Expr | None:
        if d == 1:
            return self
        if len(self.terms) == 1 and self.const == 0:
            ((t, k),) = self.terms
            if k == 1 and t.mod is None and t.size is not None:
                return Expr(((Term(t.var, t.div * d, None, -(-t.size // d), t.vars), 1),))
            if k == 1 and t.mod is not None and t.mod % d == 0:
                nt = Term(t.var, t.div * d, t.mod // d, t.mod // d, t.vars)
                return Expr(((nt, 1),))
        split = self._split_mixed_radix(d)
        if split is not None:  # (k*T + low) // d == T // (d / k) when 0 <= low < k
            (t, k), _low = split
            return Expr(((t, 1),)).floordiv_mod(d // k, None)
        high = [(t, k) for t, k in self.terms if k % d == 0]
        low = Expr(tuple((t, k) for t, k in self.terms if k % d != 0), self.const)
        lmax = low.max_value()
        if lmax is not None and 0 <= lmax < d and low.const >= 0:
            return _normalize(tuple((t, k // d) for t, k in high), 0)
        if lmax is not None and low.terms and low.const < 0:
            # a negative constant (a padded or shifted index: negative on the lanes the pad's
            # mask leaves out): c == c % d + d * (c // d), and the rest is non-negative
            rest = self.shift(-self.const + self.const % d)._floordiv(d)
            return None if rest is None else rest.shift(self.const // d)
        if lmax is not None and low.const % d == 0 and not low.terms:
            return _normalize(tuple((t, k // d) for t, k in high), low.const // d)
        if high and low.max_value() is not None and low.terms and low.const >= 0:
            # (d*H + L) // d == H + L // d for L >= 0 (bounded terms, positive coefficients,
            # no negative constant: Triton's // truncates, so a negative L would differ)
            rest = low._floordiv(d)
            if rest is not None:
                return _normalize(tuple((t, k // d) for t, k in high), 0) + rest
        return None

    def _split_mixed_radix(self, d: int):
        """A term k*T with k | d whose companions stay below k: ((T, k), rest)."""
        for n, (t, k) in enumerate(self.terms):
            if k <= 1 or d % k or self.const < 0:
                continue
            rest = Expr(self.terms[:n] + self.terms[n + 1 :], self.const)
            mx = rest.max_value()
            if mx is not None and mx < k:
                return (t, k), rest
        return None

    def _mod(self, m: int) -> Expr:
        split = self._split_mixed_radix(m)
        if split is not None:  # (k*T + low) % m == k*(T % (m / k)) + low when 0 <= low < k
            (t, k), low = split
            return Expr(((t, 1),)).floordiv_mod(1, m // k).scale(k) + low
        kept = tuple((t, k) for t, k in self.terms if k % m != 0)
        e = Expr(kept, self.const % m) if kept != self.terms or self.const >= m else self
        mx = e.max_value()
        if mx is not None and mx < m:
            return e
        if len(e.terms) == 1 and e.const == 0:
            ((t, k),) = e.terms
            if k == 1 and t.size is not None:
                if t.mod is None or t.mod % m == 0:
                    return Expr(((Term(t.var, t.div, m, min(m, t.size), t.vars), 1),))
        return _opaque(e, 1, m)

    # -- output ------------------------------------------------------------------------------
    def render(self) -> str:
        parts = []
        for t, k in self.terms:
            r = t.render()
            parts.append(r if k == 1 else f"{k} * {r}")
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)

    def __str__(self) -> str:
        return self.render()


def _opaque(e: Expr, d: int, m: int | None) -> Expr:
    mx = e.max_value()
    size = m if m is not None else (None if mx is None else mx // d + 1)
    t = Term(f"({e.render()})", d, m, size, e.vars)
    return Expr(((t, 1),))


def _normalize(terms: tuple[tuple[Term, int], ...], const: int) -> Expr:
    acc: dict[Term, int] = {}
    for t, k in terms:
        acc[t] = acc.get(t, 0) + k
    items = [(t, k) for t, k in acc.items() if k != 0]
    changed = True
    while changed:
        changed = False
        items.sort(key=lambda tk: (tk[0].var, tk[0].div))
        for i, (t1, k1) in enumerate(items):
            for j, (t2, k2) in enumerate(items):
                if i == j or t1.var != t2.var or t1.mod is None or t1.size != t1.mod:
                    continue
                if t2.div == t1.div * t1.mod and k2 == k1 * t1.mod:
                    size = None if t2.size is None else t1.mod * t2.size
                    mod = None if t2.mod is None else t1.mod * t2.mod
                    merged = Term(t1.var, t1.div, mod, size, t1.vars | t2.vars)
                    items = [x for n, x in enumerate(items) if n not in (i, j)] + [(merged, k1)]
                    changed = True
                    break
            if changed:
                break
    items.sort(key=lambda tk: (-tk[1], tk[0].var, tk[0].div))
    return Expr(tuple(items), const)


def linearize(index: tuple[Expr, ...], strides: tuple[int, ...], shape: tuple[int, ...]) -> Expr:
    """The memory offset of ``index`` into a tensor with the given strides."""
    out = Expr.constant(0)
    for e, st, sz in zip(index, strides, shape):
        if sz != 1:
            out = out + e.scale(st)
    return out
