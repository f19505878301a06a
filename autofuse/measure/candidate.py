"""Candidates (one fusion group under one launch config, cut out of its graph with a structural
key) and measurements (a time or a failure with its reason)."""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

from autofuse.ir.graph import Graph, Node, buffer_strides, make_attrs
from autofuse.kernels import INLINE_OPS, GroupInfo, Kernel, generate

# ---------------------------------------------------------------------------------------------
# Candidates and their structural key
# ---------------------------------------------------------------------------------------------


def _extract(
    graph: Graph, members: Iterable[int], loads: Sequence[int], stored: Sequence[int]
) -> tuple[Graph, dict[int, int]]:
    """Cut ``members`` out of ``graph``: inputs = ``loads``, then the members and the view /
    const nodes they read, in their original order; outputs = ``stored``. Returns the graph and
    the map from old node ids to new ones."""
    member_set, load_set = set(members), set(loads)
    keep: set[int] = set()

    def visit(j: int) -> None:
        if j in keep or j in load_set or j in member_set:
            return
        node = graph[j]
        if node.kind == "view":
            keep.add(j)
            visit(node.inputs[0])
        elif node.op in INLINE_OPS:
            keep.add(j)
        else:
            raise ValueError(
                f"node %{j} ({node.op}) is read by the group but is neither loaded, a member, "
                "a view nor a constant"
            )

    for m in member_set:
        for j in graph[m].inputs:
            visit(j)
    nodes: list[Node] = []
    remap: dict[int, int] = {}
    for k, j in enumerate(loads):
        n = graph[j]
        # the runtime gives every non-input buffer the layout the kernel reads it with
        strides = buffer_strides(n)
        nodes.append(Node("input", (), n.shape, n.dtype, strides, make_attrs(index=k), n.name))
        remap[j] = k
    for j in sorted(keep | member_set):
        n = graph[j]
        nodes.append(replace(n, inputs=tuple(remap[x] for x in n.inputs)))
        remap[j] = len(nodes) - 1
    sub = Graph(tuple(nodes), tuple(range(len(loads))), tuple(remap[s] for s in stored))
    return sub, remap


def extract_group(graph: Graph, info: GroupInfo) -> tuple[Graph, GroupInfo]:
    """The group as a standalone graph, with its :class:`GroupInfo` renumbered to match."""
    sub, remap = _extract(graph, info.nodes, info.loads, info.stored)
    sub_info = replace(
        info,
        nodes=tuple(remap[m] for m in info.nodes),
        stored=tuple(remap[s] for s in info.stored),
        loads=tuple(range(len(info.loads))),
        matmuls=tuple(remap[m] for m in info.matmuls),
    )
    return sub, sub_info


def extract_subgraph(graph: Graph, info: GroupInfo) -> Graph:
    """A standalone IR graph of the group: inputs = ``info.loads`` (as ``input`` nodes with their
    shape, dtype and strides; contiguous for a load of a non-input node, as the runtime
    materializes those), then the group's nodes and the view / const nodes they read, renumbered
    in order; outputs = ``info.stored``. Generating the kernel of the subgraph's whole group
    gives the same source as generating it in ``graph``."""
    return extract_group(graph, info)[0]


def eager_subgraph(graph: Graph, i: int) -> Graph:
    """Node ``i`` (an eager op) with the buffers it reads as a standalone graph."""
    loads = tuple(j for j in graph.compute_inputs(i) if graph[j].op not in INLINE_OPS)
    return _extract(graph, (i,), loads, (i,))[0]


def jit_functions(source: str) -> list[str]:
    """Names of the ``@triton.jit`` functions that ``source`` defines, in order."""
    out = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and any(
            ast.unparse(d).split("(")[0] in ("triton.jit", "jit") for d in node.decorator_list
        ):
            out.append(node.name)
    return out


# rendered kernels by candidate key, least recently used first: a group's config priced by the
# pruner and then measured in a trial is rendered once
BUILT_KEPT = 256
_BUILT: dict[str, tuple[Graph, GroupInfo, Kernel]] = {}


