"""Op forms, part five: shapes and writes. F.pad (negative pads too; of a matmul of a permuted
3-D / 4-D view, after an in-place op on it), split / tensor_split / chunk / unbind, unflatten /
flatten, repeat / tile / repeat_interleave, advanced indexing and setitem / index_put,
index_select along the dim of a ``cat([x, f(x)])`` and of a padded tensor (int32 and int64
indices), in-place ops on intermediates (through a same-dtype ``type_as`` / ``to`` / ``view_as``
alias too, the original returned), matmuls in every transpose.

In-place forms write only to values computed by the program (no input, no view of one).
"""

from __future__ import annotations

import random
from typing import Any

import torch
import torch.nn.functional as F

from experiments.fuzz.forms_basic import (
    Draw,
    Form,
    category,
    is_float,
    partner_shape,
    pick_dim,
)


def pads_for(rng: random.Random, rank: int) -> list[int]:
    """Pads of up to three trailing dims, negative ones (a crop) among them."""
    k = rng.randint(1, min(rank, 3))
    return [rng.choice((0, 1, 1, 2, 3, -1, -1, -2)) for _ in range(2 * k)]


def pad_expr(rng: random.Random, t: torch.Tensor, inner: str = "{0}") -> str:
    pads = pads_for(rng, t.dim())
    value = ""
    if rng.random() < 0.3:
        value = ", value=-1.5" if is_float(t) else ", value=3"
    if is_float(t) and rng.random() < 0.15 and all(p >= 0 for p in pads):
        value = f", mode={rng.choice(('reflect', 'replicate', 'circular'))!r}"
    return f"F.pad({inner}, {pads}{value})"


def draw_pad(rng: random.Random, b: Any) -> Draw:
    x = b.pick(lambda t: t.dim() >= 1)
    if x is None:
        return None
    return pad_expr(rng, b.t(x)), [x]


def draw_matmul_pad(rng: random.Random, b: Any) -> Draw:
    """``F.pad(a.permute(...) @ w, pads)`` of a 3-D or 4-D value (a 2-D one unsqueezed), at
    times with an in-place subtraction of a size-1 tensor on the product first."""
    x = b.pick(lambda t: t.dim() in (2, 3, 4) and is_float(t))
    if x is None:
        return None
    t, src = b.t(x), "{0}"
    if t.dim() == 2:
        t, src = t.unsqueeze(1), "{0}.unsqueeze(1)"
    perm = list(range(t.dim()))
    rng.shuffle(perm)
    k = t.shape[perm[-1]]
    w = b.new_input((k, rng.choice((1, 2, 5))), t.dtype)
    prod = f"({src}.permute({tuple(perm)}) @ {{1}})"
    if rng.random() < 0.4:
        c = b.new_input((1,) * t.dim(), t.dtype)
        return pad_expr(rng, t, f"{prod}.sub_({{2}})"), [x, w, c]
    return pad_expr(rng, t, prod), [x, w]


def index_input(rng: random.Random, b: Any, shape: tuple[int, ...], hi: int) -> str:
    dtype = torch.int32 if rng.random() < 0.4 else torch.int64
    return b.new_input(shape, dtype, kind="index", hi=hi)


def draw_select_cat_pad(rng: random.Random, b: Any) -> Draw:
    """index_select along the dim of ``cat([x, f(x)], d)``, or of a padded tensor."""
    x = b.pick(lambda t: t.dim() >= 1 and t.numel() > 0)
    if x is None:
        return None
    t = b.t(x)
    if t.dim() == 1 and rng.random() < 0.5:
        src, t = f"{{0}}.unflatten(-1, (1, {t.shape[0]}))", t.unflatten(-1, (1, t.shape[0]))
    else:
        src = "{0}"
    d = pick_dim(rng, t.dim())
    if rng.random() < 0.5:
        other = rng.choice((f"{src}.flip({d})", f"({src} * 2)", f"{src}.roll(1, {d})", src))
        inner, n = f"torch.cat([{src}, {other}], {d})", 2 * t.shape[d]
    else:
        pads = pads_for(rng, t.dim())
        try:
            n = F.pad(t, pads).shape[d]
        except RuntimeError:
            return None
        inner = f"F.pad({src}, {pads})"
    if n == 0:
        return None
    idx = index_input(rng, b, (rng.choice((1, 2, 4)),), n)
    return f"torch.index_select({inner}, {d}, {{1}})", [x, idx]


