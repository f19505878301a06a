"""The op table: one frozen entry per IR op.

An entry holds everything about its op in one place: its IR kind, the ATen packets it is
captured from, its eager (torch) semantics, its Triton rendering (and the helper function that
rendering calls, if any), and its weight in the analytical cost model. Capture, eager evaluation,
codegen and the cost model all read this table; adding a pointwise op is one entry here plus its
test.

Rendering: ``triton`` is a format string over the operand codes (``{a}``, ``{b}``, ``{c}``, each
already cast as ``operands`` says) or a function ``(node, codes, dtype) -> str`` for ops whose
code depends on attributes or dtypes. ``operands`` names the cast rule: ``"compute"`` (the
node's compute dtype), ``"common"`` (torch's promotion of the operands, for comparisons),
``"bool"`` (logical ops), ``"where"`` (a bool condition, then compute-dtype values), ``"raw"``
(no cast).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from autofuse.ir.op_helpers import EXPM1, HYPOT, IPOW, LOG1P, ROUND, TANH, Helper

FLOAT_DTYPES = frozenset({"float32", "float16", "bfloat16", "float64"})
HALF_DTYPES = frozenset({"float16", "bfloat16"})  # the 16-bit float dtypes
KINDS = ("input", "pointwise", "reduction", "view", "matmul", "opaque")


@dataclass(frozen=True)
class OpDef:
    """One IR op: kind, ATen origin, eager semantics, Triton rendering, cost weight."""

    name: str
    kind: str
    arity: int = 1
    aten: tuple[str, ...] = ()  # ATen packets captured 1:1 as this op (pointwise ops)
    eager: Callable[..., Any] | None = None  # (node, *input tensors) -> tensor
    triton: str | Callable[[Any, list[str], str], str] | None = None
    operands: str = "compute"
    helper: Helper | None = None
    cost: float = 1.0  # modeled operations per element (transcendentals and divisions: 4)
    integral_identity: bool = False  # floor/ceil/round/trunc: an integer input is returned as is
    # reductions: identity value ("0", "1", "-inf", "inf") and the combine of two partials
    identity: str | None = None
    combine: str | None = None  # "+", "*", "max", "min"
    # reductions whose input counts as a bool (any / all): reduced as int32 0 / 1
    bool_input: bool = False
    # ops whose value selects where to read its inputs (cat, take, gather): the emitter's
    # ``kernels/common/indexed.py`` renders them (``triton`` only refuses a direct rendering)
    indexed: bool = False
    # reductions whose value is not the row's combine but (kernels/common/rowops.py): ``scan``, the
    # running combine along the reduced dim (cumsum, cumprod: the input's shape); ``arg``, the
    # int64 index of the row's first winner under ``combine`` (argmax, argmin; a NaN wins)
    scan: bool = False
    arg: bool = False
    # ops whose value is written, not read, at indexed places (kernels/scatter/kind.py): the output
    # buffer starts as zeros and the kernel iterates over the values' domain
    scatter: bool = False
    # ops with index operands: (graph, node) -> (index input, size of the dim its values
    # index) per index operand (verification draws those inputs in range)
    index_operands: Callable[[Any, Any], list[tuple[int, int]]] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"op {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")


# ---------------------------------------------------------------------------------------------
# Renderings that depend on attributes or dtypes
# ---------------------------------------------------------------------------------------------

TL_DTYPE = {
    "float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16",
    "float64": "tl.float64", "int64": "tl.int64", "int32": "tl.int32", "int16": "tl.int16",
    "int8": "tl.int8", "uint8": "tl.uint8", "bool": "tl.int1",
}  # fmt: skip


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def category(dtype: str) -> int:
    """Torch's type-promotion category of ``dtype``: 0 bool, 1 integer, 2 floating (a Python
    number or a 0-d tensor widens a promotion only to a higher category)."""
    return 0 if dtype == "bool" else 2 if is_float(dtype) else 1


def literal(value: Any, dtype: str) -> str:
    """A Python literal of ``value`` for Triton source, in ``dtype``'s family."""
    if isinstance(value, bool) or dtype == "bool":
        return "1" if value else "0"
    if is_float(dtype):
        v = float(value)
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        if math.isnan(v):
            return 'float("nan")'
        return repr(v)
    return str(wrapped(int(value), dtype))


