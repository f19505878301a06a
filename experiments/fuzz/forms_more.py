"""Op forms, part two: cat / stack, gather / scatter / index_select / index_add, matmuls, norms
(layer_norm of rows that can be constant, whose variance must come out exactly 0; layer_norm over
a size-1 normalized shape feeding a matmul with its own transpose), attention
(scaled_dot_product_attention and written out in eager ops) and cumsum (of integers cast to
int64 and then filled in place, too)."""

from __future__ import annotations

import random
from typing import Any

import torch

from experiments.fuzz.forms_basic import Draw, Form, is_float, pick_dim


def draw_cat(rng: random.Random, b: Any) -> Draw:
    x = b.pick(lambda t: t.dim() >= 1)
    if x is None:
        return None
    t = b.t(x)
    d = pick_dim(rng, t.dim())
    if rng.random() < 0.4:  # stack: equal shapes
        same = [v for v in b.values() if b.t(v).shape == t.shape] + [x]
        d = rng.randint(-(t.dim() + 1), t.dim())
        return f"torch.stack([{{0}}, {{1}}], dim={d})", [x, rng.choice(same)]
    shape = list(t.shape)
    shape[d] = rng.choice((0, 1, 1, 2, 3))
    y = b.new_input(tuple(shape), t.dtype) if rng.random() < 0.6 else x
    return f"torch.cat([{{0}}, {{1}}], dim={d})", [x, y]


def index_for(rng: random.Random, b: Any, shape: list[int], d: int, hi: int) -> str:
    """An int64 index input of ``shape`` with values in [0, hi)."""
    return b.new_input(tuple(shape), torch.int64, kind="index", hi=hi)


def indexed(rng: random.Random, b: Any) -> tuple[str, torch.Tensor, int] | None:
    """A non-empty value to index, its tensor and the dim to index along."""
    x = b.pick(lambda t: t.dim() >= 1 and t.numel() > 0)
    if x is None:
        return None
    return x, b.t(x), rng.randrange(b.t(x).dim())


def draw_gather_scatter(rng: random.Random, b: Any) -> Draw:
    if (got := indexed(rng, b)) is None:
        return None
    x, t, d = got
    shape = [rng.choice((1, s)) if i != d else rng.choice((1, 2, 3)) for i, s in enumerate(t.shape)]
    op = rng.choice(("gather", "scatter", "scatter_add"))
    if op == "scatter":
        shape[d] = min(shape[d], t.shape[d])
    idx = index_for(rng, b, shape, d, t.shape[d])
    if op == "gather":
        return f"torch.gather({{0}}, {d}, {{1}})", [x, idx]
    if op == "scatter":
        return f"{{0}}.scatter({d}, {{1}}, 2.0)", [x, idx]
    src = b.new_input(tuple(shape), t.dtype)
    return f"{{0}}.scatter_add({d}, {{1}}, {{2}})", [x, idx, src]


def draw_index(rng: random.Random, b: Any) -> Draw:
    if (got := indexed(rng, b)) is None:
        return None
    x, t, d = got
    k = rng.choice((0, 1, 2, 4))
    idx = index_for(rng, b, [k], d, t.shape[d])
    if rng.random() < 0.5:
        return f"torch.index_select({{0}}, {d}, {{1}})", [x, idx]
    shape = list(t.shape)
    shape[d] = k
    src = b.new_input(tuple(shape), t.dtype)
    return f"{{0}}.index_add({d}, {{1}}, {{2}}, alpha=2)", [x, idx, src]


def draw_matmul(rng: random.Random, b: Any) -> Draw:
    x = b.pick(lambda t: 1 <= t.dim() <= 4 and is_float(t))
    if x is None:
        return None
    t = b.t(x)
    k, n = t.shape[-1], rng.choice((1, 2, 3, 8, 16))
    r = rng.random()
    if t.dim() == 3 and r < 0.3:
        w = b.new_input((t.shape[0], k, n), t.dtype)
        return "torch.bmm({0}, {1})", [x, w]
    if t.dim() == 2 and r < 0.6:
        w = b.new_input((k, n), t.dtype)
        bias = b.new_input(rng.choice(((n,), (1, n), (t.shape[0], n))), t.dtype)
        return "torch.addmm({2}, {0}, {1}, beta=0.5)", [x, w, bias]
    if r < 0.75:
        w = b.new_input((n, k), t.dtype)
        bias = b.new_input((n,), t.dtype)
        return "F.linear({0}, {1}, {2})", [x, w, bias]
    w = b.new_input((k, n) if rng.random() < 0.7 else (k,), t.dtype)
    return "({0} @ {1})", [x, w]


