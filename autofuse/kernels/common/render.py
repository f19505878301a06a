"""Rendering one IR value as Triton code, from the op table (``autofuse.ir.ops``).

Every kernel kind renders its pointwise ops and reduction steps through these functions: the
cast of operands, the op's own rendering, the reductions' identities and combines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from autofuse.ir.op_helpers import MAX, MIN, PROD, Helper
from autofuse.ir.ops import (
    TL_DTYPE,
    NoLowering,
    cast_rule,
    category,
    is_float,
    literal,
    literal_value,
    minmax,
    op_def,
    wrapped,
)
from autofuse.kernels.common.base import FusionRefused

__all__ = [
    "LOG2E",
    "TL_DTYPE",
    "Val",
    "cast",
    "combine",
    "compute_dtype",
    "exp_minus",
    "identity",
    "is_float",
    "literal",
    "minmax",
    "reduction_operand",
    "render_op",
    "row_reduce",
]


def compute_dtype(dtype: str) -> str:
    """The dtype a value is computed in: 16-bit floats in float32."""
    if dtype in ("float16", "bfloat16"):
        return "float32"
    return dtype


@dataclass
class Val:
    """A value in generated code: a variable name or a literal, its class (0 scalar, 1 row,
    2 full block) and its compute dtype."""

    code: str
    cls: int
    dtype: str
    literal: bool = False


def cast(v: Val, dtype: str) -> str:
    """``v``'s code converted to ``dtype`` (literals are written in the target's family)."""
    if v.literal and dtype == "bool":  # a Python bool is tl.int1: `int1 & 1` widens to int32
        return "False" if v.code in ("0", "0.0", "-0.0") else "True"
    if v.dtype == dtype:
        return v.code
    if v.literal:
        if is_float(dtype):  # 2 -> 2.0, 1e+30 as it is (1e+30.0 is no Python literal)
            value = literal_value(v.code)
            return v.code if value is None else literal(float(value), dtype)
        value = literal_value(v.code)  # an int in the dtype's range (wrapped, as torch)
        return str(wrapped(value, dtype)) if type(value) is int else v.code
    if dtype == "bool":
        return f"({v.code} != 0)"
    return f"{v.code}.to({TL_DTYPE[dtype]})"


def reduction_operand(src: Val, acc: str, truth: bool) -> str:
    """``src`` as a reduction's operand in ``acc``: for any / all (``truth``) its truth value
    as int32, not an integer cast; a literal (a constant reduced) as a typed block, since a
    Python int is int32 in Triton and int64's identity -2**63 beside it is out of range."""
    if truth:
        b = cast(src, "bool")
        code = str(int(b == "True")) if src.literal else f"({b}).to(tl.int32)"
    else:
        code = cast(src, acc)
    return f"tl.full([XBLOCK, RBLOCK], {code}, {TL_DTYPE[acc]})" if src.literal else code


LOG2E = 1.4426950408889634


def exp_minus(x: str, m: str) -> str:
    """``exp(x - m)`` for a per-row ``m``, as ``exp2((x - m) * log2 e)``: eager's value for
    every input. (The fused ``exp2(fma(x, log2 e, -(m * log2 e)))`` is not: ``m * log2 e``
    overflows for |m| > finfo.max / log2 e, e.g. a row masked with finfo.min, giving inf / inf,
    and its rounding, a row-wide error of up to ulp(m log2 e) / 2 in the exponent, is 512 at
    m = 1e10.)"""
    return f"tl.exp2(({x} - {m}) * {LOG2E!r})"


def _common_dtype(args: list[Val]) -> str:
    """The dtype two operands are compared in: torch's promotion of the tensors, which a
    literal (a Python number, in the dtype capture gave it) widens only to a higher category:
    a bool tensor against ``2`` compares as int64, an integer one against ``2.5`` as float."""
    tensors = [a.dtype for a in args if not a.literal] or [a.dtype for a in args]
    out = getattr(torch, tensors[0])
    for d in tensors[1:]:
        out = torch.promote_types(out, getattr(torch, d))
    for a in args:
        if a.literal and category(a.dtype) > category(str(out).removeprefix("torch.")):
            out = getattr(torch, a.dtype)
    return compute_dtype(str(out).removeprefix("torch."))


def _operands(rule: str, args: list[Val], cd: str) -> list[str]:
    if rule == "raw":
        return [a.code for a in args]
    if rule == "common":
        common = _common_dtype(args)
        return [cast(a, common) for a in args]
    if rule == "bool":
        return [cast(a, "bool") for a in args]
    if rule == "where":
        return [cast(args[0], "bool")] + [cast(a, cd) for a in args[1:]]
    target = "float32" if rule == "float32" else cd
    return [cast(a, target) for a in args]


