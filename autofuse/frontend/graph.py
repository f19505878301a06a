"""AOTAutograd graphs -> the IR, and the callable that runs a plan in their calling convention.

What an AOTAutograd forward / backward / inference graph holds that ``capture.fx_to_ir`` does
not take as it is, and what becomes of it here:

- lifted constants (``get_attr`` nodes, e.g. ``_tensor_constant0``): extra graph inputs, their
  tensors appended to every call;
- 0-d tensors on another device than the computation's (a lifted constant such as the
  ``-2.5`` of ``t[t > 0] = -2.5`` is a 0-d CPU tensor; eager takes a 0-d CPU tensor beside
  CUDA tensors): placed on the computation's device, constants once, inputs on every call;
- non-tensor placeholders (an int, a float, a ``SymInt`` already bound to a concrete value):
  specialized, each use replaced by the value of the example;
- outputs that are not tensors (``None`` gradients of integer inputs, ints): kept apart and
  returned at their position;
- saved tensors and outputs that are inputs: plain graph outputs (the IR allows an input as an
  output);
- tensors whose strides differ from the ones the graph was traced with: copied to those strides
  (inputs before the plan runs, outputs after it), since AOTAutograd and the backward graph rely
  on the traced layout.

Every other op the IR has no node for (``aten.sort``, ``aten.topk``, SDPA, ``prims`` ops...)
becomes an ``opaque`` node, which the plan runs as an eager step.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.experimental.symbolic_shapes import free_symbols

from autofuse.capture import fx_to_ir
from autofuse.ir import Graph
from autofuse.ir.pipeline import before_planning


class SymbolicShapes(ValueError):
    """The graph has sizes that are not concrete numbers (the caller specializes first)."""


def is_symbolic(value: Any) -> bool:
    """A SymInt/SymFloat/SymBool, or a tensor whose sizes or strides are symbolic."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return bool(free_symbols(value))
    if isinstance(value, torch.Tensor):
        return bool(free_symbols(value))
    return False


def concrete(value: Any) -> Any:
    """A SymInt bound to a number -> the number; anything else as it is."""
    if isinstance(value, torch.SymInt):
        return int(value)
    if isinstance(value, torch.SymFloat):
        return float(value)
    if isinstance(value, torch.SymBool):
        return bool(value)
    return value


@dataclass
class Prepared:
    """An FX graph rewritten into what ``fx_to_ir`` takes, and how to call it."""

    gm: torch.fx.GraphModule
    tensor_args: tuple[int, ...]  # positions of the caller's arguments that stay graph inputs
    constants: list[torch.Tensor]  # lifted get_attr tensors, appended after those
    outputs: tuple[tuple[str, Any], ...]  # per result: ("node", k) -> k-th IR output, ("value", v)
    out_meta: tuple[Any, ...]  # per IR output: the traced fake tensor (shape, strides)
    specialized: dict[int, Any] = field(default_factory=dict)  # argument position -> value
    device: torch.device = torch.device("cpu")  # where the computation runs
    moved: tuple[int, ...] = ()  # positions of 0-d graph inputs each call places on ``device``


