"""ATen graphs with symbolic sizes, traced once for every shape.

A graph Dynamo made symbolic goes through AOTAutograd once, with its symbolic sizes: the
forward, backward or inference graph that comes out holds every shape Dynamo's guards admit.
:class:`SymbolicGraph` runs such a graph: each call's concrete sizes are looked up and, on a
miss, a copy of the traced graph is specialized to them (every node's fake value is its traced
size expressions at those sizes: no new trace, no decomposition, no functionalization, no op
run again) and compiled as a static graph under runtime sizes (``kernels/common/sizes.py``),
so the shapes of one graph structure share one partition and, within a bucket, one set of
loop kernels (``plan/buckets.py``).

The traced example's sizes are compiled at once, so a graph this cannot specialize falls back
while it is being traced (the backend then specializes at the Dynamo level,
``specialize.py``). A later shape that fails to specialize runs the traced graph as it is.
"""

from __future__ import annotations

import copy
import itertools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

try:  # torch >= 2.12
    from torch.fx.experimental.symbolic_shapes import guarding_hint_or_throw as _size_hint
except ImportError:  # torch 2.11: the same hint under its older name
    from torch.fx.experimental.symbolic_shapes import hint_int as _size_hint

from autofuse.kernels.common.sizes import runtime_sizes
from autofuse.plan.buckets import ShapeBucket

from .specialize import bucket_of_call, dynamic_dims, value_key

__all__ = ["SymbolicGraph", "specialized_copy"]

_SCOPES = itertools.count()  # one per symbolic graph: its shapes share a partition per structure


def _hint(value: Any) -> Any:
    """The traced example's value of a symbolic size (no guard added)."""
    return _size_hint(value) if isinstance(value, torch.SymInt) else value


def _hinted(example: Any, mode: FakeTensorMode) -> Any:
    """A fake tensor of ``example``'s traced sizes and strides in ``mode`` (a size as its
    traced value)."""
    if not isinstance(example, torch.Tensor):
        return _hint(example)
    shape = [_hint(s) for s in example.shape]
    strides = [_hint(s) for s in example.stride()]
    with mode:
        return torch.empty_strided(shape, strides, dtype=example.dtype, device=example.device)


def static_args(args: Sequence[Any], mode: FakeTensorMode) -> list[Any]:
    """The arguments as ``mode``'s fake tensors with their static sizes (sizes as they are)."""
    return [mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a
            for a in args]  # fmt: skip


def specialized_copy(gm: torch.fx.GraphModule, fakes: Sequence[Any]) -> torch.fx.GraphModule:
    """A copy of the symbolic ``gm`` whose nodes' fake values are those at ``fakes`` (static
    fake tensors and concrete sizes): a static graph of those sizes. Each value's sizes are
    the traced expressions at the inputs' sizes, or where an expression holds a symbol the
    inputs do not bind, the graph's ops run again on ``fakes``."""
    out = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    for node in out.graph.nodes:  # the symbols of the symbolic trace, not of these sizes
        node.meta.pop("unbacked_bindings", None)
    mode = _mode_of(fakes)
    try:
        bound = _bindings(out.graph, fakes)
        vals = [_at(n.meta.get("val"), bound, mode) for n in out.graph.nodes]
    except _Unbound:
        FakeTensorProp(out, mode=mode).propagate_dont_convert_inputs(*fakes)
        return out
    for node, val in zip(out.graph.nodes, vals):
        node.meta["val"] = val
    for node, fake in zip(out.graph.find_nodes(op="placeholder"), fakes):
        node.meta["val"] = fake  # the input itself (its storage offset too)
    return out


class _Unbound(Exception):
    """A traced size holds a symbol that the inputs' sizes do not bind."""


def _bindings(graph: torch.fx.Graph, fakes: Sequence[Any]) -> dict[Any, int]:
    """Each symbol that is an input's size, stride or integer value -> its value in ``fakes``."""
    out: dict[Any, int] = {}
    for node, fake in zip(graph.find_nodes(op="placeholder"), fakes):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and isinstance(fake, torch.Tensor):
            pairs = list(zip((*val.shape, *val.stride()), (*fake.shape, *fake.stride())))
        else:
            pairs = [(val, fake)]
        for sym, value in pairs:
            if isinstance(sym, torch.SymInt) and isinstance(sym.node.expr, sympy.Symbol):
                out[sym.node.expr] = sympy.Integer(int(value))
    return out


