"""Op forms, part four: order and position. sort / argsort (stable where indices are kept, so
ties order alike) / msort / topk (values), aminmax, min / max (values and first indices) /
kthvalue / median along a dim, flip / roll (of flattened values too), tril / triu, and the
compositions: a reduction with indices between two flips or rolls, a flip of a flattened
softmax (of an empty tensor too).
"""

from __future__ import annotations

import random
from typing import Any

import torch

from experiments.fuzz.forms_basic import Draw, Form, is_float, pick_dim, pick_dims


def ordered(b: Any) -> str | None:
    """A value of rank >= 1 that is not bool (sort and topk take numbers)."""
    return b.pick(lambda t: t.dim() >= 1 and t.dtype != torch.bool)


def draw_sort(rng: random.Random, b: Any) -> Draw:
    x = ordered(b)
    if x is None:
        return None
    t = b.t(x)
    d = pick_dim(rng, t.dim())
    n = t.shape[d]
    desc = rng.random() < 0.5
    r = rng.random()
    if r < 0.3:
        tail = rng.choice((".values", ".indices", "[0]"))
        return f"torch.sort({{0}}, dim={d}, descending={desc}, stable=True){tail}", [x]
    if r < 0.45:
        return f"torch.argsort({{0}}, dim={d}, descending={desc}, stable=True)", [x]
    if r < 0.6:
        return "torch.msort({0})", [x]
    k = rng.choice(sorted({0, 1, min(2, n), n}))
    largest = rng.random() < 0.7
    return f"torch.topk({{0}}, {k}, dim={d}, largest={largest}).values", [x]


def extreme_expr(rng: random.Random, t: torch.Tensor, d: int) -> str:
    """A reduction along ``d`` of ``{0}`` that keeps a value per row (min / max / kthvalue /
    median / aminmax; first indices of min / max)."""
    n = t.shape[d]
    keep = rng.random() < 0.3
    ops = ["min", "max", "aminmax"] + (["kthvalue", "median"] if t.dtype != torch.bool else [])
    op = rng.choice(ops)
    if op == "kthvalue":
        return f"{{0}}.kthvalue({rng.randint(1, max(n, 1))}, {d}, keepdim={keep}).values"
    if op == "aminmax":
        part = rng.choice(("min", "max"))
        return f"torch.aminmax({{0}}, dim={d}, keepdim={keep}).{part}"
    tail = ".values" if op == "median" or rng.random() < 0.8 else ".indices"
    if op == "median":
        return f"{{0}}.median({d}, keepdim={keep}){tail}"
    return f"{{0}}.{op}({d}, keepdim={keep}){tail}"


def draw_extreme(rng: random.Random, b: Any) -> Draw:
    x = b.pick(lambda t: t.dim() >= 1)
    if x is None:
        return None
    t = b.t(x)
    if rng.random() < 0.15:
        return rng.choice(("torch.aminmax({0}).max", "{0}.max()", "{0}.min()")), [x]
    return extreme_expr(rng, t, pick_dim(rng, t.dim())), [x]


def flip_dims(rng: random.Random, rank: int) -> list[int]:
    return pick_dims(rng, rank, rng.randint(1, rank))


def roll_expr(rng: random.Random, t: torch.Tensor) -> str:
    if rng.random() < 0.25 or t.dim() == 0:
        return f"torch.roll({{0}}, {rng.choice((1, -1, 3))})"
    d = pick_dim(rng, t.dim())
    n = t.shape[d]
    shift = rng.choice((1, -1, 2, n, n + 1, -3, 0))
    if rng.random() < 0.3 and t.dim() >= 2:
        d2 = next(e for e in range(t.dim()) if e != d % t.dim())
        return f"torch.roll({{0}}, ({shift}, 1), ({d}, {d2}))"
    return f"{{0}}.roll({shift}, {d})"


def draw_flip_roll(rng: random.Random, b: Any) -> Draw:
    x = b.pick(lambda t: t.dim() >= 1)
    if x is None:
        return None
    t = b.t(x)
    r = rng.random()
    if r < 0.35:
        return f"torch.flip({{0}}, {flip_dims(rng, t.dim())})", [x]
    if r < 0.45:
        return rng.choice(("{0}.flip(-1)", "torch.flip({0}.flatten(), [0])")), [x]
    if r < 0.55 and t.dim() >= 2:
        return rng.choice(("torch.fliplr({0})", "torch.flipud({0})")), [x]
    return roll_expr(rng, t), [x]


def draw_flip_around(rng: random.Random, b: Any) -> Draw:
    """A reduction with indices between two flips or rolls (``flip(flip(a).min(d).values)``),
    or a flip of a flattened softmax."""
    x = b.pick(lambda t: t.dim() >= 1)
    if x is None:
        return None
    t = b.t(x)
    if is_float(t) and rng.random() < 0.3:
        d = pick_dim(rng, t.dim())
        return f"torch.flip(torch.softmax({{0}}, {d}).flatten(), [0])", [x]
    inner = f"torch.flip({{0}}, {flip_dims(rng, t.dim())})"
    if rng.random() < 0.4:
        inner = roll_expr(rng, t)
    d = pick_dim(rng, t.dim())
    reduced = extreme_expr(rng, t, d).replace("{0}", inner, 1)
    out_rank = t.dim() - (0 if "keepdim=True" in reduced else 1)
    if out_rank == 0:
        return reduced, [x]
    if rng.random() < 0.6:
        return f"torch.flip({reduced}, {flip_dims(rng, out_rank)})", [x]
    return f"torch.roll({reduced}, 1, {pick_dim(rng, out_rank)})", [x]


def draw_tril(rng: random.Random, b: Any) -> Draw:
    x = b.pick(lambda t: t.dim() >= 2)
    if x is None:
        return None
    k = rng.choice((0, 0, 1, -1, 2, -2, 5))
    op = rng.choice(("tril", "triu"))
    if rng.random() < 0.3:
        return f"{{0}}.{op}({k})", [x]
    return f"torch.{op}({{0}}, diagonal={k})", [x]


FORMS_ORDER = (
    Form("sort", 1.0, draw_sort),
    Form("extreme", 0.8, draw_extreme),
    Form("flip_roll", 0.8, draw_flip_roll),
    Form("flip_around", 0.5, draw_flip_around),
    Form("tril", 0.7, draw_tril),
)