def prepare(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Prepared:
    """Rewrite a copy of ``gm``: constants become inputs, non-tensor inputs become constants,
    non-tensor outputs leave the graph. Raises :class:`SymbolicShapes` on symbolic sizes."""
    gm = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    tensor_args, specialized = _specialize_inputs(gm.graph, example_inputs)
    constants = _lift_constants(gm)
    device = computation_device([example_inputs[k] for k in tensor_args] + constants)
    with unset_fake_temporarily():  # AOTAutograd calls the backend in its fake mode: a
        constants = [place(c, device) for c in constants]  # constant moved there is a fake
    moved = _place_scalar_inputs(gm.graph, device, len(tensor_args))
    _fold_symbolic_scalars(gm.graph)
    outputs, metas = _tensor_outputs(gm.graph)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    return Prepared(
        gm, tuple(tensor_args), constants, tuple(outputs), tuple(metas), specialized, device, moved
    )


def computation_device(tensors: Sequence[Any]) -> torch.device:
    """The device a graph's computation runs on: that of its first tensor that is not a 0-d
    CPU tensor (eager computes a 0-d CPU tensor with tensors of any device); CPU when all are."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and not (t.dim() == 0 and t.device.type == "cpu"):
            return t.device
    return torch.device("cpu")


def place(t: Any, device: torch.device) -> Any:
    """``t`` on ``device`` when it is a 0-d tensor elsewhere; anything else as it is (a tensor
    of more dims on another device fails in eager already, and is left to the input check)."""
    if isinstance(t, torch.Tensor) and t.dim() == 0 and t.device != device:
        return t.to(device)
    return t


def _place_scalar_inputs(
    graph: torch.fx.Graph, device: torch.device, n_args: int
) -> tuple[int, ...]:
    """The positions of the 0-d graph inputs not on ``device``, their traced values moved to it
    (the constants, after the first ``n_args`` inputs, are moved by the caller; the argument
    positions are those the caller places on every call)."""
    moved = []
    for k, node in enumerate(graph.find_nodes(op="placeholder")):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dim() != 0 or val.device == device:
            continue
        node.meta["val"] = val.to(device)
        if k < n_args:
            moved.append(k)
    return tuple(moved)


def _specialize_inputs(
    graph: torch.fx.Graph, example_inputs: Sequence[Any]
) -> tuple[list[int], dict[int, Any]]:
    """(the positions of the tensor inputs, position -> value of the non-tensor inputs, which
    leave the graph: each use replaced by the example's value)."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise ValueError(
            f"the graph has {len(placeholders)} inputs but {len(example_inputs)} examples"
        )
    tensor_args, specialized = [], {}
    for k, (node, ex) in enumerate(zip(placeholders, example_inputs)):
        val = node.meta.get("val", ex)
        if is_symbolic(val) or is_symbolic(ex):
            raise SymbolicShapes(f"input {k} ({node.name}) has symbolic sizes: {val}")
        if isinstance(ex, torch.Tensor):
            if "val" not in node.meta:
                node.meta["val"] = ex
            tensor_args.append(k)
            continue
        value = concrete(ex)
        specialized[k] = value
        node.replace_all_uses_with(value)  # type: ignore[arg-type]
        graph.erase_node(node)
    return tensor_args, specialized


def _lift_constants(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    """The ``get_attr`` tensors of ``gm``, each turned into a placeholder after the last input,
    in order of first appearance."""
    graph = gm.graph
    last = [n for n in graph.nodes if n.op == "placeholder"]
    anchor = last[-1] if last else None
    constants: list[torch.Tensor] = []
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        value = _get_attr(gm, node.target)
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"constant {node.target!r} is a {type(value).__name__}")
        if anchor is None:
            with graph.inserting_before(next(iter(graph.nodes))):
                ph = graph.placeholder(f"const_{len(constants)}")
        else:
            with graph.inserting_after(anchor):
                ph = graph.placeholder(f"const_{len(constants)}")
        anchor = ph
        ph.meta["val"] = node.meta.get("val", value)
        node.replace_all_uses_with(ph)
        graph.erase_node(node)
        constants.append(value)
    return constants


def _tensor_outputs(graph: torch.fx.Graph) -> tuple[list[tuple[str, Any]], list[Any]]:
    """(per result: ("node", k) for the k-th kept tensor output or ("value", v), the traced
    fake tensor of each kept output); the graph's output node keeps the tensors alone."""
    out_node = next(n for n in graph.nodes if n.op == "output")
    results = out_node.args[0]
    flat = list(results) if isinstance(results, (list, tuple)) else [results]
    outputs, kept, metas = [], [], []
    for r in flat:
        if isinstance(r, torch.fx.Node) and isinstance(r.meta.get("val"), torch.Tensor):
            outputs.append(("node", len(kept)))
            kept.append(r)
            metas.append(r.meta["val"])
        elif isinstance(r, torch.fx.Node):
            raise ValueError(f"output {r.name} is a {type(r.meta.get('val')).__name__}")
        else:
            outputs.append(("value", concrete(r)))
    out_node.args = (tuple(kept),)
    return outputs, metas


def _get_attr(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


_SIZE_QUERIES = {
    torch.ops.aten.sym_size.int,
    torch.ops.aten.sym_numel.default,
    torch.ops.aten.sym_stride.int,
    torch.ops.aten.sym_storage_offset.default,
}


def _fold_symbolic_scalars(graph: torch.fx.Graph) -> None:
    """Size queries on concrete shapes (``aten.sym_size.int``, ``sym_numel``...) and the
    arithmetic on them (``operator.mul``, ``operator.truediv``, ``torch.sym_float``...: any
    function that is not an ATen op) become their values."""
    for node in list(graph.nodes):
        if node.op != "call_function" or not (
            node.target in _SIZE_QUERIES or not isinstance(node.target, torch._ops.OpOverload)
        ):
            continue
        val = node.meta.get("val")
        if isinstance(val, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
            if is_symbolic(val):
                raise SymbolicShapes(f"{node.name} = {node.target} is symbolic: {val}")
            node.replace_all_uses_with(concrete(val))  # type: ignore[arg-type]
            graph.erase_node(node)


def to_ir(prepared: Prepared, cuda: bool = False) -> Graph:
    """The prepared graph in the IR, through the passes before planning (``ir/pipeline.py``:
    layouts, split reductions, values computed again)."""
    return before_planning(fx_to_ir(prepared.gm), cuda)
