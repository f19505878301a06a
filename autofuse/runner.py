"""``OptimizedFunction``: a plan run like the original function (same arguments, same result
structure); calls the plan cannot run go to its backend path (``routing``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from autofuse import routing
from autofuse.capture import Captured
from autofuse.capture.state import ModuleState
from autofuse.partition import Partition
from autofuse.plan import InputError, Plan, execute
from autofuse.plan.graphs import GraphReplay
from autofuse.plan.runtime import check_count, input_guard, run_plan
from autofuse.report import format_summary, summarize


def writes_inputs(graph: Any) -> bool:
    """The graph writes into one of its inputs (an in-place op's ``copy_`` back)."""
    ins = set(graph.inputs)
    for n in graph.nodes:
        target = str(dict(n.attrs).get("target", "")) if n.op == "opaque" else ""
        name = target.split(".")[1] if target.count(".") >= 2 else ""
        if name.endswith("_") and n.inputs and n.inputs[0] in ins:
            return True
    return False


def shares_memory(args: tuple, kwargs: dict) -> bool:
    """Two tensor arguments share storage (``g(x, x)``, ``g(x, x[0])``)."""
    seen: set[int] = set()
    for leaf in pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor) and leaf.numel():
            ptr = leaf.untyped_storage().data_ptr()
            if ptr in seen:
                return True
            seen.add(ptr)
    return False


class _Name(str):
    def __repr__(self) -> str:
        return str(self)


def kind_of(leaf: Any) -> str:
    """What an argument leaf is, as an error message names it (``Tensor``, ``int``, ...)."""
    return "Tensor" if isinstance(leaf, torch.Tensor) else type(leaf).__name__


def readable(spec: Any, names: Sequence[str]) -> str:
    """An argument structure as Python writes it, each leaf named by its kind:
    ``(Tensor, [Tensor, Tensor])`` rather than a pytree ``TreeSpec``."""
    try:
        return repr(pytree.tree_unflatten([_Name(n) for n in names], spec))
    except Exception:  # noqa: BLE001 - a structure pytree cannot rebuild: its own words
        return str(spec)


def describe_refusals(graph, partition: Partition) -> tuple[str, ...]:
    out = []
    for r in partition.refusals:
        a, b = graph[r.edge.a], graph[r.edge.b]
        out.append(
            f"cannot fuse {a.name or a.op} with {b.name or b.op} ({r.edge.kind}): {r.reason}"
        )
    return tuple(out)


