"""Op forms, part one: pointwise (unary, binary, where, comparisons, integer and bool
arithmetic, casts), reductions, views and slices.

A form's ``draw(rng, b)`` picks values of the builder ``b`` (see ``generate.Builder``) that the
op accepts, given their shapes and dtypes, and returns ``(template, args)``, or None where no
value fits. ``b`` may make new inputs the op needs (a partner of a broadcast, an index).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

Draw = tuple[str, list[str]] | None


@dataclass(frozen=True)
class Form:
    name: str
    weight: float
    draw: Callable[[random.Random, Any], Draw]


def is_float(t: torch.Tensor) -> bool:
    return t.is_floating_point()


def pick_dim(rng: random.Random, rank: int) -> int:
    """A dim of a tensor of ``rank`` dims, written negative half of the time."""
    d = rng.randrange(rank)
    return d - rank if rng.random() < 0.5 else d


def pick_dims(rng: random.Random, rank: int, k: int) -> list[int]:
    ds = rng.sample(range(rank), min(k, rank))
    return [d - rank if rng.random() < 0.4 else d for d in ds]


UNARY_FLOAT = (
    "torch.exp({0})", "torch.sin({0})", "torch.tanh({0})", "torch.sigmoid({0})",
    "torch.abs({0})", "torch.neg({0})", "torch.relu({0})", "({0} * 0.5)",
    "torch.sqrt(torch.abs({0}))", "torch.log1p(torch.abs({0}))", "torch.rsqrt(torch.abs({0}) + 1.0)",
    "F.gelu({0})", "F.silu({0})", "torch.clamp({0}, -0.5, 0.5)", "torch.erf({0})",
    "{0}.pow(2)", "torch.floor({0})", "{0}.to(torch.float32)", "{0}.to(torch.float16)",
    "{0}.to(torch.bfloat16)", "{0}.to(torch.int32)", "({0} > 0)",
)  # fmt: skip
UNARY_INT = (
    "({0} // 2)", "({0} % 3)", "torch.abs({0})", "(-{0})", "({0} * 3)", "({0} + 1)",
    "{0}.to(torch.float32)", "{0}.to(torch.int64)", "({0} > 0)", "({0} == 1)",
)  # fmt: skip
UNARY_BOOL = ("(~{0})", "{0}.to(torch.float32)", "{0}.to(torch.int32)", "torch.logical_not({0})")
BINARY_FLOAT = (
    "({0} + {1})", "({0} - {1})", "({0} * {1})", "torch.maximum({0}, {1})",
    "torch.minimum({0}, {1})", "({0} / ({1}.abs() + 1.0))", "torch.where({0} > {1}, {0}, {1})",
    "({0} < {1})", "({0} == {1})", "torch.atan2({0}, {1})", "({0} * 2.0 + {1})",
)  # fmt: skip
BINARY_INT = (
    "({0} + {1})", "({0} * {1})", "({0} - {1})", "torch.maximum({0}, {1})",
    "({0} // ({1}.abs() + 1))", "({0} > {1})", "({0} & {1})", "({0} | {1})", "({0} ^ {1})",
)  # fmt: skip
BINARY_BOOL = ("({0} & {1})", "({0} | {1})", "({0} ^ {1})", "({0} == {1})", "({0} + {1})")
BINARY_MIXED = ("({0} + {1})", "({0} * {1})", "({0} - {1})", "torch.maximum({0}, {1})")


def category(t: torch.Tensor) -> str:
    if t.dtype == torch.bool:
        return "bool"
    return "float" if is_float(t) else "int"


def draw_unary(rng: random.Random, b: Any) -> Draw:
    x = b.pick()
    table = {"float": UNARY_FLOAT, "int": UNARY_INT, "bool": UNARY_BOOL}[category(b.t(x))]
    return rng.choice(table), [x]


def partner_shape(rng: random.Random, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with ``shape``: some dims set to 1, some leading dims dropped."""
    out = [1 if rng.random() < 0.4 else s for s in shape]
    if out and rng.random() < 0.3:
        out = out[rng.randrange(len(out) + 1) :]
    return tuple(out)


