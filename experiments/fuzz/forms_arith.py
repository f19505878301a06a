"""Op forms, part three: arithmetic a new user writes beside the plain pointwise ops. Integer and
bool tensors compared with Python scalars (``bool >= 2`` is all False), integer casts after
comparisons, bool and integer bit ops with Python scalars (``bool ^ True``), literals at the
edges (1e-12, 1e20, -0.0, NaN, infinities), hypot / copysign (a tensor or a Python float as
second operand) / logaddexp, rounding division (``div(rounding_mode=...)``, floor_divide,
remainder, fmod), addcmul / addcdiv / lerp (of expanded integer tensors too), masked_fill, and
var / std (and their ``_mean`` forms) with small counts (reduced dims of size 0, 1 or 2).
"""

from __future__ import annotations

import random
from typing import Any

import torch

from experiments.fuzz.forms_basic import (
    Draw,
    Form,
    broadcasting_partner,
    category,
    is_float,
    partner_shape,
    pick_dim,
    pick_dims,
)

COMPARISONS = (">=", "<", "==", "!=", ">", "<=")
CASTS = ("", "", ".long()", ".int()", ".to(torch.int32)", ".float()", ".to(torch.float16)")


def prefer(rng: random.Random, b: Any, pred: Any, share: float = 0.7) -> str | None:
    """A value ``pred`` holds for with probability ``share`` (where one exists), else any."""
    x = b.pick(pred) if rng.random() < share else None
    return x if x is not None else b.pick()


def draw_scalar_compare(rng: random.Random, b: Any) -> Draw:
    """``x op scalar`` (either side), mostly of an integer or bool ``x`` with an int scalar,
    at times cast to an integer or float type or summed."""
    x = prefer(rng, b, lambda t: not is_float(t))
    s = rng.choice((0, 1, 2, -1, 3)) if not is_float(b.t(x)) else rng.choice((0, 0.5, -1, 2))
    op = rng.choice(COMPARISONS)
    expr = f"({{0}} {op} {s})" if rng.random() < 0.8 else f"({s} {op} {{0}})"
    cast = rng.choice(CASTS)
    if rng.random() < 0.15:
        return f"{expr}.sum(-1)", [x]
    return expr + cast, [x]


BOOL_SCALAR = ("({0} ^ True)", "({0} ^ True)", "({0} | False)", "({0} & True)", "(True ^ {0})", "({0} != True)",
               "({0} ^ False)", "(~{0} ^ True)")  # fmt: skip
INT_SCALAR = ("({0} ^ 1)", "({0} & 3)", "({0} | 2)", "({0} >> 1)", "({0} << 2)", "(-1 ^ {0})")


def draw_bit_scalar(rng: random.Random, b: Any) -> Draw:
    """Bool and integer bit ops with a Python scalar (``bool ^ True``); a bool made by a
    comparison where no bool value is at hand."""
    x = b.pick(lambda t: t.dtype == torch.bool) if rng.random() < 0.7 else None
    if x is not None:
        return rng.choice(BOOL_SCALAR), [x]
    x = b.pick(lambda t: not is_float(t)) if rng.random() < 0.5 else None
    if x is not None:
        return rng.choice(INT_SCALAR), [x]
    return rng.choice(BOOL_SCALAR).replace("{0}", "({0} > 0)"), [b.pick()]


TENSOR_COMPARE = ("({0} > {1})", "({0} == {1})", "torch.eq({0}, {1})", "({0} <= {1})",
                  "torch.ne({0}, {1})")  # fmt: skip
AFTER = (".long()", ".int()", ".to(torch.int32)", ".to(torch.int64)", ".float()",
         ".long().sum(-1)", ".to(torch.uint8)", ".long().cumsum(-1)")  # fmt: skip


def draw_compare_cast(rng: random.Random, b: Any) -> Draw:
    """An integer cast (or count) after a comparison of two tensors."""
    x = b.pick()
    y = broadcasting_partner(rng, b, x)
    return rng.choice(TENSOR_COMPARE) + rng.choice(AFTER), [x, y]