def draw_norm(rng: random.Random, b: Any) -> Draw:
    x = b.pick(lambda t: t.dim() >= 1 and is_float(t))
    if x is None:
        return None
    t = b.t(x)
    kind = rng.choice(("layer_norm", "group_norm", "softmax", "log_softmax", "rms"))
    if kind == "layer_norm":
        last = tuple(t.shape[-rng.choice((1, 2)) :])
        if rng.random() < 0.5:
            return f"F.layer_norm({{0}}, {last})", [x]
        w, bias = b.new_input(last, t.dtype), b.new_input(last, t.dtype)
        return f"F.layer_norm({{0}}, {last}, {{1}}, {{2}}, eps=1e-5)", [x, w, bias]
    if kind == "group_norm" and t.dim() >= 2:
        c = t.shape[1]
        g = rng.choice([d for d in range(1, c + 1) if c % d == 0] or [1])
        if rng.random() < 0.5:
            return f"F.group_norm({{0}}, {g})", [x]
        w, bias = b.new_input((c,), t.dtype), b.new_input((c,), t.dtype)
        return f"F.group_norm({{0}}, {g}, {{1}}, {{2}})", [x, w, bias]
    if kind in ("softmax", "log_softmax"):
        return f"torch.{kind}({{0}}, dim={pick_dim(rng, t.dim())})", [x]
    w = b.new_input((t.shape[-1],), t.dtype)
    return "({0} * torch.rsqrt({0}.pow(2).mean(-1, keepdim=True) + 1e-6) * {1})", [x, w]


def draw_attention(rng: random.Random, b: Any) -> Draw:
    q = b.pick(lambda t: t.dim() in (3, 4) and is_float(t) and t.dtype != torch.float16)
    if q is None:
        return None
    t = b.t(q)
    lead, length, d = tuple(t.shape[:-2]), t.shape[-2], t.shape[-1]
    s, dv = rng.choice((1, 2, 3, 8)), rng.choice((1, 4, d))
    k = b.new_input((*lead, s, d), t.dtype)
    v = b.new_input((*lead, s, dv), t.dtype)
    mask_kind = rng.choice(("none", "causal", "additive"))
    scale = rng.choice(("", ", scale=0.5"))
    eager = rng.random() < 0.4
    if mask_kind == "additive":
        m = b.new_input((length, s), t.dtype)
        if eager:
            tpl = "torch.softmax(({0} @ {1}.transpose(-2, -1)) * 0.5 + {3}, dim=-1) @ {2}"
            return tpl, [q, k, v, m]
        return f"F.scaled_dot_product_attention({{0}}, {{1}}, {{2}}, attn_mask={{3}}{scale})", [
            q, k, v, m,
        ]  # fmt: skip
    if mask_kind == "causal" and eager:
        causal = f"torch.ones({length}, {s}, dtype=torch.bool, device={{0}}.device).triu(1)"
        tpl = (
            f"torch.softmax(({{0}} @ {{1}}.transpose(-2, -1) * 0.5).masked_fill({causal}, "
            "float('-inf')), dim=-1) @ {2}"
        )
        return tpl, [q, k, v]
    if eager:
        return "torch.softmax({0} @ {1}.transpose(-2, -1), dim=-1) @ {2}", [q, k, v]
    causal = ", is_causal=True" if mask_kind == "causal" else ""
    return f"F.scaled_dot_product_attention({{0}}, {{1}}, {{2}}{causal}{scale})", [q, k, v]


def draw_cumsum(rng: random.Random, b: Any) -> Draw:
    x = b.pick(lambda t: t.dim() >= 1)
    if x is None:
        return None
    return f"torch.cumsum({{0}}, dim={pick_dim(rng, b.t(x).dim())})", [x]


