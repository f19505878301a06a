"""The steps of a plan: one protocol over the three ways a group of the graph runs.

- :class:`KernelStep`: a generated (Triton) kernel;
- :class:`LibraryStep`: a named library call (``kernels/library``: cuBLAS's ``mm``, SDPA's
  backends...), data alone (provider, function, arguments), resolved by name when the plan
  runs;
- :class:`EagerStep`: one op evaluated by PyTorch (an op autofuse does not generate).

Each says which nodes it computes (``nodes``), which it reads (``reads``), what implementation
it is and why (``describe``), and runs on a call's state (``run``): measurement, the program and
the reports treat all three alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

import torch

from autofuse.ir.eager import bind_node
from autofuse.ir.graph import Graph
from autofuse.kernels import INLINE_OPS, Kernel, LibraryCall, bind_call, config_label
from autofuse.plan.launcher import Launcher, launcher_for


@runtime_checkable
class StepProtocol(Protocol):
    """What every plan step offers (see the module docstring)."""

    @property
    def nodes(self) -> tuple[int, ...]: ...

    @property
    def implementation(self) -> str: ...

    def reads(self, graph: Graph) -> tuple[int, ...]: ...

    def describe(self, graph: Graph) -> str: ...

    def run(self, run: Any) -> None: ...


@dataclass(frozen=True)
class KernelStep:
    kernel: Kernel
    # where this kernel's compiled binaries are kept (a cache entry's ``BinaryStore``), if any
    store: Any = field(default=None, compare=False, repr=False)
    reason: str = field(default="", compare=False)  # why this kernel and config (a planner's)

    @property
    def nodes(self) -> tuple[int, ...]:
        return self.kernel.info.nodes

    @property
    def implementation(self) -> str:
        return f"kernel {self.kernel.name}"

    def reads(self, graph: Graph) -> tuple[int, ...]:
        return tuple(self.kernel.info.loads)

    def describe(self, graph: Graph) -> str:
        info = self.kernel.info
        what = f"{info.kind} kernel {self.kernel.name} [{config_label(self.kernel.config)}]"
        return f"{what}: {self.reason}" if self.reason else what

    def run(self, run: Any) -> None:
        run.launch(self)  # the runtime's kernel path (its eager fallback included)

    @cached_property
    def launcher(self) -> Launcher:
        return launcher_for(self.kernel, self.store)

    def load_kinds(self, graph: Graph) -> tuple[tuple[int, bool], ...]:
        """(node, is a graph input) per loaded buffer: inputs are read as given (checked once
        per call), other loads may need evaluating or a contiguous copy."""
        kinds = self.__dict__.get("_load_kinds")
        if kinds is None:
            kinds = tuple((i, graph[i].kind == "input") for i in self.kernel.info.loads)
            self.__dict__["_load_kinds"] = kinds  # frozen: cached like a cached_property
        return kinds

    @cached_property
    def arg_spec(self) -> tuple[tuple[bool, Any], ...]:
        """``kernel_args`` prebuilt: (True, buffer index) or (False, constant) per argument."""
        n_in = len(self.kernel.info.loads)
        return tuple(
            (True, k) if kind == "in" else (True, n_in + k) if kind == "out" else (False, k)
            for kind, k in self.kernel.layout
        )


@dataclass(frozen=True)
class LibraryStep:
    """A group run by one library call (its result a new tensor, never a view of an input; for
    a multi-output op such as SDPA's, a tuple of them read through the op's getitems)."""

    call: LibraryCall
    reason: str

    @property
    def nodes(self) -> tuple[int, ...]:
        return self.call.nodes

    @property
    def out(self) -> int:
        return self.call.out

    @property
    def implementation(self) -> str:
        return self.call.label

    def reads(self, graph: Graph) -> tuple[int, ...]:
        return self.call.args

    def describe(self, graph: Graph) -> str:
        return f"library {self.call.label}: {self.reason}"

    def bind(self, graph: Graph) -> Callable[..., Any]:
        """``f(device, *tensors)`` as the program calls every bound step."""
        fn = bind_call(self.call)
        return lambda device, *args: fn(*args)

    def run(self, run: Any) -> None:
        run.env[self.out] = bind_call(self.call)(*[run.get(j) for j in self.call.args])


@dataclass(frozen=True)
class EagerStep:
    node: int
    reason: str

    @property
    def nodes(self) -> tuple[int, ...]:
        return (self.node,)

    @property
    def out(self) -> int:
        return self.node

    @property
    def implementation(self) -> str:
        return "eager"

    def reads(self, graph: Graph) -> tuple[int, ...]:
        return tuple(graph[self.node].inputs)

    def describe(self, graph: Graph) -> str:
        return f"eager {graph[self.node].attr('target', graph[self.node].op)}: {self.reason}"

    def bind(self, graph: Graph) -> Callable[..., Any]:
        return bind_node(graph[self.node])

    def run(self, run: Any) -> None:
        node = run.plan.graph[self.node]
        run.env[self.node] = self.bind(run.plan.graph)(run.device, *map(run.get, node.inputs))


Step = KernelStep | LibraryStep | EagerStep


@dataclass(frozen=True)
class Plan:
    """A graph and its steps in an order that runs (each step after those it reads)."""

    graph: Graph
    steps: tuple[Step, ...]
    label: str = "plan"

    @property
    def kernels(self) -> tuple[Kernel, ...]:
        return tuple(s.kernel for s in self.steps if isinstance(s, KernelStep))

    @property
    def library(self) -> tuple[LibraryStep, ...]:
        return tuple(s for s in self.steps if isinstance(s, LibraryStep))

    @property
    def fallbacks(self) -> tuple[EagerStep, ...]:
        return tuple(s for s in self.steps if isinstance(s, EagerStep))

    @property
    def groups(self) -> tuple[frozenset[int], ...]:
        return tuple(frozenset(k.info.nodes) for k in self.kernels)

    @cached_property
    def layouts(self) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
        """The layout map: each buffer the plan holds in memory in another layout than eager's
        (a convolution's result or input kept channels-last, ``ir/conv_layout.py``) -> (its
        strides in the plan, eager's strides). Kernels read such a buffer in the plan's layout;
        a graph output is never in the map (outputs keep eager's strides)."""
        made = {s.node for s in self.fallbacks} | {s.call.out for s in self.library}
        made |= {i for k in self.kernels for i in k.info.stored}  # a buffer in memory
        out = {}
        for i, node in enumerate(self.graph.nodes):
            eager = node.attr("eager_strides")
            if i in made and eager is not None and tuple(eager) != tuple(node.strides):
                out[i] = (tuple(node.strides), tuple(eager))
        return out

    @cached_property
    def input_specs(self) -> tuple[tuple[torch.Size, torch.dtype, tuple[int, ...]], ...]:
        """(shape, dtype, strides) of each input, for the per-call check."""
        g = self.graph
        return tuple(
            (torch.Size(g[i].shape), getattr(torch, g[i].dtype), tuple(g[i].strides))
            for i in g.inputs
        )


def annotated(plan: Plan, why: Callable[[Step], str | None]) -> Plan:
    """``plan`` with each step's reason replaced by ``why(step)`` (None: kept as it is)."""
    steps = []
    for step in plan.steps:
        reason = why(step)
        steps.append(step if reason is None else replace(step, reason=reason))
    return replace(plan, steps=tuple(steps))


def step_loads(graph: Graph, step: StepProtocol) -> tuple[int, ...]:
    """The buffers ``step`` reads from memory (constants computed inline aside)."""
    return tuple(j for j in step.reads(graph) if graph[j].op not in INLINE_OPS)


def step_kind(step: StepProtocol) -> str:
    """``kernel`` / ``library`` / ``eager``: the family of a step (reports, the cache)."""
    if isinstance(step, KernelStep):
        return "kernel"
    return "library" if isinstance(step, LibraryStep) else "eager"


__all__ = [
    "EagerStep",
    "KernelStep",
    "LibraryStep",
    "Plan",
    "Step",
    "StepProtocol",
    "annotated",
    "step_kind",
    "step_loads",
]