def draw_split(rng: random.Random, b: Any) -> Draw:
    x = b.pick(lambda t: t.dim() >= 1)
    if x is None:
        return None
    t = b.t(x)
    d = pick_dim(rng, t.dim())
    n = t.shape[d]
    i = rng.choice((0, -1, 1))
    r = rng.random()
    if r < 0.3:
        call = f"torch.split({{0}}, {rng.choice((1, 2, max(n, 1)))}, dim={d})"
    elif r < 0.45 and n >= 1:
        a = rng.randint(0, n)
        call = f"{{0}}.split([{a}, {n - a}], {d})"
    elif r < 0.7:
        arg = rng.choice((2, 3, [1], [0, 2], [1, n + 1]))
        call = f"torch.tensor_split({{0}}, {arg}, dim={d})"
    elif r < 0.85:
        call = f"torch.chunk({{0}}, {rng.choice((1, 2, 3))}, {d})"
    else:
        call = f"{{0}}.unbind({d})"
    if rng.random() < 0.25:
        return f"(lambda p: p[0] * 2 - p[-1])({call})", [x]
    return f"{call}[{i}]", [x]


def unflatten_sizes(rng: random.Random, n: int) -> tuple[int, ...]:
    divs = [k for k in range(2, n) if n % k == 0]
    options = [(1, n), (n, 1), (-1, 1), (1, -1), (1, 1, n)]
    if divs:
        k = rng.choice(divs)
        options += [(k, n // k), (k, -1)]
    return rng.choice(options)


def draw_unflatten(rng: random.Random, b: Any) -> Draw:
    x = b.pick(lambda t: t.dim() >= 1)
    if x is None:
        return None
    t = b.t(x)
    d = pick_dim(rng, t.dim())
    if rng.random() < 0.25 and t.dim() >= 2:
        s = rng.randrange(t.dim() - 1)
        return f"{{0}}.flatten({s}, {rng.randint(s + 1, t.dim() - 1)})", [x]
    if t.shape[d] == 0:
        return f"{{0}}.unflatten({d}, (0, 1))", [x]
    return f"{{0}}.unflatten({d}, {unflatten_sizes(rng, t.shape[d])})", [x]


def draw_repeat(rng: random.Random, b: Any) -> Draw:
    x = b.pick(lambda t: t.dim() <= 4)
    if x is None:
        return None
    t = b.t(x)
    reps = [rng.choice((1, 1, 2, 3)) for _ in range(t.dim())]
    if rng.random() < 0.3 or not reps:
        reps.insert(0, rng.choice((1, 2)))
    r = rng.random()
    if r < 0.5:
        return f"{{0}}.repeat({tuple(reps)})", [x]
    if r < 0.7:
        return f"{{0}}.tile({tuple(reps[-max(t.dim(), 1) :])})", [x]
    if t.dim() == 0:
        return "{0}.repeat_interleave(2)", [x]
    return f"{{0}}.repeat_interleave({rng.choice((1, 2, 3))}, dim={pick_dim(rng, t.dim())})", [x]


def draw_adv_index(rng: random.Random, b: Any) -> Draw:
    """Indexing by integer tensors (one, two broadcast, on any dim), lists, masks, None."""
    x = b.pick(lambda t: t.dim() >= 1 and t.numel() > 0)
    if x is None:
        return None
    t = b.t(x)
    r = rng.random()
    k = rng.choice((1, 2, 3))
    if r < 0.3:
        return "{0}[{1}]", [x, index_input(rng, b, (k,), t.shape[0])]
    if r < 0.5 and t.dim() >= 2:
        i = index_input(rng, b, (k, 1), t.shape[0])
        j = index_input(rng, b, rng.choice(((k,), (1, 2))), t.shape[1])
        return "{0}[{1}, {2}]", [x, i, j]
    if r < 0.7:
        lead = rng.choice(("..., ", ":, " * (t.dim() - 1)))
        return f"{{0}}[{lead}{{1}}]", [x, index_input(rng, b, (k,), t.shape[-1])]
    if r < 0.8:
        return rng.choice(("{0}[[0, -1]]", "{0}[None, ..., 0]", "{0}[[0, 0]]")), [x]
    return "{0}[{0} > 0]", [x]


def owned(b: Any) -> Any:
    """A predicate: the value is computed by the program, not an input or a view of one."""
    inputs = {s.name for s in b.inputs}
    ptrs = {b.t(n).untyped_storage().data_ptr() for n in inputs}

    def ok(t: torch.Tensor) -> bool:
        if any(t is b.t(n) for n in inputs):
            return False
        return t.numel() == 0 or t.untyped_storage().data_ptr() not in ptrs

    return ok


SET_KEYS = ("0", "(Ellipsis, -1)", "(slice(None), slice(0, 1))", "t > 0", "{1}")


def draw_setitem(rng: random.Random, b: Any) -> Draw:
    """``t[key] = value`` (on an intermediate, or on a clone), or index_put."""
    x = b.pick(lambda t: t.dim() >= 1 and t.numel() > 0)
    if x is None:
        return None
    t = b.t(x)
    mine = owned(b)(t)
    if rng.random() < 0.25:
        idx = index_input(rng, b, (rng.choice((1, 2, 3)),), t.shape[0])
        val = b.new_input((1,), t.dtype)
        acc = rng.random() < 0.5 and t.dtype != torch.bool
        return f"{{0}}.index_put(({{1}},), {{2}}, accumulate={acc})", [x, idx, val]
    key = rng.choice(SET_KEYS if t.dim() >= 2 else (*SET_KEYS[:2], *SET_KEYS[3:]))
    value = {"float": "-2.5", "int": "7", "bool": "True"}[category(t)]
    target = "{0}" if mine and rng.random() < 0.6 else "{0}.clone()"
    args = [x]
    if key == "{1}":
        args.append(index_input(rng, b, (rng.choice((1, 2)),), t.shape[0]))
    return f"(lambda t: t.__setitem__({key}, {value}) or t)({target})", args


INPLACE = {
    "float": ("{0}.add_({1})", "{0}.sub_({1})", "{0}.mul_(2.0)", "{0}.clamp_(-0.5, 0.5)",
              "{0}.fill_(-1.0)", "{0}.masked_fill_({0} > 0, 0.0)", "{0}.copy_({1})",
              "{0}.relu_()", "{0}.div_(4.0)", "{0}.addcmul_({1}, {1}, value=0.5)"),
    "int": ("{0}.add_(1)", "{0}.mul_({1})", "{0}.fill_(-1)", "{0}.clamp_(min=0)",
            "{0}.sub_({1})", "{0}.copy_({1})"),
    "bool": ("{0}.logical_not_()", "{0}.fill_(True)", "{0}.logical_or_({1})",
             "{0}.masked_fill_({1}, False)"),
}  # fmt: skip


def aliases(rng: random.Random, t: torch.Tensor) -> str:
    """An expression of ``{0}`` that returns ``{0}`` itself (same dtype) or a same-shape view."""
    dt = str(t.dtype).replace("torch.", "")
    own = {"float32": ".float()", "int64": ".long()", "int32": ".int()", "bool": ".bool()"}
    options = ["{0}.type_as({0})", "{0}.type_as({0})", "{0}.to({0}.dtype)", "{0}.to({0}.dtype)", f"{{0}}.to(torch.{dt})",
               "{0}.view_as({0})", f"{{0}}.type(torch.{dt})", "{0}[...]"]  # fmt: skip
    if dt in own:
        options.append("{0}" + own[dt])
    return rng.choice(options)


def inplace_op(rng: random.Random, b: Any) -> tuple[str, list[str]] | None:
    """(an in-place op on ``{0}``, its args) for an intermediate, a new partner input if the
    op takes one."""
    x = b.pick(owned(b))
    if x is None:
        return None
    t = b.t(x)
    op = rng.choice(INPLACE[category(t)])
    args = [x]
    if "{1}" in op:
        dtype = torch.bool if "masked_fill_" in op else t.dtype
        args.append(b.new_input(partner_shape(rng, tuple(t.shape)), dtype))
    return op, args


def draw_inplace(rng: random.Random, b: Any) -> Draw:
    """An in-place op on an intermediate (returning it)."""
    return inplace_op(rng, b)


def draw_alias_inplace(rng: random.Random, b: Any) -> Draw:
    """An in-place op through an alias of an intermediate, the original returned:
    ``w = v.type_as(v); w.add_(1); return v``."""
    if (got := inplace_op(rng, b)) is None:
        return None
    op, args = got
    written = op.replace("{0}", aliases(rng, b.t(args[0])), 1)
    return f"({written}, {{0}})[1]", args


def matmul_operands(rng: random.Random, t: torch.Tensor) -> tuple[str, int, int]:
    """(lhs expression of ``{0}``, contracted size, the other size), transposed at times."""
    if rng.random() < 0.5:
        return "{0}", t.shape[-1], t.shape[-2]
    how = rng.choice(("{0}.transpose(-1, -2)", "{0}.mT", "{0}.transpose(-2, -1)"))
    return how, t.shape[-2], t.shape[-1]


def draw_matmul_t(rng: random.Random, b: Any) -> Draw:
    """matmul / mm / bmm / addmm / baddbmm with either operand transposed (or a value times
    its own transpose)."""
    x = b.pick(lambda t: 2 <= t.dim() <= 4 and is_float(t))
    if x is None:
        return None
    t = b.t(x)
    if rng.random() < 0.15:
        return rng.choice(("({0} @ {0}.transpose(-1, -2))", "({0}.mT @ {0})")), [x]
    lhs, k, m = matmul_operands(rng, t)
    n = rng.choice((1, 2, 3, 8))
    batched = t.dim() == 3 and rng.random() < 0.4
    lead = (t.shape[0],) if batched else ()
    if rng.random() < 0.5:
        w, rhs = (
            b.new_input((*lead, n, k), t.dtype),
            rng.choice(("{1}.mT", "{1}.transpose(-1, -2)")),
        )
    else:
        w, rhs = b.new_input((*lead, k, n), t.dtype), "{1}"
    r = rng.random()
    if t.dim() == 2 and r < 0.3:
        bias = b.new_input(rng.choice(((n,), (1, n), (m, n))), t.dtype)
        return f"torch.addmm({{2}}, {lhs}, {rhs}, beta=0.5, alpha=2.0)", [x, w, bias]
    if t.dim() == 2 and r < 0.5:
        return f"torch.mm({lhs}, {rhs})", [x, w]
    if batched and r < 0.6:
        bias = b.new_input((1, m, n), t.dtype)
        return f"torch.baddbmm({{2}}, {lhs}, {rhs})", [x, w, bias]
    if batched and r < 0.8:
        return f"torch.bmm({lhs}, {rhs})", [x, w]
    return f"torch.matmul({lhs}, {rhs})", [x, w]


FORMS_SHAPE = (
    Form("pad", 0.8, draw_pad),
    Form("matmul_pad", 0.8, draw_matmul_pad),
    Form("select_cat_pad", 1.0, draw_select_cat_pad),
    Form("split", 0.9, draw_split),
    Form("unflatten", 0.6, draw_unflatten),
    Form("repeat", 0.8, draw_repeat),
    Form("adv_index", 0.8, draw_adv_index),
    Form("setitem", 0.8, draw_setitem),
    Form("inplace", 0.8, draw_inplace),
    Form("alias_inplace", 1.0, draw_alias_inplace),
    Form("matmul_t", 1.2, draw_matmul_t),
)
