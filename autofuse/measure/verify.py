"""Verification: a candidate kernel against a float64 eager reference, on fresh random inputs,
with poisoned outputs (every element must be written) and dtype-aware tolerances."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from autofuse.bounds import bounds_error
from autofuse.interpreter import interpreting
from autofuse.ir.eager import conform, eval_node, run_graph
from autofuse.ir.graph import FLOAT_DTYPES, Graph, Node, buffer_strides
from autofuse.ir.ops import OPS, op_def
from autofuse.ir.tolerance import TOLERANCES, compare
from autofuse.kernels import GroupInfo, Kernel
from autofuse.measure.candidate import (
    Candidate,
    describe_error,
)
from autofuse.plan.runtime import allocate_outputs, launch

# ---------------------------------------------------------------------------------------------
# Kernels, inputs, reference, comparison
# ---------------------------------------------------------------------------------------------


def build_kernel(candidate: Candidate) -> tuple[Graph, GroupInfo, Kernel]:
    """The candidate's kernel on its standalone subgraph (or the override), rendered once per
    candidate (:attr:`Candidate.built`)."""
    return candidate.built


def _torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _extent(shape: Sequence[int], strides: Sequence[int]) -> int:
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * abs(st) for s, st in zip(shape, strides))


def random_tensor(
    node: Node, device: Any, generator: torch.Generator, index_bound: int | None = None
) -> torch.Tensor:
    """Random values laid out with ``node``'s strides: floats N(0, 1), bools fair coins, ints
    small nonzero values (never all zeros, so a kernel that writes zeros cannot pass); an int
    input that indexes a dim of size ``index_bound`` gets values in ``[0, min(8, bound))``, in
    range (an index out of range is a device-side assert, which ends a CUDA process)."""
    dtype = _torch_dtype(node.dtype)
    n = _extent(node.shape, node.strides)
    kw = {"generator": generator, "device": device}
    if node.dtype in FLOAT_DTYPES:
        flat = torch.randn(n, dtype=dtype, **kw)
    elif node.dtype == "bool":
        flat = torch.rand(n, **kw) < 0.5
    elif index_bound is not None:
        hi = max(1, min(8, index_bound))
        flat = torch.randint(0, hi, (n,), dtype=torch.int64, **kw).to(dtype)
    else:
        mag = torch.randint(1, 8, (n,), dtype=torch.int64, **kw)
        if node.dtype != "uint8":
            mag = mag * (torch.randint(0, 2, (n,), dtype=torch.int64, **kw) * 2 - 1)
        flat = mag.to(dtype)
    return flat.as_strided(node.shape, node.strides)


def random_inputs(graph: Graph, device: Any = "cpu", seed: int = 0) -> list[torch.Tensor]:
    """Fresh random inputs for ``graph``'s input nodes, with their strides."""
    device = torch.device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    bounds = index_bounds(graph)
    return [random_tensor(graph[i], device, gen, bounds.get(i)) for i in graph.inputs]


def index_bounds(graph: Graph) -> dict[int, int]:
    """Input node -> the smallest dim size that its values (through any ops) index."""
    bounds: dict[int, int] = {}
    inputs = set(graph.inputs)
    for node in graph.nodes:
        d = OPS.get(node.op)
        for root, size in d.index_operands(graph, node) if d and d.index_operands else ():
            stack, seen = [root], set()
            while stack:
                j = stack.pop()
                if j in seen:
                    continue
                seen.add(j)
                if j in inputs:
                    bounds[j] = min(bounds.get(j, size), size)
                stack.extend(graph[j].inputs)
    return bounds


def poisoned_outputs(
    graph: Graph, info: GroupInfo, device: Any, inverted: bool = False
) -> list[torch.Tensor]:
    """Output buffers filled with values a correct kernel overwrites: NaN for floats, an
    extreme value for ints, True for bools (False with ``inverted``: a second run with the other
    poison catches unwritten bool elements)."""
    outs = allocate_outputs(graph, info, torch.device(device))
    for s, t in zip(info.stored, outs):
        if op_def(graph[s].op).scatter:
            continue  # written at its indexed places only: the buffer starts as zeros
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype == torch.bool:
            t.fill_(not inverted)
        else:
            ii = torch.iinfo(t.dtype)
            t.fill_(ii.min if ii.min < 0 and not inverted else ii.max)
    return outs