_INT_BITS = {"int64": 64, "int32": 32, "int16": 16, "int8": 8, "uint8": 8}


def wrapped(v: int, dtype: str) -> int:
    """``v`` in integer ``dtype``'s range, wrapped around as torch casts a Python int scalar
    (an int32 tensor + 2**40 adds 0; Triton refuses a literal out of its operand's range)."""
    bits = _INT_BITS.get(dtype)
    if bits is None:
        return v
    v &= (1 << bits) - 1
    return v - (1 << bits) if dtype != "uint8" and v >= 1 << (bits - 1) else v


_SPECIAL = {'float("inf")': math.inf, 'float("-inf")': -math.inf, 'float("nan")': math.nan}


def literal_value(code: str) -> Any:
    """The number a literal's code writes (``literal``'s forms, and True / False), else None
    (a variable or an expression)."""
    if code in _SPECIAL:
        return _SPECIAL[code]
    try:
        value = ast.literal_eval(code)
    except (SyntaxError, ValueError):
        return None
    return value if isinstance(value, (bool, int, float)) else None


def minmax(op: str, a: str, b: str, dtype: str) -> str:
    """tl.maximum / tl.minimum; for floats a NaN wins, as in torch."""
    nan = ", propagate_nan=tl.PropagateNan.ALL" if is_float(dtype) else ""
    return f"tl.{op}({a}, {b}{nan})"


def _relu(node: Any, c: list[str], dt: str) -> str:
    return minmax("maximum", c[0], "0.0" if is_float(dt) else "0", dt)


def _sign(node: Any, c: list[str], dt: str) -> str:
    return f"({c[0]} > 0).to({TL_DTYPE[dt]}) - ({c[0]} < 0).to({TL_DTYPE[dt]})"


def _bitwise_not(node: Any, c: list[str], dt: str) -> str:
    # ~ of a bool is logical not (tl.int1's ~ is not); &, |, ^ on bools take tl.int1 operands
    # (the compute dtype is bool) and are logical already
    return f"{c[0]} == 0" if dt == "bool" else f"~{c[0]}"


def _add(node: Any, c: list[str], dt: str) -> str:
    # bool + bool is logical or in torch (True + True is True); tl.int1 addition wraps to 0
    return f"{c[0]} | {c[1]}" if dt == "bool" else f"{c[0]} + {c[1]}"


def _copysign(node: Any, c: list[str], dt: str) -> str:
    # |a| with b's sign bit (so -0.0 and a negative NaN give a negative result, as torch); a
    # literal operand (a Python number has no bitcast) is decided here
    a, b = literal_value(c[0]), literal_value(c[1])
    if a is not None:
        a = literal(abs(float(a)), dt)
    mag = f"tl.abs({c[0]})" if a is None else a
    if b is not None:
        return mag if math.copysign(1.0, float(b)) > 0 else f"-{mag}"
    bits = "tl.int64" if dt == "float64" else "tl.int32"
    return f"tl.where({c[1]}.to({bits}, bitcast=True) < 0, -{mag}, {mag})"


def _clamp(node: Any, c: list[str], dt: str) -> str:
    out = c[0]
    if node.attr("lo") is not None:
        out = minmax("maximum", out, literal(node.attr("lo"), dt), dt)
    if node.attr("hi") is not None:
        out = minmax("minimum", out, literal(node.attr("hi"), dt), dt)
    return out


class NoLowering(Exception):
    """An op (or this use of it) has no Triton rendering; codegen refuses the group."""


def _pow(node: Any, c: list[str], dt: str) -> str:
    a, e = c[0], node.attr("exponent")
    if not math.isfinite(e):  # C's pow special cases (|x| = 1, x < 0, NaN): eager's op
        raise NoLowering(f"pow by {e}: no Triton lowering")
    if not is_float(dt):
        if not (e == int(e) and e >= 0):
            raise NoLowering(f"pow of an integer tensor by {e}: no Triton lowering")
        return f"_af_ipow({a}, {int(e)})"  # wraps around in the dtype, as torch
    if e == 0.5:
        return f"tl.sqrt({a})"
    if e == -0.5:
        return f"tl.rsqrt({a})"
    if e == int(e) and abs(e) <= 8:
        n = int(abs(e))
        if n == 0:
            return f"({a} * 0.0 + 1.0)"
        prod = " * ".join([a] * n)
        return f"({prod})" if e > 0 else f"(1.0 / ({prod}))"
    if e == int(e):
        mag = f"tl.exp2({e!r} * tl.log2(tl.abs({a})))"
        return f"tl.where(({a} < 0) & ({int(e) % 2} == 1), -{mag}, {mag})"
    return f"tl.exp2({e!r} * tl.log2({a}))"


