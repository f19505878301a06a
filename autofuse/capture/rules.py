"""ATen call -> IR nodes: a table of conversion rules, keyed by the ATen packet.

Each rule takes a :class:`Call` and returns the IR node it built (or None when this use of the
packet is not its to convert: the next rule of the packet is tried, then the view rules, and a
call no rule takes becomes an opaque eager step). Pointwise packets that map 1:1 to an IR op
come from the op table (``ir/ops.py``); the rules here are the ones with arguments to read.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from autofuse.ir.graph import FLOAT_DTYPES
from autofuse.ir.ops import HALF_DTYPES, aten_table, category, op_def


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Call:
    """One ATen call being converted: the builder, the packet and overload, its arguments, its
    traced value (a tensor), its dtype's name and the FX node's name."""

    b: Any
    packet: str
    overload: str
    args: tuple
    kwargs: dict
    val: Any
    out_dtype: str
    name: str

    def node(self, k: int) -> int:
        return self.b.env[self.args[k]]

    def operand(self, a: Any, suffix: str) -> int:
        """A tensor argument's node, or a constant node for a Python number: the number in the
        dtype eager converts it to (``number_dtype``), with the value that conversion gives
        (``u8 < 300`` compares with 44, ``f16 == 0.1`` with 0.0999755859375)."""
        if isinstance(a, torch.fx.Node):
            return self.b.env[a]
        dtype = number_dtype(a, self.operand_dtypes(), self.out_dtype)
        return self.b.const(converted(a, dtype, self.rounds_numbers()), dtype, self.name + suffix)

    def rounds_numbers(self) -> bool:
        """Eager rounds a float number to a 16-bit operand's dtype before comparing with it or
        selecting it (on every device); arithmetic (mul, div: every device; add, sub: CUDA)
        computes with the number as it is, in float32."""
        op = BINARY_ATEN.get(self.packet)
        return self.packet == "where" or (op is not None and op_def(op).operands == "common")

    def operand_dtypes(self) -> list[str]:
        """The dtypes of the tensors among the operands (not ``where``'s condition)."""
        values = self.args[1:] if self.packet == "where" else self.args
        nodes = [self.b.env[a] for a in values if isinstance(a, torch.fx.Node)]
        return [self.b.nodes[i].dtype for i in nodes if isinstance(i, int)]

    def like(self, op: str, inputs, **attrs) -> int:
        return self.b.like(op, tuple(inputs), self.val, self.name, **attrs)


def scalar_dtype(value: Any, out_dtype: str) -> str:
    """The dtype a Python number takes as an operand of a node of ``out_dtype``."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, float) or out_dtype in FLOAT_DTYPES:
        return out_dtype if out_dtype in FLOAT_DTYPES else "float32"
    return out_dtype if out_dtype != "bool" else "int64"


def number_dtype(value: Any, tensors: list[str], out_dtype: str) -> str:
    """The dtype eager converts Python number ``value`` to as an operand beside tensors of
    ``tensors``: their promotion, which a number widens only to a higher category (a bool
    tensor against ``2`` compares as int64, an int8 one against ``300`` as int8); an op whose
    float result comes from integer operands (true division) converts it to that float."""
    if not tensors:
        return scalar_dtype(value, out_dtype)
    common = getattr(torch, tensors[0])
    for d in tensors[1:]:
        common = torch.promote_types(common, getattr(torch, d))
    dtype = dtype_name(common)
    mine = scalar_dtype(value, "bool")  # bool, int64 or float32
    if category(mine) > category(dtype):
        dtype = "int64" if category(mine) == 1 else dtype_name(torch.get_default_dtype())
    return out_dtype if category(out_dtype) == 2 and category(dtype) < 2 else dtype


def converted(value: Any, dtype: str, round_half: bool = True) -> Any:
    """``value`` as eager converts it to ``dtype`` where that changes it: an integer wrapped
    into a narrower integer dtype, a number rounded to a 16-bit float if ``round_half``
    (float32 rounding is the kernel constant's own)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    wraps = category(dtype) == 1 and isinstance(value, int)
    if not wraps and not (round_half and dtype in HALF_DTYPES):
        return value
    try:
        return torch.tensor(value).to(getattr(torch, dtype)).item()
    except (OverflowError, RuntimeError):  # beyond int64: eager rejects it too
        return value


Rule = Callable[[Call], Any]
UNARY_ATEN = aten_table(1)  # ATen packet -> IR op, from the op table
BINARY_ATEN = aten_table(2)


def _clone(c: Call) -> Any:
    if set(c.kwargs) <= {"memory_format"}:
        return c.like("copy", (c.node(0),))
    return None


def _unary(c: Call) -> Any:
    if len(c.args) == 1 and not c.kwargs:
        return c.like(UNARY_ATEN[c.packet], (c.node(0),))
    return None


def _add_sub(c: Call) -> Any:
    if c.overload not in ("Tensor", "Scalar"):
        return None
    alpha = c.kwargs.get("alpha", c.args[2] if len(c.args) > 2 else 1)
    lhs, rhs = c.operand(c.args[0], "_c0"), c.operand(c.args[1], "_c1")
    if alpha != 1:
        k = c.b.const(alpha, scalar_dtype(alpha, c.out_dtype), c.name + "_alpha")
        shape = c.b.nodes[rhs].shape
        rhs = c.b.shaped("mul", (rhs, k), shape, c.out_dtype, c.name + "_scaled")
    return c.like(c.packet, (lhs, rhs))


def _binary(c: Call) -> Any:
    if c.overload not in ("Tensor", "Scalar", "default", "") or c.kwargs or len(c.args) != 2:
        return None
    lhs, rhs = c.operand(c.args[0], "_c0"), c.operand(c.args[1], "_c1")
    return c.like(BINARY_ATEN[c.packet], (lhs, rhs))


def _where(c: Call) -> Any:
    if c.overload != "self":
        return None
    return c.like("where", [c.operand(a, f"_c{i}") for i, a in enumerate(c.args)])


def _clamp(c: Call) -> Any:
    if c.overload not in ("default", ""):
        return None
    if c.packet == "clamp_min":
        lo, hi = c.args[1], None
    elif c.packet == "clamp_max":
        lo, hi = None, c.args[1]
    else:
        lo = c.args[1] if len(c.args) > 1 else c.kwargs.get("min")
        hi = c.args[2] if len(c.args) > 2 else c.kwargs.get("max")
    return c.like("clamp", (c.node(0),), lo=lo, hi=hi)


def _pow(c: Call) -> Any:
    if c.overload == "Tensor_Scalar" and isinstance(c.args[1], numbers.Number):
        return c.like("pow_scalar", (c.node(0),), exponent=float(c.args[1]))
    return None


def _to_copy(c: Call) -> Any:
    # a contiguous result is what the IR makes (norm backwards upcast with
    # memory_format=torch.contiguous_format); another layout stays an eager call
    fmt = c.kwargs.get("memory_format", torch.contiguous_format)
    if set(c.kwargs) <= {"dtype", "layout", "device", "memory_format"} and (
        fmt is torch.contiguous_format or (fmt is torch.preserve_format and c.val.is_contiguous())
    ):
        return c.like("cast", (c.node(0),), dtype=c.out_dtype)
    return None


def _copy(c: Call) -> Any:
    """``aten.copy(dst, src)`` of a src of dst's shape: src's values in dst's dtype (what a
    functionalized in-place op leaves: ``hardtanh_`` decomposes to ``copy_(x, clamp(x))``);
    dst's values are all overwritten, so the result does not read them."""
    if c.overload != "default" or len(c.args) < 2 or not isinstance(c.args[1], torch.fx.Node):
        return None
    src = c.node(1)
    if tuple(c.b.nodes[src].shape) != tuple(c.val.shape):
        return None  # a broadcast source stays an eager call
    if c.b.nodes[src].dtype == c.out_dtype:
        return src  # the source itself
    return c.like("cast", (src,), dtype=c.out_dtype)


def _convert_element_type(c: Call) -> Any:
    return c.like("cast", (c.node(0),), dtype=c.out_dtype)


def _full(c: Call) -> Any:
    scalar = c.packet == "scalar_tensor"
    if not scalar and len(c.args) < 2:
        return None
    value = c.args[0] if scalar else c.args[1]
    if not isinstance(value, numbers.Number):
        return None
    shape = () if scalar else tuple(c.val.shape)
    v = converted(value, c.out_dtype)  # the value eager stores (a wrapped integer)
    v = float(v) if c.out_dtype in FLOAT_DTYPES else v
    return c.b.shaped("const", (), shape, c.out_dtype, c.name, value=v)


def _arange(c: Call) -> Any:
    if c.overload not in ("start_step", "start", "default"):
        return None
    nums = [a for a in c.args if isinstance(a, numbers.Number)]
    start, step = (nums[0] if len(nums) > 1 else 0), (nums[2] if len(nums) > 2 else 1)
    if all(isinstance(v, int) for v in nums) and len(c.val.shape) == 1:
        return c.like("iota", (), start=int(start), step=int(step))
    return None


def _reduction(c: Call) -> Any:
    return _convert_reduction(
        c.b, c.packet, c.overload, c.args, c.kwargs, c.val, c.out_dtype, c.name
    )


def _max_min(c: Call) -> Any:
    if c.overload != "default" or len(c.args) != 1:
        return None
    x = c.node(0)
    dims = tuple(range(len(c.b.nodes[x].shape)))
    if not dims:  # max of a 0-d tensor: its value
        return c.like("cast", (x,), dtype=c.out_dtype)
    return c.like("amax" if c.packet == "max" else "amin", (x,), dims=dims, keepdim=False)


def _scan(c: Call) -> Any:
    """cumsum / cumprod along one dim; ``dtype=`` casts the input first, as torch does."""
    x = c.node(0)
    shape = c.b.nodes[x].shape
    if c.overload != "default" or not shape or set(c.kwargs) - {"dtype"}:
        return None
    dim = (c.args[1] if len(c.args) > 1 else c.kwargs["dim"]) % len(shape)
    if c.b.nodes[x].dtype != c.out_dtype:  # dtype= or an integer input (accumulates in int64)
        x = c.b.shaped("cast", (x,), shape, c.out_dtype, c.name + "_cast", dtype=c.out_dtype)
    return c.like(c.packet, (x,), dims=(dim,), keepdim=True)


def _arg(c: Call) -> Any:
    """argmax / argmin over one dim, or over every dim (``dim=None``: the flat index)."""
    x = c.node(0)
    ndim = len(c.b.nodes[x].shape)
    if c.overload != "default" or ndim == 0 or c.b.nodes[x].dtype == "bool":
        return None
    dim = c.args[1] if len(c.args) > 1 else c.kwargs.get("dim")
    keepdim = c.args[2] if len(c.args) > 2 else c.kwargs.get("keepdim", False)
    dims = tuple(range(ndim)) if dim is None else (dim % ndim,)
    return c.like(c.packet, (x,), dims=dims, keepdim=bool(keepdim))


def _matmul(c: Call) -> Any:
    if c.overload != "default":
        return None
    return c.like(c.packet, (c.node(0), c.node(1)))


def _addmm(c: Call) -> Any:
    if c.overload != "default" or c.kwargs.get("beta", 1) != 1 or c.kwargs.get("alpha", 1) != 1:
        return None
    a, m1, m2 = (c.node(k) for k in range(3))
    mm_shape = (c.b.nodes[m1].shape[0], c.b.nodes[m2].shape[1])
    mm = c.b.shaped("mm", (m1, m2), mm_shape, c.out_dtype, c.name + "_mm")
    return c.like("add", (mm, a))


def _view_dtype(c: Call) -> Any:
    """``x.view(dtype)``: a bitcast between dtypes of one size (bool aside: tl.int1 is not a
    byte); another size changes the last dim and stays an eager step (its values depend only
    on x's values, its last dim being contiguous, as eager requires)."""
    if c.overload != "dtype":
        return None
    x = c.node(0)
    src = c.b.nodes[x].dtype
    same_size = getattr(torch, src).itemsize == c.val.dtype.itemsize
    if src == c.out_dtype or not same_size or "bool" in (src, c.out_dtype):
        return c.like("cast", (x,), dtype=c.out_dtype) if src == c.out_dtype else None
    return c.like("bitcast", (x,), src=src)


def _table() -> dict[str, tuple[Rule, ...]]:
    rules: dict[str, tuple[Rule, ...]] = {p: (_unary,) for p in UNARY_ATEN}
    rules.update({p: (_binary,) for p in BINARY_ATEN})
    rules["clone"] = (_clone, _unary)
    rules.update(add=(_add_sub, _binary), sub=(_add_sub, _binary), where=(_where,), pow=(_pow,))
    rules.update({p: (_clamp,) for p in ("clamp", "clamp_min", "clamp_max")})
    rules.update({p: (_to_copy,) for p in ("_to_copy", "to")})
    rules["convert_element_type"] = (_convert_element_type,)
    rules["copy"] = (_copy,)
    rules.update(scalar_tensor=(_full,), full=(_full,), arange=(_arange,))
    rules.update({p: (_reduction,) for p in ("sum", "mean", "amax", "amin", "prod")})
    rules.update(max=(_max_min,), min=(_max_min,), mm=(_matmul,), bmm=(_matmul,))
    rules["addmm"] = (_addmm,)
    rules["view"] = (_view_dtype,)
    rules.update(cumsum=(_scan,), cumprod=(_scan,), argmax=(_arg,), argmin=(_arg,))
    return rules


RULES = _table()


def convert(c: Call) -> Any:
    """The node the first rule of ``c``'s packet builds, or a view, or None (opaque)."""
    for rule in RULES.get(c.packet, ()):
        out = rule(c)
        if out is not None:
            return out
    return _convert_view(c.b, c.packet, c.overload, c.args, c.val, c.name)


# ---------------------------------------------------------------------------------------------
# Reductions and views
# ---------------------------------------------------------------------------------------------


def _norm_dims(dims: Any, ndim: int) -> tuple[int, ...]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted({d % max(ndim, 1) for d in dims}))


def _convert_reduction(b, packet, overload, args, kwargs, val, out_dtype, name):
    x = b.env[args[0]]
    ndim = len(b.nodes[x].shape)
    if packet == "prod" and overload == "dim_int":
        dims, keepdim = (
            (args[1] % max(ndim, 1),),
            (args[2] if len(args) > 2 else kwargs.get("keepdim", False)),
        )
    elif overload in ("dim_IntList", "dim", "default", "IntList", ""):
        dims_arg = args[1] if len(args) > 1 else kwargs.get("dim")
        keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        dims = _norm_dims(dims_arg, ndim)
    else:
        return None
    dtype_kw = kwargs.get("dtype")
    if dtype_kw is not None and dtype_name(dtype_kw) != b.nodes[x].dtype:
        x = b.shaped(
            "cast",
            (x,),
            b.nodes[x].shape,
            dtype_name(dtype_kw),
            name + "_cast",
            dtype=dtype_name(dtype_kw),
        )
    if ndim == 0:  # a 0-d tensor (``dim`` 0 or -1 allowed): the reduction is its value
        return b.like("cast", (x,), val, name, dtype=dtype_name(val.dtype))
    return b.like(packet, (x,), val, name, dims=dims, keepdim=bool(keepdim))


def _convert_view(b, packet, overload, args, val, name):  # noqa: C901
    env = b.env
    if overload == "dtype":  # view.dtype: a bitcast (rules._view_dtype), never a reshape
        return None
    if packet in ("view", "_unsafe_view", "reshape", "alias", "detach", "lift_fresh_copy"):
        src = env[args[0]]
        return b.view("reshape", src, val.shape, name, shape=tuple(val.shape))
    if packet == "permute":
        src = env[args[0]]
        nd = len(b.nodes[src].shape)
        return b.view("permute", src, val.shape, name, dims=tuple(d % nd for d in args[1]))
    if packet in ("t", "transpose", "numpy_T"):
        src = env[args[0]]
        nd = len(b.nodes[src].shape)
        perm = list(range(nd))
        if packet == "transpose":
            d0, d1 = args[1] % nd, args[2] % nd
        else:
            d0, d1 = 0, max(nd - 1, 0)
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return b.view("permute", src, val.shape, name, dims=tuple(perm))
    if packet == "expand":
        return b.view("expand", env[args[0]], val.shape, name, shape=tuple(val.shape))
    if packet == "unsqueeze":
        src = env[args[0]]
        return b.view(
            "unsqueeze", src, val.shape, name, dim=args[1] % (len(b.nodes[src].shape) + 1)
        )
    if packet == "squeeze":
        src = env[args[0]]
        return b.view("reshape", src, val.shape, name, shape=tuple(val.shape))
    if packet == "slice" and overload == "Tensor":
        src = env[args[0]]
        shape = b.nodes[src].shape
        dim = (args[1] if len(args) > 1 else 0) % len(shape)
        start = args[2] if len(args) > 2 and args[2] is not None else 0
        step = args[4] if len(args) > 4 else 1
        start = max(start + shape[dim], 0) if start < 0 else min(start, shape[dim])
        return b.view("slice", src, val.shape, name, dim=dim, start=start, step=step)
    if packet == "select" and overload == "int":
        src = env[args[0]]
        shape = b.nodes[src].shape
        dim, index = args[1] % len(shape), args[2]
        index = index + shape[dim] if index < 0 else index
        sliced_shape = shape[:dim] + (1,) + shape[dim + 1 :]
        s = b.view("slice", src, sliced_shape, name + "_slice", dim=dim, start=index, step=1)
        return b.view("reshape", s, val.shape, name, shape=tuple(val.shape))
    if packet == "broadcast_in_dim":
        src = env[args[0]]
        shape, bdims = tuple(args[1]), tuple(args[2])
        mid = tuple(
            b.nodes[src].shape[bdims.index(d)] if d in bdims else 1 for d in range(len(shape))
        )
        r = b.view("reshape", src, mid, name + "_r", shape=mid)
        if mid == shape:
            return r
        return b.view("expand", r, shape, name, shape=shape)
    return None