def render_op(op: str, node, args: list[Val], helpers: set[Helper]) -> str:
    """The Triton expression of pointwise ``node`` over ``args``; adds the helpers it calls."""
    d = op_def(op)
    cd = compute_dtype(node.dtype)
    if d.triton is None:
        raise FusionRefused(f"no Triton lowering for op {op!r}")
    if args and all(a.literal for a in args) and (folded := _folded(node, args)) is not None:
        return folded
    codes = _operands(cast_rule(node), args, cd)
    if any(a.cls > 0 for a in args):
        # a bool computed once per program (a scalar) beside a block, compared with 0 again:
        # Triton's interpreter fails `block & scalar` on it (compiled code folds this away)
        codes = [
            f"({c} != 0)"
            if a.dtype == "bool" and a.cls == 0 and not a.literal and c == a.code
            else c
            for a, c in zip(args, codes)
        ]
    if d.integral_identity and not is_float(cd):
        return codes[0]  # integers are already integral: torch returns a copy
    if d.helper is not None:
        helpers.add(d.helper)
    if isinstance(d.triton, str):
        return d.triton.format(**dict(zip("abc", codes)))
    try:
        return d.triton(node, codes, cd)
    except NoLowering as e:
        raise FusionRefused(str(e)) from None


def _folded(node, args: list[Val]) -> str | None:
    """An op of constants, computed once by its eager semantics: its value in the node's
    dtype as a literal (``0.0 / 0.0`` in the kernel's source is a Python division, which
    raises where eager gives NaN); None where the op has no eager form of its operands."""
    d = op_def(node.op)
    if d.eager is None or d.indexed or d.scatter:
        return None
    try:
        xs = [torch.tensor(literal_value(a.code), dtype=getattr(torch, a.dtype)) for a in args]
        value = d.eager(node, *xs).to(getattr(torch, node.dtype)).item()
    except (SyntaxError, TypeError, ValueError, RuntimeError):
        return None  # not a Python literal, or not one of its dtype
    return literal(value, node.dtype)


_INT_RANGE = {
    "int64": (-(2**63), 2**63 - 1), "int32": (-(2**31), 2**31 - 1),
    "int16": (-(2**15), 2**15 - 1), "int8": (-128, 127), "uint8": (0, 255), "bool": (0, 1),
}  # fmt: skip


def identity(op: str, dtype: str) -> str:
    """The identity of reduction ``op`` as a literal of ``dtype``."""
    v = op_def(op).identity
    if v in ("inf", "-inf"):
        if is_float(dtype):
            return f'float("{v}")'
        lo, hi = _INT_RANGE[dtype]
        return str(lo if v == "-inf" else hi)
    return v + (".0" if is_float(dtype) else "")


def combine(op: str, acc: str, val: str, dtype: str) -> str:
    """One step of reduction ``op``: the accumulator combined with a new value."""
    c = op_def(op).combine
    if c in ("+", "*"):
        return f"{acc} {c} {val}"
    return minmax("maximum" if c == "max" else "minimum", acc, val, dtype)


_ROW_FN = {"+": "tl.sum", "max": "tl.max", "min": "tl.min"}


def row_reduce(op: str, code: str, acc_dtype: str, helpers: set[Helper]) -> str:
    """``code`` ([XBLOCK, RBLOCK]) reduced along the row to [XBLOCK, 1]."""
    c = op_def(op).combine
    helper = {"*": PROD}.get(c)
    if is_float(acc_dtype):  # a NaN in the row makes the max (min) NaN, as in torch
        helper = {"*": PROD, "max": MAX, "min": MIN}.get(c)
    if helper is not None:
        helpers.add(helper)
        return f"tl.reduce({code}, 1, {helper.name})[:, None]"
    return f"{_ROW_FN[c]}({code}, 1)[:, None]"


def kernel_header(em: Any, name: str, what: str, params: list[str]) -> list[str]:
    """The comment lines a generated kernel starts with (what it fuses, reads, writes, its
    config) and its ``@triton.jit`` signature."""
    graph, info = em.g, em.info
    return [
        f"# {name}: {len(info.nodes)} ops -> 1 kernel ({what})",
        "#   reads:  "
        + ", ".join(f"{em.ptr[i]}={graph[i].name}{list(graph[i].shape)}" for i in info.loads),
        "#   writes: "
        + ", ".join(f"{em.out_ptr[i]}={graph[i].name}{list(graph[i].shape)}" for i in info.stored),
        f"#   config: {em.cfg.label()}",
        "@triton.jit(debug=True)" if em.checked else "@triton.jit",
        f"def {name}({', '.join(params)}):",
    ]


def tile_offset(off: Any, tile: tuple[str, ...]) -> str:
    """``off`` rendered as a whole tile's offsets: a dim of size 1 (one query row, one key, a
    head dim of 1) leaves its variable out of the address, and a pointer without it would not
    take the tile's mask; ``0 * var`` (folded by the compiler) gives it the tile's shape."""
    return off.render() + "".join(f" + 0 * {v}" for v in tile if v not in off.vars)