def _bitcast(node: Any, c: list[str], dt: str) -> str:
    # x.view(dtype) between dtypes of one size: the source's stored bits (a 16-bit float
    # arrives in float32: rounded back to its storage type first), read as the target's
    src, dst = node.attr("src"), node.dtype
    bits = f"{c[0]}.to({TL_DTYPE[src]})" if src in ("float16", "bfloat16") else c[0]
    out = f"{bits}.to({TL_DTYPE[dst]}, bitcast=True)"
    return out if dst == dt else f"{out}.to({TL_DTYPE[dt]})"


def _cast(node: Any, c: list[str], dt: str) -> str:
    # the operand arrives in float32 for 16-bit targets: round through the storage type, as
    # eager does; other targets arrive already cast to the compute dtype
    target = node.attr("dtype")
    if target in ("float16", "bfloat16"):
        return f"{c[0]}.to({TL_DTYPE[target]}).to(tl.float32)"
    return c[0]


def _cast_operands(node: Any) -> str:
    return "float32" if node.attr("dtype") in ("float16", "bfloat16") else "compute"


# ---------------------------------------------------------------------------------------------
# Eager semantics that are not one torch function
# ---------------------------------------------------------------------------------------------


def _eager_clamp(node: Any, x: torch.Tensor) -> torch.Tensor:
    return torch.clamp(x, node.attr("lo"), node.attr("hi"))


def _eager_pow(node: Any, x: torch.Tensor) -> torch.Tensor:
    return torch.pow(x, node.attr("exponent"))


def _eager_prod(node: Any, x: torch.Tensor) -> torch.Tensor:
    for d in sorted(node.attr("dims"), reverse=True):
        x = torch.prod(x, dim=d, keepdim=node.attr("keepdim"))
    return x


