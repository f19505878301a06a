"""Op forms, part two: cat / stack, gather / scatter / index_select / index_add, matmuls, norms,
attention (scaled_dot_product_attention and written out in eager ops) and cumsum."""

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
        causal = f"torch.ones({length}, {s}, dtype=torch.bool).triu(1)"
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


FORMS_MORE = (
    Form("cat", 1.0, draw_cat),
    Form("gather_scatter", 1.0, draw_gather_scatter),
    Form("index", 1.0, draw_index),
    Form("matmul", 1.0, draw_matmul),
    Form("norm", 1.5, draw_norm),
    Form("attention", 0.7, draw_attention),
    Form("cumsum", 0.7, draw_cumsum),
)