LITERALS = (
    "({0} * 1e-12)", "({0} + 1e20)", "({0} * -0.0)", "torch.clamp({0}, min=-0.0)",
    "torch.nan_to_num({0}, nan=0.0, posinf=1e30, neginf=-1e30)", "({0} / 3e-39)",
    "torch.where({0} > 0, {0}, float('-inf'))", "({0} - float('inf'))", "({0} * 1.5e-5)",
    "torch.clamp({0}, max=65504.0)", "({0} + 0.1 + 0.2)",
)  # fmt: skip


def draw_literal(rng: random.Random, b: Any) -> Draw:
    """Float literals at the edges of their types, rendered into kernels as constants."""
    x = b.pick(is_float)
    if x is None:
        return None
    return rng.choice(LITERALS), [x]


FLOAT_PAIR = (
    "torch.hypot({0}, {1})", "torch.copysign({0}, {1})", "torch.copysign({1}, {0})", "torch.logaddexp({0}, {1})",
    "torch.logaddexp2({0}, {1})", "torch.hypot({0}.amin(-1), {1})",
)  # fmt: skip
FLOAT_SCALAR = ("torch.copysign({0}, -1.5)", "torch.copysign({0}, 0.0)",
                "torch.copysign({0}, -0.0)", "torch.copysign({0}, 2)",
                "torch.logaddexp({0}, {0})")  # fmt: skip


def draw_float_pair(rng: random.Random, b: Any) -> Draw:
    """hypot / copysign / logaddexp with a broadcasting (often size-1) partner, or copysign
    with a Python number."""
    x = prefer(rng, b, is_float, 0.85)
    if rng.random() < 0.35:
        return rng.choice(FLOAT_SCALAR), [x]
    y = broadcasting_partner(rng, b, x)
    return rng.choice(FLOAT_PAIR), [x, y]


FLOAT_DIV = (
    "torch.div({0}, {1}, rounding_mode='floor')", "torch.div({0}, {1}, rounding_mode='trunc')",
    "torch.floor_divide({0}, {1})", "torch.remainder({0}, {1})", "torch.fmod({0}, {1})",
    "({0} // 0.5)", "torch.div({0}, -2.5, rounding_mode='floor')", "({0} % -1.5)",
    "torch.div({0}, {1}.abs() + 0.5, rounding_mode=None)",
    "torch.div({0}, 0.75, rounding_mode='trunc')",
)  # fmt: skip
INT_DIV = (
    "torch.div({0}, {1}.abs() + 1, rounding_mode='floor')",
    "torch.div({0}, -({1}.abs() + 1), rounding_mode='trunc')",
    "torch.floor_divide({0}, {1}.abs() + 1)", "torch.remainder({0}, -({1}.abs() + 1))",
    "torch.fmod({0}, {1}.abs() + 1)", "torch.div({0}, -3, rounding_mode='trunc')",
    "torch.div({0}, 2)", "torch.floor_divide({0}, -2)", "({0} // -3)",
    "torch.div({0}, {1}.abs() + 2, rounding_mode='trunc')",
)  # fmt: skip


def draw_division(rng: random.Random, b: Any) -> Draw:
    """Rounding division and remainders; an integer divisor is never 0 (undefined on a GPU)."""
    x = b.pick(lambda t: t.dtype != torch.bool)
    if x is None:
        return None
    y = broadcasting_partner(rng, b, x)
    table = FLOAT_DIV if category(b.t(x)) == "float" else INT_DIV
    return rng.choice(table), [x, y]