@dataclass(frozen=True)
class Candidate:
    """One kernel to measure: a group of ``graph`` (``info`` from ``codegen.analyze_group``)
    under one launch config. ``source_override`` (tests, fault injection) is kernel source used
    instead of the generated one; it must take the generated kernel's arguments."""

    graph: Graph
    info: GroupInfo
    config: Any  # KernelConfig, or gemm_template.GemmConfig for GEMM groups
    source_override: str | None = None

    @cached_property
    def standalone_parts(self) -> tuple[Graph, GroupInfo]:
        return extract_group(self.graph, self.info)

    @cached_property
    def key(self) -> str:
        """Structural: the subgraph's key, the config and any source override."""
        sub, _ = self.standalone_parts
        h = hashlib.sha256()
        h.update(sub.key.encode())
        h.update(f"|{type(self.config).__name__}{self.config!r}".encode())
        if self.source_override is not None:
            h.update(b"|override:" + self.source_override.encode())
        return h.hexdigest()[:24]

    @cached_property
    def built(self) -> tuple[Graph, GroupInfo, Kernel]:
        """The candidate's kernel on its standalone subgraph (``source_override`` applied),
        rendered once per structural key in this process: pricing it before the trial, then
        verifying, timing it and checking it on the example inputs all reuse this one."""
        built = _BUILT.pop(self.key, None) or self._render()
        _BUILT[self.key] = built  # the most recent last
        while len(_BUILT) > BUILT_KEPT:
            del _BUILT[next(iter(_BUILT))]
        return built

    def _render(self) -> tuple[Graph, GroupInfo, Kernel]:
        sub, info = self.standalone_parts
        kernel = generate(sub, info, self.config)
        if self.source_override is not None:
            names = jit_functions(self.source_override)
            if not names:
                raise ValueError("source_override defines no @triton.jit function")
            kernel = replace(kernel, source=self.source_override, name=names[-1])
        return sub, info, kernel

    def standalone(self) -> Candidate:
        """The same candidate on its extracted subgraph (small to pickle, same key)."""
        sub, sub_info = self.standalone_parts
        if sub is self.graph:
            return self
        c = Candidate(sub, sub_info, self.config, self.source_override)
        c.__dict__["standalone_parts"] = (sub, sub_info)
        c.__dict__["key"] = self.key
        return c

    def label(self) -> str:
        cfg = self.config.label() if hasattr(self.config, "label") else str(self.config)
        ops = ",".join(self.graph[i].op for i in self.info.nodes)
        return f"[{ops}] {cfg}"


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    seconds: float | None  # None when failed
    failure: str | None  # why it failed: "compile/run error: ...", "wrong result: ...", ...
    source: str  # "measured" (GPU timer) or "modeled" (cost model)

    @property
    def ok(self) -> bool:
        return self.failure is None and self.seconds is not None

    @staticmethod
    def failed(reason: str, source: str) -> Measurement:
        return Measurement(None, reason, source)


@runtime_checkable
class Measurer(Protocol):
    def measure(self, candidate: Candidate) -> Measurement: ...


_CUDA_FATAL = (
    "cuda error",
    "illegal memory access",
    "illegal address",
    "cuda_error",
    "cudaerror",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction",
)


def is_fatal(reason: str | None) -> bool:
    """A CUDA error after which the process's CUDA context is unusable."""
    return reason is not None and any(k in reason.lower() for k in _CUDA_FATAL)


def describe_error(e: BaseException, limit: int = 300) -> str:
    """One line for a failed compile or launch: the error class and the telling line."""
    names = {c.__name__ for c in type(e).__mro__}
    msg = str(e)
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    telling = next((ln for ln in lines if is_fatal(ln)), None)
    if telling is None and lines:
        telling = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    text = telling or ""
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    if "OutOfResources" in names:
        return f"out of resources: {text}"
    if "OutOfMemoryError" in names:
        return f"out of memory: {text}"
    return f"compile/run error: {type(e).__name__}: {text}"
