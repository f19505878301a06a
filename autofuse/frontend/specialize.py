"""Graphs Dynamo hands over that a static compilation cannot take as they are: symbolic sizes,
scalars read from input tensors with ``.item()``, data-dependent ops.

- Symbolic sizes: each call's concrete sizes are looked up; a miss compiles the graph for
  exactly those sizes (``SpecializedGraph.key``); sizes passed as integer inputs become
  constants of that compilation.
- ``.item()`` of a graph input (Dynamo passes a float attribute such as a dropout probability
  or ``nn.Embedding.norm_type`` as a 0-d tensor once it is not specialized, and reads it back
  with ``.item()``): the value of each call is part of the key and the read is replaced by that
  value, so the plan sees a constant (the scalar fuses like any other).
- Any other data-dependent op (``.item()`` of a computed tensor, ``nonzero``, a boolean mask
  index): AOTAutograd traces the graph with fake tensors that carry a shape environment (static
  sizes, unbacked symbols allowed), so such an op does not abort the capture; the graph that
  comes out with symbolic scalars runs in eager.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv, free_symbols

from autofuse.kernels.common.sizes import runtime_sizes, size_bucket
from autofuse.plan.buckets import ShapeBucket

__all__ = [
    "SpecializedGraph",
    "bucket_of_call",
    "dynamic_dims",
    "item_inputs",
    "needs_specializing",
    "value_key",
]

_SCOPES = itertools.count()  # one per traced graph compiled at several shapes
_ITEM_FUNCTIONS = (torch.Tensor.item, torch.ops.aten._local_scalar_dense.default)


def _is_item(node: torch.fx.Node) -> bool:
    if node.op == "call_method":
        return node.target == "item"
    return node.op == "call_function" and node.target in _ITEM_FUNCTIONS


def item_inputs(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """Positions of the graph's inputs whose value is read with ``.item()`` in the graph."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return tuple(
        k for k, p in enumerate(placeholders) if any(_is_item(u) for u in p.users)
    )  # fmt: skip


def dynamic_dims(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> tuple[Any, ...]:
    """Per input: the dims Dynamo made symbolic (a tensor's, as its trace saw them: the example
    tensors themselves can be concrete), or True for a symbolic integer; empty / False where
    it is static."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    traced = [p.meta.get("example_value", p.meta.get("val")) for p in placeholders]
    if len(traced) != len(example_inputs):
        traced = [None] * len(example_inputs)
    out: list[Any] = []
    for t, ex in zip(traced, example_inputs):
        x = t if t is not None else ex
        if isinstance(x, torch.Tensor):
            out.append(tuple(d for d, s in enumerate(x.shape) if free_symbols(s)))
        else:
            out.append(isinstance(x, torch.SymInt) and bool(free_symbols(x)))
    return tuple(out)


def bucket_of_call(args: Sequence[Any], dims: Sequence[Any], edges: Sequence[int] | None) -> tuple:
    """The shape bucket of a call: its static sizes as they are, each dynamic size by its
    bucket (``kernels.sizes.size_bucket``)."""
    out: list[Any] = [torch.is_grad_enabled()]
    for a, d in zip(args, dims):
        if isinstance(a, torch.Tensor):
            shape = tuple(size_bucket(s, edges) if k in d else s for k, s in enumerate(a.shape))
            out.append((shape, a.dtype, a.device, a.requires_grad))
        elif d is True:
            out.append(size_bucket(int(a), edges))
    return tuple(out)


def needs_specializing(gm: torch.fx.GraphModule, symbolic: bool) -> bool:
    """Whether the graph is compiled per call (symbolic sizes or input values read)."""
    return symbolic or bool(item_inputs(gm))


def value_key(value: Any) -> Any:
    """A scalar as a dictionary key (NaN equal to itself, -0.0 apart from 0.0)."""
    if isinstance(value, float):
        return ("float", value.hex() if math.isfinite(value) else repr(value))
    return (type(value).__name__, value)


def bind(gm: torch.fx.GraphModule, args: Sequence[Any], values: dict[int, Any]) -> Any:
    """A copy of ``gm`` whose inputs are the tensor arguments alone: every ``.item()`` of
    input ``k`` replaced by ``values[k]``, every non-tensor input (a size, a flag) by its
    value in ``args``."""
    out = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    placeholders = [n for n in out.graph.nodes if n.op == "placeholder"]
    for k, value in values.items():
        for use in [u for u in placeholders[k].users if _is_item(u)]:
            use.replace_all_uses_with(value)  # type: ignore[arg-type]
            out.graph.erase_node(use)
    for node, arg in zip(placeholders, args):
        if not isinstance(arg, torch.Tensor):
            node.replace_all_uses_with(arg)  # type: ignore[arg-type]
            out.graph.erase_node(node)
    for node in out.graph.nodes:  # the symbols Dynamo's trace bound, not this one's
        node.meta.pop("unbacked_bindings", None)
    out.graph.lint()
    out.recompile()
    return out


def static_fakes(args: Sequence[Any]) -> list[Any]:
    """Fake tensors with the tensors' concrete sizes in a mode with a shape environment: a
    data-dependent op traced on them yields an unbacked symbol instead of raising."""
    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=False)
    return [mode.from_tensor(a, static_shapes=True) for a in args]


class SpecializedGraph:
    """Runs a Dynamo graph through one static compilation per concrete shape (and per value
    of the inputs read with ``.item()``); ``compile(gm, fake_args)`` makes each."""

    def __init__(self, compile: Callable[[torch.fx.GraphModule, list[Any]], Callable[..., Any]],
                 gm: torch.fx.GraphModule, dims: Sequence[Any] = (),
                 buckets: Sequence[int] | None = None) -> None:  # fmt: skip
        self._compile, self.gm = compile, gm
        self.dims, self.edges = tuple(dims), sorted(buckets) if buckets else None
        self.items = item_inputs(gm)
        self.compiled: dict[tuple, Callable[..., Any]] = {}
        self.scope = next(_SCOPES)  # its shapes share a partition per graph structure

    @staticmethod
    def key(args: Sequence[Any]) -> tuple:
        out: list[Any] = [torch.is_grad_enabled()]
        for a in args:
            if isinstance(a, torch.Tensor):
                out.append((tuple(a.shape), a.stride(), a.dtype, a.device, a.requires_grad))
            else:
                out.append(value_key(a))
        return tuple(out)

    def __call__(self, *args: Any) -> Any:
        values = {k: args[k].item() for k in self.items}
        key = (self.key(args), tuple(value_key(v) for v in values.values()))
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        fn = self.compiled.get(key)
        if fn is None:
            gm = bind(self.gm, args, values)
            if any(self.dims):  # symbolic sizes: runtime-size kernels, a plan per bucket
                bucket = (bucket_of_call(args, self.dims, self.edges), key[1])
                with runtime_sizes(ShapeBucket(self.scope, bucket)):
                    fn = self._compile(gm, static_fakes(tensors))
            else:
                fn = self._compile(gm, static_fakes(tensors))
            self.compiled[key] = fn
        return fn(*tensors)