def broadcasting_partner(rng: random.Random, b: Any, x: str) -> str:
    """A value that broadcasts with ``x`` (x itself, another value, or a new input)."""
    shape = tuple(b.t(x).shape)
    fits = [v for v in b.values() if _broadcasts(tuple(b.t(v).shape), shape)]
    if fits and rng.random() < 0.6:
        return rng.choice(fits)
    return b.new_input(partner_shape(rng, shape), b.t(x).dtype)


def _broadcasts(a: tuple[int, ...], c: tuple[int, ...]) -> bool:
    try:
        torch.broadcast_shapes(a, c)
    except RuntimeError:
        return False
    return True


def draw_binary(rng: random.Random, b: Any) -> Draw:
    x = b.pick()
    y = broadcasting_partner(rng, b, x)
    cx, cy = category(b.t(x)), category(b.t(y))
    if cx != cy:
        table = BINARY_MIXED
    else:
        table = {"float": BINARY_FLOAT, "int": BINARY_INT, "bool": BINARY_BOOL}[cx]
    return rng.choice(table), ([x, y] if rng.random() < 0.7 else [y, x])


def draw_where(rng: random.Random, b: Any) -> Draw:
    x = b.pick()
    y = broadcasting_partner(rng, b, x)
    conds = [v for v in b.values() if b.t(v).dtype == torch.bool]
    if conds and rng.random() < 0.5:
        c = rng.choice(conds)
        return "torch.where({0}, {1}, {2})", [c, x, y]
    if rng.random() < 0.3:
        return "torch.where({0} > 0, {1}, 0.0)", [x, y]
    return "torch.where({0} > 0, {0}, {1})", [x, y]


REDUCTIONS = ("sum", "mean", "amax", "amin", "var", "argmax")


def draw_reduction(rng: random.Random, b: Any) -> Draw:
    x = b.pick(lambda t: t.dim() >= 1)
    if x is None:
        return None
    t = b.t(x)
    ok = [r for r in REDUCTIONS if is_float(t) or r in ("sum", "amax", "amin", "argmax")]
    op = rng.choice(ok)
    keep = rng.random() < 0.5
    if op == "argmax":
        return f"torch.argmax({{0}}, dim={pick_dim(rng, t.dim())}, keepdim={keep})", [x]
    dims = tuple(pick_dims(rng, t.dim(), rng.choice((1, 1, 2))))
    if op == "var":
        corr = rng.choice((0, 1))
        return f"torch.var({{0}}, dim={dims}, keepdim={keep}, correction={corr})", [x]
    if rng.random() < 0.15 and op == "sum":
        return "{0}.sum()", [x]
    return f"torch.{op}({{0}}, dim={dims}, keepdim={keep})", [x]


def draw_centered(rng: random.Random, b: Any) -> Draw:
    """A reduction broadcast back over its input (x - mean(x)), as norms are written."""
    x = b.pick(lambda t: t.dim() >= 1 and is_float(t))
    if x is None:
        return None
    d = pick_dim(rng, b.t(x).dim())
    op = rng.choice(("mean", "amax", "sum"))
    return f"({{0}} - torch.{op}({{0}}, dim={d}, keepdim=True))", [x]