def _eager_scan(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def run(node: Any, x: torch.Tensor) -> torch.Tensor:
        return fn(x, node.attr("dims")[0]).to(getattr(torch, node.dtype))

    return run


def _eager_arg(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def run(node: Any, x: torch.Tensor) -> torch.Tensor:
        dims, keepdim = node.attr("dims"), node.attr("keepdim")
        if len(dims) == 1:
            return fn(x, dim=dims[0], keepdim=keepdim)
        return fn(x, keepdim=keepdim)  # every dim (argmax with dim=None): the flat index

    return run


def _plain(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """An eager function of the tensors alone (the node's attributes do not matter)."""

    def run(node: Any, *args: torch.Tensor) -> torch.Tensor:
        return fn(*args)

    run.__name__ = getattr(fn, "__name__", "op")
    return run


def _view(method: str, attr: str) -> Callable[..., torch.Tensor]:
    def run(node: Any, x: torch.Tensor) -> torch.Tensor:
        return getattr(x, method)(node.attr(attr))

    run.view = (method, attr)  # type: ignore[attr-defined]  # eager.bind_node binds it once
    return run


def _eager_bitcast(node: Any, x: torch.Tensor) -> torch.Tensor:
    return x.view(getattr(torch, node.dtype))


def _eager_slice(node: Any, x: torch.Tensor) -> torch.Tensor:
    dim, start, step = node.attr("dim"), node.attr("start"), node.attr("step")
    return x[(slice(None),) * dim + (slice(start, start + step * node.shape[dim], step),)]


def _eager_cat(node: Any, *xs: torch.Tensor) -> torch.Tensor:
    return torch.cat(xs, node.attr("dim"))


def _eager_take(
    node: Any, src: torch.Tensor, idx: torch.Tensor, *more: torch.Tensor
) -> torch.Tensor:
    """``src`` indexed along ``dim`` by the index tensor (``x[..., idx]``, embedding,
    index_select): shape src[:dim] + idx + src[dim + 1:]; ``wrap``: negative indices count
    from the end (advanced indexing), else they are out of range (embedding, index_select).
    Several index tensors (``dims``): ``x[i0, :, i1]``, broadcast together, as torch."""
    if more:
        full: list = [None] * src.dim()
        for d, t in zip(node.attr("dims"), (idx, *more)):
            full[d] = t
        return torch.ops.aten.index.Tensor(src, full)
    d = node.attr("dim")
    if node.attr("wrap"):
        idx = torch.where(idx < 0, idx + src.shape[d], idx)
    flat = torch.index_select(src, d, idx.reshape(-1))
    return flat.reshape(src.shape[:d] + idx.shape + src.shape[d + 1 :])


def _eager_gather(node: Any, src: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return torch.gather(src, node.attr("dim"), idx)


def _eager_scatter(node: Any, values: torch.Tensor, *idxs: torch.Tensor) -> torch.Tensor:
    """A fresh zero tensor of the node's shape with ``values`` put (``accumulate``: added) at
    the indexed places: ``along`` a dim as torch.scatter / scatter_add (one index tensor of
    the values' domain), else as index_put with index tensors at ``dims``."""
    out = torch.zeros(node.shape, dtype=getattr(torch, node.dtype), device=values.device)
    values, acc = values.to(out.dtype), node.attr("accumulate")
    if node.attr("along") is not None:
        d, idx = node.attr("along"), idxs[0]
        values = values.expand(idx.shape) if values.dim() == 0 else values
        return out.scatter_add_(d, idx, values) if acc else out.scatter_(d, idx, values)
    full: list = [None] * len(node.shape)
    for d, t in zip(node.attr("dims"), idxs):
        full[d] = t
    return torch.ops.aten.index_put(out, full, values, acc)


def _read_index_operands(graph: Any, node: Any) -> list[tuple[int, int]]:
    """take / gather: each index tensor indexes a dim of the source (input 0)."""
    src = graph[node.inputs[0]].shape
    dims = node.attr("dims") if len(node.inputs) > 2 else (node.attr("dim"),)
    return [(j, src[d]) for j, d in zip(node.inputs[1:], dims)]


def _write_index_operands(graph: Any, node: Any) -> list[tuple[int, int]]:
    """scatter: each index tensor indexes a dim of the output."""
    along = node.attr("along")
    dims = (along,) if along is not None else node.attr("dims")
    return [(j, node.shape[d]) for j, d in zip(node.inputs[1:], dims)]


def _indexed(node: Any, c: list[str], dt: str) -> str:
    raise NoLowering(f"{node.op} is rendered from its index (kernels/common/indexed.py)")


def _eager_bool_reduce(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def run(node: Any, x: torch.Tensor) -> torch.Tensor:
        for d in sorted(node.attr("dims"), reverse=True):
            x = fn(x, dim=d, keepdim=node.attr("keepdim"))
        return x

    return run


def _reduce(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def run(node: Any, x: torch.Tensor) -> torch.Tensor:
        return fn(x, dim=list(node.attr("dims")), keepdim=node.attr("keepdim"))

    return run


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------


def _unary(name, triton, eager, *, aten=None, cost=1.0, helper=None, **kw) -> OpDef:
    aten = (name,) if aten is None else aten
    return OpDef(name, "pointwise", 1, aten, _plain(eager), triton, helper=helper, cost=cost, **kw)


def _binary(name, triton, eager, *, aten=None, operands="compute", cost=1.0, helper=None):
    aten = (name,) if aten is None else aten
    return OpDef(name, "pointwise", 2, aten, _plain(eager), triton, operands, helper, cost)


def _compare(name: str, sym: str, fn: Callable) -> OpDef:
    return _binary(name, "{a} " + sym + " {b}", fn, operands="common")


def _logical(name: str, sym: str, fn: Callable) -> OpDef:
    return _binary(name, "{a} " + sym + " {b}", fn, operands="bool")


SFU = 4.0  # modeled cost of a transcendental or a division, in simple-op units

_ENTRIES: tuple[OpDef, ...] = (
    OpDef("input", "input", 0),
    # unary pointwise
    _unary("neg", "-{a}", torch.neg),
    _unary("abs", "tl.abs({a})", torch.abs),
    _unary("exp", "tl.exp({a})", torch.exp, cost=SFU),
    _unary("exp2", "tl.exp2({a})", torch.exp2, cost=SFU),
    _unary("log", "tl.log({a})", torch.log, cost=SFU),
    _unary("log2", "tl.log2({a})", torch.log2, cost=SFU),
    _unary("log1p", "_af_log1p({a})", torch.log1p, cost=SFU, helper=LOG1P),
    _unary("expm1", "_af_expm1({a})", torch.expm1, cost=SFU, helper=EXPM1),
    _unary("sqrt", "tl.sqrt({a})", torch.sqrt, cost=SFU),
    _unary("rsqrt", "tl.rsqrt({a})", torch.rsqrt, cost=SFU),
    _unary("reciprocal", "(1.0 / {a})", torch.reciprocal, cost=SFU),
    _unary("sigmoid", "tl.sigmoid({a})", torch.sigmoid, cost=SFU),
    _unary("tanh", "_af_tanh({a})", torch.tanh, cost=SFU, helper=TANH),
    _unary("erf", "tl.erf({a})", torch.erf, cost=SFU),
    _unary("sin", "tl.sin({a})", torch.sin, cost=SFU),
    _unary("cos", "tl.cos({a})", torch.cos, cost=SFU),
    _unary("relu", _relu, torch.relu),
    _unary("floor", "tl.floor({a})", torch.floor, integral_identity=True),
    _unary("ceil", "tl.ceil({a})", torch.ceil, integral_identity=True),
    _unary("round", "_af_round({a})", torch.round, helper=ROUND, integral_identity=True),
    _unary(
        "trunc",
        "tl.where({a} < 0, tl.ceil({a}), tl.floor({a}))",
        torch.trunc,
        integral_identity=True,
    ),
    _unary("sign", _sign, torch.sign),
    _unary("logical_not", "{a} == 0", torch.logical_not, operands="bool"),
    _unary("bitwise_not", _bitwise_not, torch.bitwise_not),
    _unary("isnan", "{a} != {a}", torch.isnan, operands="raw"),
    _unary("copy", "{a}", torch.clone, aten=("clone",)),
    # binary pointwise
    _binary("add", _add, torch.add),
    _binary("sub", "{a} - {b}", torch.sub),
    _binary("mul", "{a} * {b}", torch.mul),
    _binary("div", "{a} / {b}", torch.div, cost=SFU),
    _binary("maximum", lambda n, c, dt: minmax("maximum", c[0], c[1], dt), torch.maximum),
    _binary("minimum", lambda n, c, dt: minmax("minimum", c[0], c[1], dt), torch.minimum),
    _binary("hypot", "_af_hypot({a}, {b})", torch.hypot, cost=2 * SFU, helper=HYPOT),
    _binary("copysign", _copysign, torch.copysign),
    _compare("eq", "==", torch.eq),
    _compare("ne", "!=", torch.ne),
    _compare("lt", "<", torch.lt),
    _compare("le", "<=", torch.le),
    _compare("gt", ">", torch.gt),
    _compare("ge", ">=", torch.ge),
    _logical("logical_and", "&", torch.logical_and),
    _logical("logical_or", "|", torch.logical_or),
    _logical("logical_xor", "^", torch.logical_xor),
    _binary("bitwise_and", "{a} & {b}", torch.bitwise_and),
    _binary("bitwise_or", "{a} | {b}", torch.bitwise_or),
    _binary("bitwise_xor", "{a} ^ {b}", torch.bitwise_xor),
    # pointwise ops with attributes (captured by their own rules in capture/)
    OpDef("where", "pointwise", 3, (), _plain(torch.where), "tl.where({a}, {b}, {c})", "where"),
    OpDef("clamp", "pointwise", 1, (), _eager_clamp, _clamp),
    OpDef("pow_scalar", "pointwise", 1, (), _eager_pow, _pow, cost=SFU, helper=IPOW),
    OpDef("cast", "pointwise", 1, (), _plain(lambda x: x), _cast, "cast"),
    OpDef("bitcast", "pointwise", 1, (), _eager_bitcast, _bitcast, "raw"),
    OpDef("const", "pointwise", 0),
    OpDef("iota", "pointwise", 0),
    # values that select where to read their inputs (kernels/common/indexed.py)
    OpDef("cat", "pointwise", 0, (), _eager_cat, _indexed, "raw", indexed=True),
    OpDef(
        "take",
        "pointwise",
        2,
        (),
        _eager_take,
        _indexed,
        "raw",
        indexed=True,
        index_operands=_read_index_operands,
    ),
    OpDef(
        "gather",
        "pointwise",
        2,
        (),
        _eager_gather,
        _indexed,
        "raw",
        indexed=True,
        index_operands=_read_index_operands,
    ),
    # values put / added at indexed places of a zero tensor (index_put, scatter, scatter_add)
    OpDef(
        "scatter",
        "pointwise",
        0,
        (),
        _eager_scatter,
        _indexed,
        "raw",
        scatter=True,
        index_operands=_write_index_operands,
    ),
    # reductions
    OpDef("sum", "reduction", 1, (), _reduce(torch.sum), identity="0", combine="+"),
    OpDef("mean", "reduction", 1, (), _reduce(torch.mean), identity="0", combine="+"),
    OpDef("amax", "reduction", 1, (), _reduce(torch.amax), identity="-inf", combine="max"),
    OpDef("amin", "reduction", 1, (), _reduce(torch.amin), identity="inf", combine="min"),
    OpDef("prod", "reduction", 1, (), _eager_prod, identity="1", combine="*"),
    # bool reduction: the input's truth value as int32 0 / 1, reduced by max (all() is
    # captured as not any(not x))
    OpDef(
        "any",
        "reduction",
        1,
        (),
        _eager_bool_reduce(torch.any),
        identity="0",
        combine="max",
        bool_input=True,
    ),  # fmt: skip
    # scans along one dim (the input's shape) and the index of a row's max / min
    OpDef(
        "cumsum",
        "reduction",
        1,
        (),
        _eager_scan(torch.cumsum),
        identity="0",
        combine="+",
        scan=True,
    ),
    OpDef(
        "cumprod",
        "reduction",
        1,
        (),
        _eager_scan(torch.cumprod),
        identity="1",
        combine="*",
        scan=True,
    ),
    OpDef(
        "argmax",
        "reduction",
        1,
        (),
        _eager_arg(torch.argmax),
        identity="-inf",
        combine="max",
        arg=True,
    ),
    OpDef(
        "argmin",
        "reduction",
        1,
        (),
        _eager_arg(torch.argmin),
        identity="inf",
        combine="min",
        arg=True,
    ),
    # views
    OpDef("permute", "view", 1, (), _view("permute", "dims")),
    OpDef("expand", "view", 1, (), _view("expand", "shape")),
    OpDef("reshape", "view", 1, (), _view("reshape", "shape")),
    OpDef("unsqueeze", "view", 1, (), _view("unsqueeze", "dim")),
    OpDef("squeeze", "view", 1, (), _view("reshape", "shape")),
    OpDef("slice", "view", 1, (), _eager_slice),
    # matmuls
    OpDef("mm", "matmul", 2, (), _plain(torch.mm)),
    OpDef("bmm", "matmul", 2, (), _plain(torch.bmm)),
    # ops that run as their eager ATen call
    OpDef("opaque", "opaque"),
    OpDef("getitem", "opaque"),
)

OPS: Mapping[str, OpDef] = {d.name: d for d in _ENTRIES}


def op_def(op: str) -> OpDef:
    d = OPS.get(op)
    if d is None:
        raise ValueError(f"unknown IR op {op!r}")
    return d


def ops_of_kind(kind: str) -> frozenset[str]:
    return frozenset(d.name for d in _ENTRIES if d.kind == kind)


def aten_table(arity: int) -> dict[str, str]:
    """ATen packet -> IR op, for the pointwise ops of ``arity`` that are captured 1:1."""
    return {
        a: d.name for d in _ENTRIES if d.arity == arity and d.kind == "pointwise" for a in d.aten
    }


def cast_rule(node: Any) -> str:
    """How a node's operands are cast before its rendering (``OpDef.operands``)."""
    d = op_def(node.op)
    return _cast_operands(node) if d.operands == "cast" else d.operands