def reference_outputs(
    graph: Graph, inputs: Sequence[torch.Tensor], device: Any = None
) -> list[torch.Tensor]:
    """Eager evaluation of ``graph`` in float64 wherever values are floating point.

    Inputs are upcast, every floating node is evaluated in float64, except that a ``cast`` to a
    floating type rounds through that type first (as the kernel does) and then goes back to
    float64."""
    if device is None:  # a subgraph without inputs (arange and friends) names its device
        device = inputs[0].device if inputs else torch.device("cpu")
    env: dict[int, Any] = {}
    for idx, x in zip(graph.inputs, inputs):
        env[idx] = x.double() if x.is_floating_point() else x
    for i, node in enumerate(graph.nodes):
        if i in env:
            continue
        args = [env[j] for j in node.inputs]
        if node.dtype in FLOAT_DTYPES:
            if node.op == "cast":
                v = eval_node(node, args, device).double()
            else:
                v = eval_node(replace(node, dtype="float64"), args, device)
        else:
            v = eval_node(node, args, device)
        env[i] = v
    return [env[j] for j in graph.outputs]


def tolerance_dtype(graph: Graph, info: GroupInfo) -> str | None:
    """The float dtype whose tolerance applies: the least precise of the stored outputs and of
    the casts inside the group (a value rounded to bf16 mid-kernel is only bf16-accurate)."""
    dts = [graph[s].dtype for s in info.stored]
    dts += [graph[m].attr("dtype") for m in info.nodes if graph[m].op == "cast"]
    floats = [d for d in dts if d in TOLERANCES]
    return max(floats, key=lambda d: TOLERANCES[d][0]) if floats else None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def node_values(graph: Graph, inputs: Sequence[torch.Tensor]) -> dict[int, Any]:
    """The eager value of every node of ``graph`` on ``inputs`` (the graph's input tensors)."""
    device = inputs[0].device if inputs else torch.device("cpu")
    env: dict[int, Any] = dict(zip(graph.inputs, inputs))
    for i, node in enumerate(graph.nodes):
        if i not in env:
            env[i] = eval_node(node, [env[j] for j in node.inputs], device)
    return env


def group_inputs(graph: Graph, info: GroupInfo, values: dict[int, Any]) -> list[torch.Tensor]:
    """The buffers ``info``'s kernel loads, from every node's value (:func:`node_values`): graph
    inputs as they are, other nodes in the layout kernels read them with, as the runtime
    gives it them (``ir/eager.py``'s ``conform``)."""
    return [
        values[j]
        if graph[j].kind == "input"
        else conform(values[j], graph[j].shape, buffer_strides(graph[j]))
        for j in info.loads
    ]


def verify_candidate(
    candidate: Candidate,
    device: Any = "cpu",
    seed: int = 0,
    inputs: Sequence[torch.Tensor] | None = None,
) -> str | None:
    """Run the candidate's kernel on fresh random inputs (or on ``inputs``, the values of its
    loads: :func:`group_inputs` of the user's example inputs) and compare with the float64 eager
    reference. None when correct, else the reason. On CPU this needs ``TRITON_INTERPRET=1``."""
    device = torch.device(device)
    if device.type == "cpu" and not interpreting():
        return "cannot verify on CPU: set TRITON_INTERPRET=1 before triton is imported"

    try:
        sub, info, kernel = build_kernel(candidate)
        inputs = random_inputs(sub, device, seed) if inputs is None else list(inputs)
        runs = [poisoned_outputs(sub, info, device)]
        if any(sub[s].dtype == "bool" for s in info.stored):
            runs.append(poisoned_outputs(sub, info, device, inverted=True))
        with warnings.catch_warnings():
            # the interpreter evaluates masked-off lanes too (inf - inf there is harmless)
            warnings.simplefilter("ignore", RuntimeWarning)
            for outs in runs:
                launch(kernel, [*inputs, *outs])
        _sync(device)
    except Exception as e:  # noqa: BLE001 - any failure to build or run is the candidate's
        if bounds_error(e) is not None:
            raise  # AUTOFUSE_CHECK_BOUNDS: a kernel out of bounds is a bug, never a rejection
        return describe_error(e)
    try:
        refs = reference_outputs(sub, inputs, device)
        tol = tolerance_dtype(sub, info)
        eager = None  # eager in the graph's own dtypes: its error bounds what is fair to ask
        for outs in runs:
            for k, (o, r) in enumerate(zip(outs, refs)):
                why = compare(o, r.to(o.device), tol, k)
                if why and o.is_floating_point():
                    eager = run_graph(sub, inputs) if eager is None else eager
                    why = compare(o, r.to(o.device), tol, k, eager[k].to(o.device))
                if why:
                    return why
    except Exception as e:  # noqa: BLE001 - a check that cannot run rejects the candidate
        return f"reference failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return None