def reshape_target(rng: random.Random, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Another shape of the same numel: dims merged, split, size-1 dims added or dropped."""
    s = list(shape)
    for _ in range(rng.randint(1, 3)):
        r = rng.random()
        if r < 0.3 and len(s) >= 2:
            i = rng.randrange(len(s) - 1)
            s[i : i + 2] = [s[i] * s[i + 1]]
        elif r < 0.5 and s:
            i = rng.randrange(len(s))
            divs = [d for d in range(2, s[i]) if s[i] % d == 0]
            if divs:
                d = rng.choice(divs)
                s[i : i + 1] = [d, s[i] // d]
        elif r < 0.85 and len(s) < 5:
            s.insert(rng.randrange(len(s) + 1), 1)
        elif 1 in s:
            s.remove(1)
    return tuple(s)


def draw_view(rng: random.Random, b: Any) -> Draw:
    x = b.pick()
    t = b.t(x)
    target = reshape_target(rng, tuple(t.shape))
    if rng.random() < 0.25 and t.numel() > 0:
        target = tuple(-1 if i == 0 else s for i, s in enumerate(target)) or target
    how = "view" if t.is_contiguous() and rng.random() < 0.7 else "reshape"
    return f"{{0}}.{how}({target})", [x]


def draw_unsqueeze(rng: random.Random, b: Any) -> Draw:
    x = b.pick(lambda t: t.dim() < 5)
    r = b.t(x).dim()
    d = rng.randint(-(r + 1), r)
    if rng.random() < 0.3:
        return f"{{0}}.unsqueeze({d}).unsqueeze({rng.randint(-(r + 2), r + 1)})", [x]
    return f"{{0}}.unsqueeze({d})", [x]


def draw_squeeze(rng: random.Random, b: Any) -> Draw:
    x = b.pick(lambda t: t.dim() >= 1)
    if x is None:
        return None
    shape = b.t(x).shape
    ones = [i for i, s in enumerate(shape) if s == 1]
    if rng.random() < 0.2:
        return "{0}.squeeze()", [x]
    d = rng.choice(ones) if ones and rng.random() < 0.8 else rng.randrange(len(shape))
    return f"{{0}}.squeeze({d})", [x]


def draw_expand(rng: random.Random, b: Any) -> Draw:
    x = b.pick(lambda t: t.dim() < 5)
    orig = list(b.t(x).shape)
    shape = [rng.choice((2, 3, 5)) if s == 1 and rng.random() < 0.7 else s for s in orig]
    how = rng.choice(("expand", "expand", "broadcast_to"))
    if how == "expand" and rng.random() < 0.3:  # -1: the dim kept as it is
        shape = [-1 if s == o else s for s, o in zip(shape, orig)]
    if rng.random() < 0.3 or not shape:
        shape.insert(0, rng.choice((1, 2, 3)))
    return f"{{0}}.{how}({tuple(shape)})", [x]


def draw_permute(rng: random.Random, b: Any) -> Draw:
    x = b.pick(lambda t: t.dim() >= 1)
    if x is None:
        return None
    r = b.t(x).dim()
    choice = rng.random()
    if choice < 0.2 and r <= 2:
        return "{0}.t()", [x]
    if choice < 0.6 and r >= 2:
        a, c = pick_dims(rng, r, 2)
        return f"{{0}}.transpose({a}, {c})", [x]
    perm = list(range(r))
    rng.shuffle(perm)
    return f"{{0}}.permute({tuple(perm)})", [x]


def draw_slice(rng: random.Random, b: Any) -> Draw:
    x = b.pick(lambda t: t.dim() >= 1)
    if x is None:
        return None
    t = b.t(x)
    d = rng.randrange(t.dim())
    n = t.shape[d]
    r = rng.random()
    if r < 0.2 and n > 0:
        return f"{{0}}.select({d}, {rng.randint(-n, n - 1)})", [x]
    if r < 0.35:
        start = rng.randint(0, n)
        return f"{{0}}.narrow({d}, {start}, {rng.randint(0, n - start)})", [x]
    start = rng.choice(("", "0", "1", "-1", "-2", str(n // 2), str(n + 1)))
    stop = rng.choice(("", "-1", str(n), "1", "0", str(-n)))
    step = rng.choice(("", ":2", ":3", ":1"))
    lead = "..., " if d == t.dim() - 1 and rng.random() < 0.5 else ":, " * d
    return f"{{0}}[{lead}{start}:{stop}{step}]", [x]


FORMS_BASIC = (
    Form("unary", 3.0, draw_unary),
    Form("binary", 4.0, draw_binary),
    Form("where", 1.0, draw_where),
    Form("reduction", 3.0, draw_reduction),
    Form("centered", 1.0, draw_centered),
    Form("view", 2.0, draw_view),
    Form("unsqueeze", 1.5, draw_unsqueeze),
    Form("squeeze", 1.0, draw_squeeze),
    Form("expand", 1.0, draw_expand),
    Form("permute", 1.5, draw_permute),
    Form("slice", 1.5, draw_slice),
)