class OptimizedFunction:
    """Runs a plan like the original function: same arguments, same result structure."""

    def __init__(
        self,
        captured: Captured,
        plan: Plan,
        fn: Any = None,
        tuning: Any = None,
        cuda_graph: bool = False,
    ) -> None:
        self.captured = captured
        self.plan = plan
        self._module = fn if isinstance(fn, torch.nn.Module) else None
        self._fn = fn
        # the plan writes into an input (a functionalized in-place op): inputs sharing memory
        # would see each other's writes in eager, not in the plan's buffers
        self._writes_inputs = plan is not None and writes_inputs(plan.graph)
        self.tuning = tuning  # search results (times, trials), when the plan was tuned
        # calls this plan cannot run (autograd, another module mode, kwargs) go through this
        # torch.compile(backend=autofuse) path when optimize gave one (frontend/optimized.py)
        self.autograd = None
        # the Python values the capture read (globals, closure cells): a call after one of them
        # was rebound takes the backend path (frontend/pyguard.py)
        self.py_guard = None
        self._training = self._module.training if self._module is not None else None
        # what the plan depends on in the module (submodules, attributes, hooks, modes)
        self.module_state = (
            ModuleState(fn, captured.param_names) if self._module is not None else None
        )
        self.__name__ = f"autofuse_{captured.source_name}"
        n = self._n = len(captured.leaf_kinds)
        # the common call f(t0, t1, ...) of plain tensors needs no pytree walk
        flat = captured.in_spec == pytree.tree_flatten(tuple(range(n)))[1]
        self._flat_args = flat and all(k == "tensor" for k in captured.leaf_kinds)
        self._flat_call = self._module is None and self._flat_args
        # f(t0, n_head, t1, ...): plain tensors and the scalars the trace was specialized for
        self._mixed: tuple[tuple[int, ...], tuple[tuple[int, Any], ...]] | None = None
        if flat and not self._flat_args:
            kinds = captured.leaf_kinds
            at = tuple(k for k, kind in enumerate(kinds) if kind == "tensor")
            fixed = tuple(k for k, kind in enumerate(kinds) if kind != "tensor")
            self._mixed = (at, tuple(zip(fixed, captured.scalars)))
        self._leaf_out = captured.out_spec.is_leaf()
        spec = captured.out_spec  # a flat tuple of outputs needs no pytree walk either
        self._tuple_out = spec == pytree.tree_flatten(tuple(range(spec.num_leaves)))[1]
        # cuda_graph=True: replay the whole plan as one CUDA graph (plan/graphs.py)
        self.graphs = GraphReplay(plan) if cuda_graph and plan is not None else None
        self.graph_choice = None  # cuda_graph="auto": what the measurement chose (graph_choice.py)
        # untuned on CUDA: fused matmuls timed against cuBLAS (plan/planner.py), else None
        self.plan_choice = None

    def flat_inputs(self, args: Sequence[Any], detach: bool = True) -> list[torch.Tensor]:
        """The plan's inputs for a call: the argument tensors, then a module's parameters and
        buffers (``detach=False``: the tensors themselves, for a run under no_grad)."""
        c = self.captured
        if self._flat_call and all(type(a) is torch.Tensor for a in args):
            check_count(c.graph, args)
            return list(args)
        leaves, spec = pytree.tree_flatten(tuple(args))
        if spec != c.in_spec:
            if self._flat_call and len(args) != len(c.leaf_kinds):
                check_count(c.graph, args)
            got = readable(spec, [kind_of(x) for x in leaves])
            want = readable(c.in_spec, [k.capitalize() for k in c.leaf_kinds])
            raise InputError(f"arguments are {got}, but the plan was captured for {want}")
        tensors, scalars = [], []
        for leaf, kind in zip(leaves, c.leaf_kinds):
            (tensors if kind == "tensor" else scalars).append(leaf)
        for k, (got, want) in enumerate(zip(scalars, c.scalars)):
            if got != want:
                raise InputError(
                    f"scalar argument {k} is {got!r}, but the plan was specialized for {want!r}"
                )
        if self._module is not None:
            found = self.module_state.current()
            tensors += [t.detach() for t in found] if detach else found
        return tensors

    @property
    def plain_call(self) -> bool:
        """Whether calls are flat positional arguments: tensors, and scalars the trace fixed."""
        return self._flat_call or (self._module is None and self._mixed is not None)

    def _plain_tensors(self, args: tuple) -> tuple | None:
        """The tensors of a flat call whose scalars are the captured ones, else None."""
        if self._flat_args:
            return args if len(args) == self._n else None
        if self._mixed is None or len(args) != len(self.captured.leaf_kinds):
            return None
        at, fixed = self._mixed
        for k, want in fixed:
            got = args[k]
            if type(got) is not type(want) or got != want:
                return None
        return tuple(args[k] for k in at)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.py_guard is not None and (why := self.py_guard.changed()) is not None:
            return routing.call_routed(self, f"{why} was rebound since the capture", args, kwargs)
        if self._writes_inputs and shares_memory(args, kwargs):
            return self._aliased(args, kwargs)
        # the common call: plain tensors with exactly the captured shapes, dtypes and strides
        # (one guard check), none requiring grad: no routing, no re-check, no pytree
        ts = None if kwargs else self._plain_tensors(args)
        if ts is not None and self._module is not None:  # + its parameters and buffers
            ts = (*ts, *self.module_state.tensors) if self.module_state.unchanged() else None
        if ts is not None:
            guard = input_guard(self.plan)
            fast = guard.grad_free and guard.exact(ts)  # the C check: no input requires grad
            if fast or (
                guard(ts) and not (torch.is_grad_enabled() and any(a.requires_grad for a in ts))
            ):
                outs = None if self.graphs is None else self.graphs(ts)
                if outs is None:
                    outs = run_plan(self.plan, ts, guard.device if fast else None)
                return self._wrap(outs)
        if kwargs or self._training is not None or torch.is_grad_enabled():
            changed = None if self.module_state is None else self.module_state.check()
            if changed is not None:
                return routing.run_changed(self, changed, args, kwargs)

            why = routing.route(self, args, kwargs)
            if why is not None:
                return routing.call_routed(self, why, args, kwargs)
        flat = self.flat_inputs(args, detach=False)
        with torch.no_grad():
            outs = execute(self.plan, flat)
        return self._wrap(outs)

    def _aliased(self, args: tuple, kwargs: dict) -> Any:
        """Inputs that share memory, one of them written in place: eager semantics (each
        write seen through the other input) only eager gives, so ``fn`` runs in eager."""
        if self._fn is None:
            raise InputError(
                "inputs share memory and the plan writes into one of them in place: eager "
                "would see the write through the other input; pass distinct tensors (clone one)"
            )
        return self._fn(*args, **kwargs)

    def _wrap(self, outs: list[torch.Tensor]) -> Any:
        if self._leaf_out:
            return outs[0]
        if self._tuple_out:
            return tuple(outs)
        return pytree.tree_unflatten(outs, self.captured.out_spec)

    def report(self) -> str:
        times = None
        if self.tuning is not None:
            times = self.tuning.kernel_times
        text = format_summary(summarize(self.plan, times))
        if self.tuning is not None:
            text += "\n" + self.tuning.summary()
        return text
