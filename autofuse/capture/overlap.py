"""In-place writes into a view whose elements share memory (``x.expand(2, 2).masked_fill_(...)``).

Eager writes such a view element by element, so later elements overwrite earlier ones in the one
location they share. Functionalization (``make_fx``'s functional pass, AOTAutograd) computes the
op out of place and scatters the result back through the view, which sums or repeats the shared
elements instead: ``aot_eager`` and Inductor return other values than eager there. A graph that
does it runs as captured, in eager (``capture`` raises :class:`TraceUnsupported` for
``optimize``; the torch.compile backend runs Dynamo's graph as it is, with a warning).
"""

from __future__ import annotations

import operator
from typing import Any

import torch

__all__ = [
    "aten_overlapping_write",
    "dynamo_overlapping_write",
    "no_op_expands_as_views",
    "shares_memory",
]

_IN_PLACE_OPERATORS = frozenset(
    getattr(operator, n)
    for n in ("iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "iand", "ior",
              "ixor", "ilshift", "irshift", "imatmul", "setitem")
)  # fmt: skip


def shares_memory(t: Any) -> bool:
    """Whether two elements of the tensor ``t`` are one memory location (a dim of more than
    one element with stride 0: an ``expand``)."""
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
        return False
    return any(size > 1 and stride == 0 for size, stride in zip(t.shape, t.stride()))


def _val(x: Any, key: str) -> Any:
    return x.meta.get(key) if isinstance(x, torch.fx.Node) else None


def aten_overlapping_write(gm: torch.fx.GraphModule) -> str | None:
    """The first in-place ATen op of the traced graph ``gm`` (before functionalization) that
    writes into a tensor whose elements share memory, named (None: none does)."""
    for n in gm.graph.nodes:
        schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
        if schema is None or not schema.is_mutable:
            continue
        for arg, value in zip(schema.arguments, n.args):
            written = arg.alias_info is not None and arg.alias_info.is_write
            if written and shares_memory(_val(value, "val")):
                return str(n.target)
    return None


def _in_place(n: torch.fx.Node) -> bool:
    if n.kwargs.get("inplace") is True:
        return True
    if n.op == "call_method":
        name = str(n.target)
        return name.endswith("_") and not name.startswith("__")
    if n.op != "call_function":
        return False
    if n.target in _IN_PLACE_OPERATORS:
        return True
    name = getattr(n.target, "__name__", "")
    return name.endswith("_") and not name.startswith("__")


def dynamo_overlapping_write(gm: torch.fx.GraphModule) -> str | None:
    """The first in-place call of Dynamo's graph ``gm`` (``x.masked_fill_``, ``x += y``,
    ``x[m] = 0``, ``relu(x, inplace=True)``) whose target tensor's elements share memory,
    named (None: none does)."""
    for n in gm.graph.nodes:
        if n.op in ("call_method", "call_function") and n.args and _in_place(n):
            if shares_memory(_val(n.args[0], "example_value")):
                return getattr(n.target, "__name__", str(n.target))
    return None


def _same_shape(n: torch.fx.Node, key: str) -> bool:
    """Whether node ``n``'s value has its first argument's shape (static sizes)."""
    out, src = _val(n, key), _val(n.args[0], key) if n.args else None
    if not isinstance(out, torch.Tensor) or not isinstance(src, torch.Tensor):
        return False
    return all(isinstance(d, int) for d in out.shape) and tuple(out.shape) == tuple(src.shape)


def no_op_expands_as_views(gm: torch.fx.GraphModule) -> int:
    """Each ``expand`` of ``gm`` to its input's own shape made a plain view of it (ATen's
    ``alias``; in Dynamo's graph ``view_as``), in place; the count. Functionalization undoes a
    write through an ``expand`` as ``base + (written - base)`` even where nothing broadcasts,
    which is NaN wherever the base holds an infinity (``x.masked_fill(m, inf).expand(x.shape)
    .relu_()``: eager gives inf); through a view it copies the written values."""
    count = 0
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is torch.ops.aten.expand.default:
            if _same_shape(n, "val"):
                n.target, n.args, n.kwargs = torch.ops.aten.alias.default, (n.args[0],), {}
                count += 1
        elif n.op == "call_method" and n.target in ("expand", "expand_as"):
            if _same_shape(n, "example_value"):
                n.target, n.args, n.kwargs = "view_as", (n.args[0], n.args[0]), {}
                count += 1
    if count:
        gm.recompile()
    return count
