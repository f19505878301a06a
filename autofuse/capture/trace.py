"""Capture: a PyTorch function or module -> the autofuse IR.

The function is traced to ATen with ``make_fx`` and a decomposition table that takes softmax,
log_softmax, layer_norm, gelu, silu and var down to primitive ops. Each ATen node then maps to
one IR node (or a few: ``addmm`` becomes ``mm`` + ``add``). View ops stay view nodes, which codegen
turns into index arithmetic. Any ATen op autofuse cannot generate code for becomes an ``opaque``
node that runs as its eager ATen op.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx

from autofuse.capture.decompositions import decomposition_table
from autofuse.capture.overlap import aten_overlapping_write, no_op_expands_as_views
from autofuse.capture.rules import Call, convert, dtype_name
from autofuse.capture.structural import convert_multi, convert_structural, mutates
from autofuse.ir.graph import FLOAT_DTYPES, Graph, Node, contiguous_strides, make_attrs
from autofuse.ir.ops import TL_DTYPE
from autofuse.ir.pipeline import before_planning

aten = torch.ops.aten
prims = torch.ops.prims


class CaptureError(ValueError):
    """A function, input or construct that autofuse cannot capture."""


class TraceUnsupported(CaptureError):
    """Code that eager and Dynamo run but a make_fx trace cannot take as a plan (a value read
    out of a tensor, a tensor the function closes over, a constant tensor of varying values):
    ``optimize`` runs it through the backend path instead."""


# ---------------------------------------------------------------------------------------------
# The captured program
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Captured:
    """A captured program: the IR plus what is needed to call it like the original function."""

    graph: Graph
    in_spec: Any  # pytree spec of the user's example inputs
    out_spec: Any  # pytree spec of the function's result
    leaf_kinds: tuple[str, ...]  # per flattened input leaf: "tensor" or "scalar"
    scalars: tuple[Any, ...]  # value of each scalar leaf, in order (the trace is specialized)
    param_names: tuple[str, ...]  # module parameters/buffers appended after the tensor inputs
    source_name: str


def _flatten_inputs(example_inputs: Sequence[Any]) -> tuple[list[Any], Any, tuple[str, ...]]:
    if isinstance(example_inputs, torch.Tensor):
        raise CaptureError(
            "example_inputs must be a tuple or list of arguments, got a single Tensor; "
            "wrap it: (x,)"
        )
    leaves, spec = pytree.tree_flatten(tuple(example_inputs))
    kinds = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            kinds.append("tensor")
        elif isinstance(leaf, (numbers.Number, bool)) or leaf is None:
            kinds.append("scalar")
        else:
            raise CaptureError(
                f"example input leaf {i} is a {type(leaf).__name__}: expected a torch.Tensor "
                "or a Python scalar"
            )
    return leaves, spec, tuple(kinds)


def check_callable(fn: Any, where: str) -> None:
    """``fn`` must be a function or an ``nn.Module`` (a clear error naming it, not a failure
    deep inside tracing)."""
    if not callable(fn):
        raise TypeError(
            f"{where}: fn must be a function or a torch.nn.Module, got {type(fn).__name__} "
            f"({fn!r:.60})"
        )


def check_real(fn: Any, example_inputs: Any, where: str) -> None:
    """Example inputs and a module's state hold data: a meta tensor has none to run or verify
    kernels on (raises :class:`CaptureError` naming it, before any capture)."""
    leaves = pytree.tree_leaves(example_inputs) if not isinstance(example_inputs, torch.Tensor) \
        else [example_inputs]  # fmt: skip
    named = [(f"example input leaf {i}", x) for i, x in enumerate(leaves)]
    if isinstance(fn, torch.nn.Module):
        named += [(f"the module's {n}", t) for n, t in (*fn.named_parameters(),
                                                         *fn.named_buffers())]  # fmt: skip
    for what, x in named:
        if isinstance(x, torch.Tensor) and x.is_meta:
            raise CaptureError(
                f"{where}: {what} is a meta tensor (shapes, no data): kernels are run and "
                "checked against eager on real tensors; give tensors on the device it will run "
                "on (cuda, or cpu for Triton's interpreter)"
            )


def capture(fn: Callable[..., Any], example_inputs: Sequence[Any]) -> Captured:
    """Trace ``fn(*example_inputs)`` to ATen and convert it to the IR."""
    check_callable(fn, "autofuse")
    leaves, in_spec, kinds = _flatten_inputs(example_inputs)
    tensors = [x for x, k in zip(leaves, kinds) if k == "tensor"]
    scalars = tuple(x for x, k in zip(leaves, kinds) if k == "scalar")
    params: dict[str, torch.Tensor] = {}
    if isinstance(fn, torch.nn.Module):
        params = dict(fn.named_parameters())
        params.update(dict(fn.named_buffers()))
    names = tuple(params)
    out_spec_box: list[Any] = []

    def flat_fn(*flat: torch.Tensor) -> list[torch.Tensor]:
        user, ps = flat[: len(tensors)], flat[len(tensors) :]
        it, sit = iter(user), iter(scalars)
        rebuilt = [next(it) if k == "tensor" else next(sit) for k in kinds]
        args = pytree.tree_unflatten(rebuilt, in_spec)
        if isinstance(fn, torch.nn.Module):
            result = torch.func.functional_call(fn, dict(zip(names, ps)), tuple(args))
        else:
            result = fn(*args)
        outs, out_spec = pytree.tree_flatten(result)
        out_spec_box.append(out_spec)
        for i, o in enumerate(outs):
            if not isinstance(o, torch.Tensor):
                raise CaptureError(
                    f"output {i} of {_fn_name(fn)} is a {type(o).__name__}: expected tensors only"
                )
        return outs

    flat_inputs = [*tensors, *(p.detach() for p in params.values())]
    try:
        with torch.no_grad():
            gm = make_fx(flat_fn, decomposition_table=decomposition_table())(*flat_inputs)
            if mutates(gm):  # in-place ops (add_, x[:, 0].mul_()): trace their functional form
                _refuse_overlapping_write(gm, fn)
                no_op_expands_as_views(gm)
                gm = _functional(gm, flat_inputs)
    except CaptureError:
        raise
    except Exception as e:  # noqa: BLE001 - re-raised with context
        _raise_eager_error(flat_fn, flat_inputs)  # fails in eager too (amax over an empty dim)
        raise TraceUnsupported(f"could not trace {_fn_name(fn)}: {type(e).__name__}: {e}") from e
    gm.graph.eliminate_dead_code()
    graph = before_planning(fx_to_ir(gm), any(t.is_cuda for t in tensors))  # ir/pipeline.py
    return Captured(
        graph=graph,
        in_spec=in_spec,
        out_spec=out_spec_box[-1],
        leaf_kinds=kinds,
        scalars=scalars,
        param_names=names,
        source_name=_fn_name(fn),
    )


def _functional(gm: torch.fx.GraphModule, flat_inputs: list) -> torch.fx.GraphModule:
    """The functional form of traced graph ``gm`` (in-place ops replaced by out-of-place ones,
    writes to inputs copied back at the end). The graph is functionalized, not the function:
    its trace ran the function as eager does, so a call that returns its input itself
    (``v.type_as(v)``, ``.float()`` of a float tensor: an alias, which functionalizing the
    function's own calls turns into a copy) left one value, and an in-place op through it
    writes that value."""
    fn_ = torch.func.functionalize(gm, remove="mutations")
    return make_fx(fn_, decomposition_table=decomposition_table())(*flat_inputs)


def _refuse_overlapping_write(gm: torch.fx.GraphModule, fn: Any) -> None:
    """Raise :class:`TraceUnsupported` where ``gm`` writes in place into a view whose elements
    share memory (``capture/overlap.py``: functionalizing it changes the values)."""
    op = aten_overlapping_write(gm)
    if op is not None:
        raise TraceUnsupported(
            f"{_fn_name(fn)} writes in place ({op}) into a view whose elements share memory "
            "(an expand); functionalizing it would change the values"
        )


def _raise_eager_error(flat_fn: Callable[..., Any], flat_inputs: list[torch.Tensor]) -> None:
    """Raise the error the function itself raises in eager on these inputs, if it does: what
    autofuse cannot trace because eager rejects it is eager's error (IndexError for amax over a
    zero-length dim), not a CaptureError."""
    try:
        with torch.no_grad():
            flat_fn(*flat_inputs)
    except CaptureError:
        return
    except Exception as eager_error:  # noqa: BLE001 - re-raised as it is
        raise eager_error from None


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


# ---------------------------------------------------------------------------------------------
# FX (ATen) -> IR
# ---------------------------------------------------------------------------------------------


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.env: dict[Any, Any] = {}  # fx node -> IR index (or tuple of indices for multi-out)

    def add(self, node: Node) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def like(self, op, inputs, val, name, /, **attrs) -> int:
        return self.add(
            Node(
                op=op,
                inputs=tuple(inputs),
                shape=tuple(val.shape),
                dtype=dtype_name(val.dtype),
                strides=tuple(val.stride()),
                attrs=make_attrs(**attrs),
                name=name,
            )
        )

    def shaped(self, op, inputs, shape, dtype, name, /, **attrs) -> int:
        shape = tuple(int(s) for s in shape)
        return self.add(
            Node(
                op,
                tuple(inputs),
                shape,
                dtype,
                contiguous_strides(shape),
                make_attrs(**attrs),
                name,
            )
        )

    def const(self, value: Any, dtype: str, name: str) -> int:
        if isinstance(value, bool):
            value = bool(value)
        elif dtype in FLOAT_DTYPES:
            value = float(value)
        else:
            value = int(value)
        return self.shaped("const", (), (), dtype, name, value=value)

    def operand(self, a: Any, dtype: str, name: str) -> int:
        if isinstance(a, torch.fx.Node):
            return self.env[a]
        return self.const(a, dtype, name)

    def view(self, op, src: int, out_shape, name, /, **attrs) -> int:
        s = self.nodes[src]
        return self.shaped(op, (src,), out_shape, s.dtype, name, **attrs)


def _packet(target: Any) -> str:
    return getattr(target, "_opname", None) or str(target).split(".")[-2]


def fx_to_ir(gm: torch.fx.GraphModule) -> Graph:
    b = _Builder()
    inputs: list[int] = []
    outputs: list[int] = []
    for fx_node in gm.graph.nodes:
        if fx_node.op == "placeholder":
            val = fx_node.meta["val"]
            idx = b.like("input", (), val, fx_node.name, index=len(inputs))
            inputs.append(idx)
            b.env[fx_node] = idx
        elif fx_node.op == "output":
            for o in pytree.tree_leaves(fx_node.args[0]):
                if not isinstance(o, torch.fx.Node) or isinstance(b.env[o], Scalar):
                    raise CaptureError(f"the function returns a non-tensor {o!r}")
                outputs.append(b.env[o])
        elif fx_node.op == "call_function":
            b.env[fx_node] = _convert(b, fx_node)
        elif fx_node.op == "get_attr":
            b.env[fx_node] = _made_constant(b, gm, fx_node)
        else:
            raise CaptureError(f"unsupported FX node kind {fx_node.op!r} ({fx_node.name})")
    return Graph(tuple(b.nodes), tuple(inputs), tuple(outputs))


def _made_constant(b: _Builder, gm: torch.fx.GraphModule, n: torch.fx.Node) -> int:
    """A tensor made inside the function from a literal (``torch.tensor(0.5)``, the value of a
    masked write ``y[m] = 0.0``: make_fx keeps it as an attribute read by ``lift_fresh_copy``)
    whose elements are all equal: a constant node of its shape. Any other attribute (a tensor
    or parameter the function closes over, which may change between calls, or a constant of
    varying values) is not baked into a plan."""
    val = gm
    for part in str(n.target).split("."):
        val = getattr(val, part)
    fresh = n.users and all(u.target in _LIFTS for u in n.users)
    if (
        fresh
        and isinstance(val, torch.Tensor)
        and dtype_name(val.dtype) in TL_DTYPE
        and val.numel() > 0
        and bool((val == val.reshape(-1)[0]).all() or val.isnan().all())
    ):
        value = val.reshape(-1)[0].item()
        return b.shaped("const", (), tuple(val.shape), dtype_name(val.dtype), n.name, value=value)
    what = "a tensor made inside the function" if fresh else "a tensor the function closes over"
    raise TraceUnsupported(
        f"{what} ({n.target!r}) cannot be baked into a plan: pass it as an input (or as a "
        "module parameter/buffer)"
    )


_LIFTS = (torch.ops.aten.lift_fresh_copy.default, torch.ops.aten.lift_fresh.default)


def _convert(b: _Builder, n: torch.fx.Node) -> Any:
    target, args, kwargs = n.target, n.args, n.kwargs
    val = n.meta.get("val")
    name = n.name
    if target is _operator_getitem():
        src = b.env[args[0]]
        if isinstance(src, tuple):
            item = src[args[1]]
            if item is None and _is_number(val):  # an int / float output (cuDNN SDPA's sizes)
                return Scalar(val)
            return item
        return b.like("getitem", (src,), val, name, index=args[1])
    if target is torch.ops.aten._assert_scalar.default:
        return _assert_scalar(b, args)
    packet = _packet(target)
    overload = getattr(target, "_overloadname", "")
    if isinstance(val, torch.Tensor) and _kernel_dtypes(n):
        out_dtype = dtype_name(val.dtype)
        converted = _convert_known(b, n, packet, overload, args, kwargs, val, out_dtype, name)
        if converted is None:
            converted = convert_structural(b, packet, overload, args, kwargs, val, out_dtype, name)
        if converted is not None:
            return converted
    elif (
        views := convert_multi(b, packet, overload, args, kwargs, val, name, _used(n))
    ) is not None:
        return views
    return _opaque(b, n)


def _assert_scalar(b: _Builder, args: tuple) -> None:
    """A runtime check on sizes or scalars (``torch._check`` on an ``.item()``, an unbacked
    size's bounds). The graph is captured for concrete values, so the condition is a constant
    here: true, it is dropped; false, it raises eager's error now. A condition still symbolic
    (read from a tensor computed in the graph) cannot be decided by a plan: the graph runs in
    eager."""
    cond = args[0]
    if isinstance(cond, torch.fx.Node):
        cond = b.env.get(cond)
        cond = cond.value if isinstance(cond, Scalar) else cond
    if not isinstance(cond, (bool, int)):
        raise CaptureError(f"a runtime assertion on a symbolic value ({args[1]!r})")
    if not cond:
        raise RuntimeError(args[1] if len(args) > 1 else "runtime assertion failed")
    return None


@dataclass(frozen=True)
class Scalar:
    """A number an op returns beside its tensors; its uses read the number itself."""

    value: Any


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, bool))


def _used(n: torch.fx.Node) -> frozenset[int]:
    """The outputs of multi-output node ``n`` that the graph reads."""
    return frozenset(u.args[1] for u in n.users if u.target is _operator_getitem())


def _operator_getitem():
    import operator

    return operator.getitem


def _kernel_dtypes(n: torch.fx.Node) -> bool:
    """Every tensor ``n`` reads and returns has a dtype kernels compute in: a call on complex
    or float8 tensors (no Triton arithmetic, or none in every Triton) runs as its eager op."""
    vals = [a.meta.get("val") for a in pytree.tree_leaves((n.args, n.kwargs)) if _is_fx(a)]
    vals.append(n.meta.get("val"))
    return all(dtype_name(v.dtype) in TL_DTYPE for v in vals if isinstance(v, torch.Tensor))


def _is_fx(a: Any) -> bool:
    return isinstance(a, torch.fx.Node)


def _convert_known(b, n, packet, overload, args, kwargs, val, out_dtype, name):
    """The IR nodes of one ATen call, by the conversion rules of its packet (``rules.py``)."""
    call = Call(b, packet, overload, tuple(args), dict(kwargs), val, out_dtype, name)
    return convert(call)


def _encode(a: Any) -> Any:
    """Encode opaque-op arguments as hashable, picklable values; tensors become node refs."""
    if isinstance(a, (list, tuple)):
        return ("__seq__", type(a).__name__, tuple(_encode(x) for x in a))
    if isinstance(a, torch.dtype):
        return ("__dtype__", dtype_name(a))
    if isinstance(a, torch.device):
        return ("__device__",)
    if isinstance(a, torch.layout):
        return ("__layout__", str(a))
    if isinstance(a, torch.memory_format):
        return ("__memory_format__", str(a))
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    if isinstance(a, complex):  # a complex scalar operand (z * 1j): plain numbers when cached
        return ("__complex__", a.real, a.imag)
    raise CaptureError(f"cannot record argument {a!r} of type {type(a).__name__}")


_ASSERTS = frozenset({"aten._assert_async.msg", "aten._assert_async.default"})


def _opaque(b: _Builder, n: torch.fx.Node) -> Any:
    tensor_inputs: list[int] = []
    layouts: list[tuple[int, ...]] = []  # each tensor input's strides in eager

    def enc(a):
        if isinstance(a, torch.fx.Node):
            idx = b.env[a]
            if isinstance(idx, Scalar):
                return idx.value
            if isinstance(idx, tuple):
                raise CaptureError(f"{n.target} reads a multi-output value directly")
            if idx not in tensor_inputs:
                tensor_inputs.append(idx)
                layouts.append(tuple(a.meta["val"].stride()))
            return ("__node__", tensor_inputs.index(idx))
        if isinstance(a, (list, tuple)):
            return ("__seq__", type(a).__name__, tuple(enc(x) for x in a))
        return _encode(a)

    target = str(n.target)
    fx_args, fx_kwargs = _of_storage_base(n) if target == _AS_STRIDED else (n.args, n.kwargs)
    args = enc(tuple(fx_args))
    kwargs = tuple(sorted((k, enc(v)) for k, v in fx_kwargs.items()))
    # an op that reads its input's memory (as_strided) gets it in eager's layout, not in the
    # contiguous one a kernel wrote it in
    laid = {"layouts": tuple(layouts)} if target in STORAGE_READERS else {}
    val = n.meta.get("val")
    if val is None and target in _ASSERTS:  # a check with no result: an eager step all the same
        val = n.args[0].meta["val"]  # described as its condition, never read
    if isinstance(val, torch.Tensor):
        return b.like(
            "opaque", tensor_inputs, val, n.name, target=target, args=args, kwargs=kwargs, **laid
        )
    if (
        isinstance(val, (tuple, list))
        and all(isinstance(v, torch.Tensor) or v is None or _is_number(v) for v in val)
        and any(isinstance(v, torch.Tensor) for v in val)
    ):
        # a multi-output op: one opaque node producing a tuple, one getitem node per output
        # (None for an output the op does not produce, e.g. an unrequested gradient)
        first = next(v for v in val if isinstance(v, torch.Tensor))
        op = b.add(
            Node(
                "opaque",
                tuple(tensor_inputs),
                tuple(first.shape),
                dtype_name(first.dtype),
                tuple(first.stride()),
                make_attrs(target=target, args=args, kwargs=kwargs, multi=len(val)),
                n.name,
            )
        )
        return tuple(
            b.like("getitem", (op,), v, f"{n.name}_{i}", index=i)
            if isinstance(v, torch.Tensor)
            else None
            for i, v in enumerate(val)
        )
    raise CaptureError(f"cannot capture {target} ({n.name}): it returns {type(val).__name__}")


_AS_STRIDED = "aten.as_strided.default"
# eager ops whose values depend on their input's strides, not only on its values
STORAGE_READERS = (_AS_STRIDED, "aten.as_strided_scatter.default", "aten.as_strided_copy.default")


def _of_storage_base(n: torch.fx.Node) -> tuple[tuple, dict]:
    """``as_strided(v, size, stride, offset)`` of a view ``v`` of a value ``base`` (a slice,
    a permute, another as_strided): the same call on ``base`` itself, which is the storage it
    reads (a view of an intermediate is rebuilt over a buffer a kernel wrote contiguous, so its
    strides and offset are not eager's; ``base`` is given its eager layout instead)."""
    src, size, stride = n.args[:3]
    offset = n.args[3] if len(n.args) > 3 else n.kwargs.get("storage_offset")
    chain = [src]
    while _is_view(chain[-1]) and chain[-1].args[0].meta["val"].dtype == src.meta["val"].dtype:
        chain.append(chain[-1].args[0])
    if chain[-1].op == "placeholder":  # views of an input: torch takes them of the input itself
        return n.args, n.kwargs
    if offset is None:  # the view's own offset in its base's storage
        offset = _replayed_offset(chain)
    if not isinstance(offset, int):  # a symbolic offset, or views not replayable: as traced
        return n.args, n.kwargs
    return (chain[-1], size, stride, offset), {}


def _replayed_offset(chain: list[torch.fx.Node]) -> int | None:
    """The storage offset of ``chain[0]``, a view of ``chain[-1]`` through the views between:
    the calls replayed on a meta tensor laid out as the base (traced values do not record
    offsets)."""
    base = chain[-1].meta["val"]
    t = torch.empty_strided(base.shape, base.stride(), dtype=base.dtype, device="meta")
    for v in reversed(chain[:-1]):
        rest = pytree.tree_leaves((v.args[1:], v.kwargs))
        if any(isinstance(a, (torch.fx.Node, torch.SymInt)) for a in rest):
            return None
        t = v.target(t, *v.args[1:], **v.kwargs)
    return t.storage_offset()


def _is_view(a: Any) -> bool:
    """``a`` is an ATen call whose result aliases its first (tensor) argument's storage."""
    target = getattr(a, "target", None)
    schema = getattr(target, "_schema", None)
    if a.op != "call_function" or schema is None or not schema.returns or not a.args:
        return False
    alias = schema.returns[0].alias_info
    return alias is not None and not alias.is_write and isinstance(a.args[0], torch.fx.Node)
