"""Sums that ride their maximum's loop: one pass over a row where a looped kernel would walk it
twice (the maximum's loop, then the sum's), found from the group's IR and rendered here for
the loop kernels (``emitter.py``) and the row GEMM (``gemm/row.py``).

Two forms, each ``sum(g(f, amax(f)))`` over the rows of a reduction group:

- **softmax**: ``sum(exp(f - amax(f)))``. The running row maximum ``M`` and the running sum of
  ``exp(f - M)``, rescaled by ``exp(M - M')`` when a tile raises the maximum to ``M'`` (the
  online softmax).
- **shifted sum** (the moment mean of ``capture/decompositions.py``: ``sum(f * c - h(amax(f))
  * c)``, ``h(v) = 0 where |v| is inf else v``, ``c = 2^-k``): linear in the shift, so when a
  tile raises the maximum the terms summed so far move by ``h(M) * c - h(M') * c`` each::

      S' = S + n_before * (h(M) * c - h(M') * c) + sum over the tile of (f * c - h(M') * c)

  ``n_before`` the row's elements before the tile (``roffset``: every earlier tile is whole).

  On a constant row every term is 0 and the shift never moves: the sum is exactly 0, as the
  two-loop sum's is, so the row's variance stays exactly 0. The terms are finite wherever the
  two-loop sum's are (each ``|h(M) * c - h(M') * c| <= 2 max * c``, ``n c <= 1 / 2``).
  GroupNorm and BatchNorm statistics over rows longer than a block (L2_52's and L2_60's
  convolution outputs) then walk each row twice (this loop, the squares' loop), not three
  times.

The maximum is NaN-exact, and a row holding a NaN sums to NaN, in one of two forms
(:func:`lanes_keep_max`). On a GPU the running maximum is the row's own accumulator, each tile's
maximum a NaN-propagating reduction (one per tile). In Triton's interpreter, where a custom
combine runs element by element in Python (a 1x16x352x352 fp16 var: 72.8 s against 1.95 s),
the tiles' shift takes ``tl.max`` (a NaN skipped) and the maximum the graph reads is kept per
lane beside it and reduced once; on the H100 that second accumulator, an elementwise maximum
and select per element, took the LM cross-entropy (8 x 1024 x 32000 bf16) from 198 to 233-243
us, so it stays the interpreter's.
"""

from __future__ import annotations

from collections.abc import Callable

from autofuse.interpreter import interpreting
from autofuse.ir.graph import FLOAT_DTYPES, Graph, scalar_const

_INF = float("inf")


def lanes_keep_max() -> bool:
    """Whether an online pair's maximum is kept per lane beside the row's running maximum (the
    interpreter's form, see the module), rather than being that running maximum (a GPU's)."""
    return interpreting()


def online_partner(graph: Graph, s: int, members: frozenset[int], domain, keep) -> int | None:
    """The ``amax`` node whose loop sum ``s`` can ride (either form), or None."""
    node = graph[s]
    if node.op != "sum" or node.dtype not in FLOAT_DTYPES:
        return None
    d = node.inputs[0]  # direct inputs only: a view between them reads other rows
    if d not in members or graph[d].shape != domain:
        return None
    if graph[d].op == "exp":
        d = graph[d].inputs[0]
        if d not in members or graph[d].op != "sub" or graph[d].shape != domain:
            return None
        f, mv = graph[d].inputs
    elif (parts := _shifted_parts(graph, s)) is not None:
        f, mv, _ = parts
    else:
        return None
    m = graph.base_of(mv)
    if m in members and graph[m].op == "amax" and graph[m].inputs[0] == f:
        if graph[mv].shape == keep:
            return m
    return None


def shift_scale(graph: Graph, s: int) -> float | None:
    """``c`` where sum ``s`` is a shifted sum ``sum(f * c - h(mv) * c)`` (``h`` as above, ``mv``
    a row value), else None (a softmax sum, or any other)."""
    parts = _shifted_parts(graph, s)
    return None if parts is None else parts[2]


def _shifted_parts(graph: Graph, s: int) -> tuple[int, int, float] | None:
    """``(f, mv, c)`` where sum ``s`` is ``sum(f * c - h(mv) * c)``, else None."""
    d = graph[s].inputs[0]
    if graph[d].op != "sub":
        return None
    a, h = graph[d].inputs
    fc, wc = _scaled(graph, a), _scaled(graph, h)
    if fc is None or wc is None or fc[1] != wc[1]:
        return None
    mv = _shift_max(graph, wc[0])
    return None if mv is None else (fc[0], mv, fc[1])


def _scaled(graph: Graph, i: int) -> tuple[int, float] | None:
    """``(x, c)`` where node ``i`` is ``x * c`` for a scalar constant ``c``."""
    node = graph[i]
    if node.op != "mul":
        return None
    for x, k in (node.inputs, node.inputs[::-1]):
        c = scalar_const(graph[k])
        if c is not None:
            return x, c
    return None


def _shift_max(graph: Graph, w: int) -> int | None:
    """``mv`` where node ``w`` is ``where(|mv| == inf, 0, mv)``, else None."""
    if graph[w].op != "where":
        return None
    cond, zero, mv = graph[w].inputs
    if scalar_const(graph[zero]) != 0.0 or graph[cond].op != "eq":
        return None
    ab, inf = graph[cond].inputs
    if graph[ab].op != "abs" or graph[ab].inputs[0] != mv or scalar_const(graph[inf]) != _INF:
        return None
    return mv


def shifted(m: str, c: float) -> str:
    """``h(m) * c`` rendered: a running maximum's shift."""
    return f'tl.where(tl.abs({m}) == float("inf"), 0.0, {m}) * {c!r}'


def fold_tile(
    tmp: Callable[[str, str], str],
    accs: tuple[str, str, str],
    c: float | None,
    x: str,
    tile_sum: Callable[[str], str],
) -> list[str]:
    """The lines that fold one tile into the running sum, then move the maximum: ``accs`` the
    running sum, the running maximum and the tile's new maximum; ``x`` a tile element (its
    code); ``tile_sum(term)`` the tile's sum of ``term``; ``tmp(expr, comment)`` names a value
    (the shifts, emitted before the returned lines). ``c`` None: the softmax form (``x`` then
    the element's ``exp(x - m_new)``); else the shifted sum's scale."""
    s_acc, m_acc, m_new = accs
    if c is None:
        fold = (
            f'{s_acc} = tl.where({m_new} == float("-inf"), 0.0, '
            f"{s_acc} * tl.exp({m_acc} - {m_new}) + {tile_sum(x)})"
        )
    else:
        before = tmp(shifted(m_acc, c), "shift before the tile")
        after = tmp(shifted(m_new, c), "shift after it")
        fold = (
            f"{s_acc} = {s_acc} + roffset * ({before} - {after}) "
            f"+ {tile_sum(f'{x} * {c!r} - {after}')}"
        )
    return [fold, f"{m_acc} = {m_new}"]


def finished(s_acc: str, m: str, c: float | None) -> str:
    """The sum's value after the loop, ``m`` the row's NaN-exact maximum: a row holding a NaN
    sums to NaN (eager's shift is NaN), whatever maximum the tiles' shift skipped it for; the
    softmax form's all ``-inf`` row is NaN too, as eager's ``exp(-inf - -inf)``."""
    if c is None:
        return f'tl.where(({m} == float("-inf")) | ({m} != {m}), float("nan"), {s_acc})'
    return f'tl.where({m} != {m}, float("nan"), {s_acc})'