def draw_int_cumsum(rng: random.Random, b: Any) -> Draw:
    """An int64 cumsum of an integer or bool value, filled in place at times (-1, or the
    smallest int64), then reduced by max / min at times."""
    x = b.pick(lambda t: t.dim() >= 1 and not is_float(t))
    if x is None:
        return None
    t = b.t(x)
    expr = f"{{0}}.long().cumsum({pick_dim(rng, t.dim())})"
    if rng.random() < 0.6:
        expr += rng.choice((".fill_(-1)", ".fill_(-9223372036854775808)", ".fill_(2**40)"))
    if rng.random() < 0.4:
        expr += f".{rng.choice(('max', 'min'))}({pick_dim(rng, t.dim())}).values"
    return expr, [x]


def constant_rows(rng: random.Random, t: torch.Tensor) -> str:
    """An expression of ``{0}`` whose last-dim rows are constant (or can be)."""
    ones = [d for d, s in enumerate(t.shape) if s == 1]
    options = [
        "{0}.mean(-1, keepdim=True).expand_as({0})",
        "({0} * 0 + 0.3)",
        "{0}.amax(-1, keepdim=True).expand({0}.shape)",
    ]
    if ones:
        d = rng.choice(ones)
        options += [f"torch.softmax({{0}}, {d})",
                    f"torch.log(torch.softmax({{0}}.cumsum(-1), {d}).abs() + 1)"]  # fmt: skip
    return rng.choice(options)


def draw_norm_const(rng: random.Random, b: Any) -> Draw:
    """layer_norm (or var) of rows that are constant: the variance must come out exactly 0."""
    x = b.pick(lambda t: t.dim() >= 1 and is_float(t))
    if x is None:
        return None
    t = b.t(x)
    rows = constant_rows(rng, t)
    last = list(t.shape[-rng.choice((1, 1, 2)) :])
    eps = rng.choice(("1e-5", "1e-12", "1e-6"))
    r = rng.random()
    if r < 0.15:
        return f"torch.var({rows}, -1, correction=0)", [x]
    if r < 0.5:
        return f"F.layer_norm({rows}, {last}, eps={eps})", [x]
    bias = b.new_input(tuple(last), t.dtype)
    if r < 0.75:
        return f"F.layer_norm({rows}, {last}, None, {{1}}, eps={eps})", [x, bias]
    w = b.new_input(tuple(last), t.dtype)
    return f"F.layer_norm({rows}, {last}, {{2}}, {{1}}, eps={eps})", [x, bias, w]


def draw_norm_matmul(rng: random.Random, b: Any) -> Draw:
    """layer_norm over a size-1 normalized shape (or the last dim), then a matmul with its own
    transpose."""
    x = b.pick(lambda t: 1 <= t.dim() <= 3 and is_float(t))
    if x is None:
        return None
    t = b.t(x)
    src, shape = "{0}", tuple(t.shape)
    if t.shape[-1] != 1 and (rng.random() < 0.7 or t.dim() == 1):
        src, shape = "{0}.unsqueeze(-1)", (*shape, 1)
    w = b.new_input((shape[-1],), t.dtype)
    norm = f"F.layer_norm({src}, [{shape[-1]}], {{1}})"
    gram = rng.choice(("v @ v.transpose(-1, -2)", "v.transpose(-1, -2) @ v", "v.mT @ v"))
    return f"(lambda v: {gram})({norm})", [x, w]


FORMS_MORE = (
    Form("cat", 1.0, draw_cat),
    Form("gather_scatter", 1.0, draw_gather_scatter),
    Form("index", 1.0, draw_index),
    Form("matmul", 1.0, draw_matmul),
    Form("norm", 1.5, draw_norm),
    Form("attention", 0.7, draw_attention),
    Form("cumsum", 0.7, draw_cumsum),
    Form("int_cumsum", 0.8, draw_int_cumsum),
    Form("norm_const", 0.7, draw_norm_const),
    Form("norm_matmul", 0.6, draw_norm_matmul),
)
