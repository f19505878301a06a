"""Eager evaluation of IR nodes with PyTorch.

Used three ways: to run fallback (opaque) ops and matmuls in a plan, as the reference that every
generated kernel is checked against, and as the unfused baseline.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from autofuse.ir.graph import Graph, Node

aten = torch.ops.aten

_UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "exp2": torch.exp2, "log": torch.log,
    "log2": torch.log2, "log1p": torch.log1p, "expm1": torch.expm1, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal, "sigmoid": torch.sigmoid,
    "tanh": torch.tanh, "erf": torch.erf, "sin": torch.sin, "cos": torch.cos, "relu": torch.relu,
    "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc,
    "sign": torch.sign, "logical_not": torch.logical_not, "bitwise_not": torch.bitwise_not,
    "isnan": torch.isnan, "copy": torch.clone,
}  # fmt: skip
_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "maximum": torch.maximum, "minimum": torch.minimum, "eq": torch.eq, "ne": torch.ne,
    "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor, "bitwise_and": torch.bitwise_and,
    "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
}  # fmt: skip
_REDUCE = {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax, "amin": torch.amin}


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def eval_node(node: Node, args: Sequence[Any], device: torch.device | str = "cpu") -> Any:
    """Evaluate one node on tensors ``args`` (its inputs in order)."""
    op = node.op
    out_dtype = _dtype(node.dtype)
    if op in _UNARY:
        return _UNARY[op](args[0]).to(out_dtype)
    if op in _BINARY:
        return _BINARY[op](args[0], args[1]).to(out_dtype)
    if op == "const":
        return torch.full(node.shape, node.attr("value"), dtype=out_dtype, device=device)
    if op == "iota":
        n, start, step = node.shape[0], node.attr("start"), node.attr("step")
        return torch.arange(start, start + step * n, step, dtype=out_dtype, device=device)
    if op == "where":
        return torch.where(args[0], args[1], args[2]).to(out_dtype)
    if op == "clamp":
        return torch.clamp(args[0], node.attr("lo"), node.attr("hi")).to(out_dtype)
    if op == "pow_scalar":
        return torch.pow(args[0], node.attr("exponent")).to(out_dtype)
    if op == "cast":
        return args[0].to(out_dtype)
    if op in _REDUCE:
        return _REDUCE[op](args[0], dim=list(node.attr("dims")), keepdim=node.attr("keepdim"))
    if op == "prod":
        x = args[0]
        for d in sorted(node.attr("dims"), reverse=True):
            x = torch.prod(x, dim=d, keepdim=node.attr("keepdim"))
        return x
    if op == "reshape":
        return args[0].reshape(node.attr("shape"))
    if op == "permute":
        return args[0].permute(node.attr("dims"))
    if op == "expand":
        return args[0].expand(node.attr("shape"))
    if op == "unsqueeze":
        return args[0].unsqueeze(node.attr("dim"))
    if op == "slice":
        dim, start, step = node.attr("dim"), node.attr("start"), node.attr("step")
        return args[0].narrow(dim, 0, args[0].shape[dim])[
            (slice(None),) * dim + (slice(start, start + step * node.shape[dim], step),)
        ]
    if op == "mm":
        return torch.mm(args[0], args[1])
    if op == "bmm":
        return torch.bmm(args[0], args[1])
    if op == "opaque":
        return call_opaque(node, args, device)
    if op == "getitem":
        return args[0][node.attr("index")]
    raise ValueError(f"eager evaluation of IR op {op!r} is not implemented")


def resolve_target(target: str) -> Any:
    """'aten.cumsum.default' -> torch.ops.aten.cumsum.default."""
    ns, *rest = target.split(".")
    obj: Any = getattr(torch.ops, ns)
    for part in rest:
        obj = getattr(obj, part)
    return obj


def _decode(a: Any, tensors: Sequence[Any], device: Any) -> Any:
    if isinstance(a, tuple) and a and isinstance(a[0], str) and a[0].startswith("__"):
        tag = a[0]
        if tag == "__node__":
            return tensors[a[1]]
        if tag == "__seq__":
            items = [_decode(x, tensors, device) for x in a[2]]
            return items if a[1] == "list" else tuple(items)
        if tag == "__dtype__":
            return _dtype(a[1])
        if tag == "__device__":
            return torch.device(device)
        if tag == "__layout__":
            return torch.strided
        if tag == "__memory_format__":
            return getattr(torch, a[1].removeprefix("torch."))
    return a


def call_opaque(node: Node, args: Sequence[Any], device: Any = "cpu") -> Any:
    fn = resolve_target(node.attr("target"))
    pos = _decode(node.attr("args"), args, device)
    kw = {k: _decode(v, args, device) for k, v in node.attr("kwargs")}
    return fn(*pos, **kw)


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