def draw_addcmul(rng: random.Random, b: Any) -> Draw:
    """addcmul (of expanded tensors, integer ones too) / addcdiv / lerp."""
    x = b.pick(lambda t: t.dtype != torch.bool)
    if x is None:
        return None
    y = broadcasting_partner(rng, b, x)
    z = broadcasting_partner(rng, b, x)
    value = rng.choice((0.5, 2, -1, 1))
    if not is_float(b.t(x)) or rng.random() < 0.5:
        lhs = rng.choice(("{0}", "{0}.expand_as({0})"))
        return f"torch.addcmul({lhs}, {{1}}, {{2}}, value={value})", [x, y, z]
    if rng.random() < 0.5:
        return f"torch.addcdiv({{0}}, {{1}}, {{2}}.abs() + 1, value={value})", [x, y, z]
    return "torch.lerp({0}, {1}, 0.3)", [x, y]


def draw_masked_fill(rng: random.Random, b: Any) -> Draw:
    """masked_fill with a mask that broadcasts into the value (NaN, infinities, numbers)."""
    x = b.pick()
    t = b.t(x)
    shape = tuple(t.shape)
    masks = [v for v in b.values() if b.t(v).dtype == torch.bool and _fits(b.t(v), shape)]
    r = rng.random()
    if masks and r < 0.4:
        m, cond = rng.choice(masks), "{1}"
    elif r < 0.7:
        m, cond = b.new_input(partner_shape(rng, shape), torch.float32), "({1} > 0.5)"
    else:
        m, cond = x, "({1} > 0)"
    if is_float(t):
        value = rng.choice(("float('nan')", "float('-inf')", "0.0", "-1e4", "float('inf')"))
    elif t.dtype == torch.bool:
        value = rng.choice(("True", "False"))
    else:
        value = rng.choice(("0", "-1", "7"))
    return f"{{0}}.masked_fill({cond}, {value})", [x, m]


def _fits(mask: torch.Tensor, shape: tuple[int, ...]) -> bool:
    try:
        return torch.broadcast_shapes(tuple(mask.shape), shape) == shape
    except RuntimeError:
        return False


def small_dims(rng: random.Random, t: torch.Tensor) -> list[int]:
    """Dims to reduce, those of size 0, 1 or 2 preferred (variance over few elements)."""
    small = [d for d, s in enumerate(t.shape) if s <= 2]
    if small and rng.random() < 0.7:
        return rng.sample(small, rng.randint(1, min(2, len(small))))
    return pick_dims(rng, t.dim(), rng.choice((1, 2)))


def draw_var_std(rng: random.Random, b: Any) -> Draw:
    """var / std / var_mean / std_mean with correction 0, 1 or 2 over few elements, or over
    everything (keepdim at times)."""
    x = b.pick(lambda t: is_float(t) and t.dim() >= 1)
    if x is None:
        return None
    t = b.t(x)
    corr, keep = rng.choice((0, 1, 1, 2)), rng.random() < 0.5
    op = rng.choice(("var", "std", "std", "var_mean", "std_mean"))
    if rng.random() < 0.25:
        tail = "[0]" if op.endswith("_mean") else ""
        return f"torch.{op}({{0}}, correction={corr}, keepdim={keep}){tail}", [x]
    dims = tuple(small_dims(rng, t))
    tail = rng.choice(("[0]", "[1]")) if op.endswith("_mean") else ""
    if rng.random() < 0.3:
        dims = (pick_dim(rng, t.dim()),)
    return f"torch.{op}({{0}}, dim={dims}, correction={corr}, keepdim={keep}){tail}", [x]


FORMS_ARITH = (
    Form("scalar_compare", 1.2, draw_scalar_compare),
    Form("bit_scalar", 0.8, draw_bit_scalar),
    Form("compare_cast", 0.6, draw_compare_cast),
    Form("literal", 0.4, draw_literal),
    Form("float_pair", 1.2, draw_float_pair),
    Form("division", 1.2, draw_division),
    Form("addcmul", 0.5, draw_addcmul),
    Form("masked_fill", 0.7, draw_masked_fill),
    Form("var_std", 0.8, draw_var_std),
)
