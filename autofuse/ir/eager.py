"""Eager evaluation of IR nodes with PyTorch.

Used three ways: to run fallback (opaque) ops and matmuls in a plan, as the reference that every
generated kernel is checked against, and as the unfused baseline.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch

from autofuse.ir import kept_ops  # noqa: F401 - the kept ops registered, resolvable by name
from autofuse.ir.graph import Graph, Node
from autofuse.ir.ops import HALF_DTYPES, op_def


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def eval_node(node: Node, args: Sequence[Any], device: torch.device | str = "cpu") -> Any:
    """Evaluate one node on tensors ``args`` (its inputs in order), by its op table entry."""
    return bind_node(node)(device, *args)


def same_layout(t: torch.Tensor, shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Same shape, and the same strides on every dimension longer than one."""
    if tuple(t.shape) != tuple(shape):
        return False
    return all(a == b for a, b, n in zip(t.stride(), strides, shape) if n > 1)


def restride(t: torch.Tensor, strides: Sequence[int]) -> torch.Tensor:
    """A copy of ``t`` laid out with ``strides``. A stride of 0 on a dim longer than one (an
    ``expand``: every element there one memory location) holds the values at index 0 of that
    dim, expanded: no copy writes overlapping memory."""
    shape = tuple(t.shape)
    zero = [d for d, (s, n) in enumerate(zip(strides, shape)) if s == 0 and n > 1]
    if zero:
        for d in zero:
            t = t.narrow(d, 0, 1)
        return restride(t, strides).expand(shape)
    out = torch.empty_strided(tuple(t.shape), tuple(strides), dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def conform(t: torch.Tensor, shape: tuple[int, ...], strides: tuple[int, ...]) -> torch.Tensor:
    """``t`` in the layout a kernel reads it with (``buffer_strides``): as it is when it has it,
    else copied into it."""
    return t if same_layout(t, shape, strides) else restride(t, strides)


def bind_node(node: Node) -> Callable[..., Any]:
    """``eval_node`` for one node with its op resolved once: ``f(device, *args)``."""
    op = node.op
    if op == "const":
        value, dtype = node.attr("value"), _dtype(node.dtype)
        return lambda device: torch.full(node.shape, value, dtype=dtype, device=device)
    if op == "iota":
        n, start, step = node.shape[0], node.attr("start"), node.attr("step")
        end, dtype = start + step * n, _dtype(node.dtype)
        return lambda device: torch.arange(start, end, step, dtype=dtype, device=device)
    if op == "opaque":
        fn = library_call(node.attr("target"), node.attr("layout"), node.dtype in HALF_DTYPES)
        bind = _binder(node.attr("args"), node.attr("kwargs"))

        def call(device: Any, *args: Any) -> Any:
            pos, kw = bind(args, device)
            return fn(*pos, **kw)

        if node.attr("layout") == "channels_last":  # its result in the node's strides: eager's,
            # or channels-last where it keeps them (ir/conv_layout.py)
            shape, strides = tuple(node.shape), tuple(node.strides)
            return lambda device, *args: conform(call(device, *args), shape, strides)
        layouts = node.attr("layouts")  # an op that reads memory: its inputs in eager's layout
        if layouts is None:
            return call
        return lambda device, *args: call(
            device, *(conform(t, tuple(t.shape), s) for t, s in zip(args, layouts))
        )
    if op == "getitem":
        index = node.attr("index")
        return lambda device, x: x[index]
    d = op_def(op)
    if d.eager is None:
        raise ValueError(f"eager evaluation of IR op {op!r} is not implemented")
    eager = d.eager
    view = getattr(eager, "view", None)
    if view is not None:  # x.<method>(<the node's argument>), resolved now
        call = operator.methodcaller(view[0], node.attr(view[1]))
        return lambda device, x: call(x)
    if d.kind == "pointwise":
        dtype = _dtype(node.dtype)
        return lambda device, *args: eager(node, *args).to(dtype)
    return lambda device, *args: eager(node, *args)


# overloads whose torch function has the same schema and binds its arguments in C++ without
# boxing them into a stack as the OpOverload's call does (a plan makes one call per convolution)
_BOUND = {"aten.convolution.default": torch.convolution}


def resolve_target(target: str) -> Any:
    """'aten.cumsum.default' -> torch.ops.aten.cumsum.default."""
    ns, *rest = target.split(".")
    obj: Any = getattr(torch.ops, ns)
    for part in rest:
        obj = getattr(obj, part)
    return obj


def _tagged(a: Any) -> bool:
    return isinstance(a, tuple) and bool(a) and isinstance(a[0], str) and a[0].startswith("__")


_CONSTANTS = {  # tags whose value is known when the node is bound
    "__dtype__": lambda a: _dtype(a[1]),
    "__layout__": lambda a: torch.strided,
    "__complex__": lambda a: complex(a[1], a[2]),
    "__memory_format__": lambda a: getattr(torch, a[1].removeprefix("torch.")),
}

Reader = tuple[bool, Any]  # (True, f): f(tensors, device) each call; (False, v): the constant v


def _reader(a: Any) -> Reader:
    """How an opaque op's recorded argument ``a`` becomes its value, decided once: a node's
    tensor, the run's device, a sequence of those, or a constant (made now)."""
    if not _tagged(a):
        return False, a
    tag = a[0]
    if tag == "__node__":
        k = a[1]
        return True, lambda ts, device: ts[k]
    if tag == "__device__":
        return True, lambda ts, device: torch.device(device)
    if tag == "__seq__":
        kind = list if a[1] == "list" else tuple
        parts = [_reader(x) for x in a[2]]
        template = [None if d else v for d, v in parts]
        varying = [(k, f) for k, (d, f) in enumerate(parts) if d]
        if not varying:
            return False, kind(template)
        return True, _filled(template, varying, kind)
    make = _CONSTANTS.get(tag)
    return False, (make(a) if make else a)


def _filled(template: list, varying: list, kind: type) -> Callable[..., Any]:
    """A sequence's reader: ``template`` (its constants) with each varying item read."""

    def read(ts: Sequence[Any], device: Any) -> Any:
        out = template.copy()
        for k, f in varying:
            out[k] = f(ts, device)
        return out if kind is list else tuple(out)

    return read


def _binder(pos: Any, kwargs: Sequence[tuple[str, Any]]) -> Callable[..., Any]:
    """``bind(tensors, device) -> (args, kwargs)`` for an opaque op's recorded arguments (the
    positional ones one recorded sequence), with every constant decoded once."""
    each, read = _reader(pos)
    named = [(k, *_reader(v)) for k, v in kwargs]
    fixed = {k: f for k, d, f in named if not d}
    varying = [(k, f) for k, d, f in named if d]

    def bind(ts: Sequence[Any], device: Any) -> tuple[Any, dict]:
        args = read(ts, device) if each else read
        if not varying:
            return args, fixed
        return args, {**fixed, **{k: f(ts, device) for k, f in varying}}

    return bind


# Convolutions run as library calls (cuDNN), in the layout its fast kernels take: 16-bit
# tensor-core convolutions are NHWC (channels_last), as Inductor's layout pass gives them. The
# plan's other kernels read the result in the captured (contiguous) layout, so it is copied
# back; that copy is small beside the convolution (ViT's patch embedding on the H200:
# cuDNN's NCHW kernel 715 us, the NHWC one torch.compile reaches 393 us,
# results/h200/models_a4559d9.json).
_CHANNELS_LAST = ("aten.convolution.default", "aten.convolution_backward.default")


def library_call(target: str, layout: str | None = None, half: bool = True) -> Any:
    """The callable an opaque op runs: its ATen overload; for a convolution with a ``layout``
    recorded (``ir/conv_layout.py``), on operands in that format (``channels_last``: every 4-D
    and 5-D tensor channels-last, on any device; ``contiguous``: as they come); else for a
    convolution on CUDA in 16 bits (``half``: the op's dtype may be one), on channels_last
    operands (:func:`channels_last_call`)."""
    fn = _BOUND.get(target) or resolve_target(target)
    if layout == "channels_last":  # its result as it comes: the step conforms it
        return channels_last_call(fn, only_cuda=False, every_float=True, back=False)
    if layout == "contiguous":
        return fn
    return channels_last_call(fn) if half and target in _CHANNELS_LAST else fn


_FORMATS = {4: torch.channels_last, 5: torch.channels_last_3d}


def channels_last_call(
    fn: Any, only_cuda: bool = True, every_float: bool = False, back: bool = True
) -> Any:
    """``fn`` with its 4-D 16-bit tensor arguments (with ``every_float``: its 4-D and 5-D
    floating ones) made channels-last (when on CUDA, unless ``only_cuda`` is False) and then,
    with ``back``, its 4-D and 5-D tensor results made contiguous (the layout eager gives on
    contiguous operands); a call that converts nothing is ``fn``'s own."""

    def nhwc(x: Any) -> Any:
        if not isinstance(x, torch.Tensor) or (not x.is_cuda and only_cuda):
            return x
        if every_float and x.dim() in _FORMATS and x.is_floating_point():
            return x.contiguous(memory_format=_FORMATS[x.dim()])
        if x.dim() == 4 and x.dtype in _HALF:
            return x.contiguous(memory_format=torch.channels_last)
        return x

    def contiguous(y: Any) -> Any:
        if back and isinstance(y, torch.Tensor) and y.dim() in _FORMATS:
            return y.contiguous()
        return y

    def call(*args: Any, **kwargs: Any) -> Any:
        new = [nhwc(a) for a in args]
        if all(a is b for a, b in zip(new, args)):  # nothing converted: eager's own call
            return fn(*args, **kwargs)
        out = fn(*new, **{k: nhwc(v) for k, v in kwargs.items()})
        if isinstance(out, (tuple, list)):
            return tuple(contiguous(y) for y in out)
        return contiguous(out)

    return call


_HALF = (torch.bfloat16, torch.float16)


def run_graph(graph: Graph, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Evaluate the whole graph eagerly: the reference semantics of the IR."""
    if len(inputs) != len(graph.inputs):
        raise ValueError(f"graph takes {len(graph.inputs)} inputs, got {len(inputs)}")
    env: dict[int, Any] = {}
    device = inputs[0].device if inputs else "cpu"
    for idx, x in zip(graph.inputs, inputs):
        env[idx] = x
    for i, node in enumerate(graph.nodes):
        if i in env:
            continue
        env[i] = eval_node(node, [env[j] for j in node.inputs], device)
    return [env[j] for j in graph.outputs]