def _at(val: Any, bound: dict[Any, int], mode: FakeTensorMode) -> Any:
    """A traced fake value at the bound sizes: a size as its number, a tensor as a fake one
    of those sizes and strides, a list or tuple of them item by item."""
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        number = sympy.sympify(val.node.expr).xreplace(bound)
        if number.free_symbols:
            raise _Unbound(str(number))
        return {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(val)](number)
    if isinstance(val, torch.Tensor):
        shape = [_at(s, bound, mode) for s in val.shape]
        strides = [_at(s, bound, mode) for s in val.stride()]
        with mode:
            return torch.empty_strided(shape, strides, dtype=val.dtype, device=val.device)
    if isinstance(val, (list, tuple)):
        return type(val)(_at(v, bound, mode) for v in val)
    return val


def call_key(args: Sequence[Any]) -> tuple:
    """What a compilation is specialized to: each tensor's sizes, strides, dtype and device,
    each other argument's value."""
    return tuple((tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor)
                 else value_key(a) for a in args)  # fmt: skip


def _mode_of(fakes: Sequence[Any]) -> FakeTensorMode:
    for f in fakes:
        if isinstance(f, torch.Tensor):
            return f.fake_mode
    return FakeTensorMode(shape_env=ShapeEnv())


class SymbolicGraph:
    """Runs an ATen graph with symbolic sizes through one static compilation per concrete
    shape (see the module); ``compile(gm, fake_args)`` makes each. Calls are boxed (one list),
    or separate arguments where Dynamo wraps the result."""

    _boxed_call = True

    def __init__(self, compile: Callable[[torch.fx.GraphModule, list[Any]], Callable[..., Any]],
                 gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 buckets: Sequence[int] | None = None, strict: bool = True) -> None:  # fmt: skip
        self._compile, self.gm = compile, gm
        self._boxed_call = True  # in the instance too: Dynamo's wrapper copies __dict__
        self.dims = dynamic_dims(gm, example_inputs)
        self.edges = sorted(buckets) if buckets else None
        self.scope = ("symbolic", next(_SCOPES))
        self.compiled: dict[tuple, Callable[..., Any]] = {}
        self.failed = False
        # the traced sizes now: where ``strict``, a graph that fails raises here (while it is
        # traced, so that the caller falls back); else it runs as traced
        with unset_fake_temporarily():
            mode = FakeTensorMode(shape_env=ShapeEnv())
            hinted = [_hinted(x, mode) for x in example_inputs]
            make = self._specialize if strict else self._or_traced
            self.compiled[call_key(hinted)] = make(hinted, hinted)

    def _specialize(self, args: Sequence[Any], fakes: Sequence[Any]) -> Callable[..., Any]:
        gm = specialized_copy(self.gm, fakes)
        bucket = ShapeBucket(self.scope, bucket_of_call(args, self.dims, self.edges))
        with runtime_sizes(bucket):
            return self._compile(gm, list(fakes))

    def __call__(self, *args: Any) -> Any:
        if len(args) == 1 and type(args[0]) is list:  # boxed (graph inputs are never lists)
            args = args[0]
        key = call_key(args)
        fn = self.compiled.get(key)
        if fn is None:
            with unset_fake_temporarily():
                fakes = static_args(args, FakeTensorMode(shape_env=ShapeEnv()))
                fn = self.compiled[key] = self._or_traced(args, fakes)
        return fn(list(args)) if getattr(fn, "_boxed_call", False) else fn(*args)

    def _or_traced(self, args: Sequence[Any], fakes: Sequence[Any]) -> Callable[..., Any]:
        """The compilation at these sizes, or the traced graph as it is where it fails."""
        try:
            return self._specialize(args, fakes)
        except Exception as e:  # noqa: BLE001 - what cannot be compiled runs as traced
            if not self.failed:
                warnings.warn(f"autofuse: a graph could not be compiled at the sizes "
                              f"{[tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]}"
                              f" ({type(e).__name__}: {e}); it runs in eager there",
                              RuntimeWarning, stacklevel=3)  # fmt: skip
                self.failed = True
            return self.gm
