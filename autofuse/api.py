"""The public entry points: ``optimize`` and ``explain``.

The pipeline, as a short list of named steps::

    captured  = capture(fn, example_inputs)          # PyTorch -> IR
    space     = Partitioner(captured.graph)          # legal fusion decisions, with reasons
    partition = space.greedy()  (or the search)      # which nodes share a kernel
    plan      = build_plan(graph, groups, configs)   # Triton source per group, eager fallbacks
    runner    = OptimizedFunction(captured, plan)    # call it like fn
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from autofuse.capture.trace import Captured, capture
from autofuse.partition.partitioner import Partition, Partitioner
from autofuse.plan.runtime import InputError, Plan, build_plan, execute
from autofuse.report import Explanation, format_summary, summarize


def _describe_refusals(graph, partition: Partition) -> tuple[str, ...]:
    out = []
    for r in partition.refusals:
        a, b = graph[r.edge.a], graph[r.edge.b]
        out.append(
            f"cannot fuse {a.name or a.op} with {b.name or b.op} ({r.edge.kind}): {r.reason}"
        )
    return tuple(out)


class OptimizedFunction:
    """Runs a plan like the original function: same arguments, same result structure."""

    def __init__(self, captured: Captured, plan: Plan, fn: Any = None, tuning: Any = None) -> None:
        self.captured = captured
        self.plan = plan
        self._module = fn if isinstance(fn, torch.nn.Module) else None
        self.tuning = tuning  # search results (times, trials), when the plan was tuned
        # calls this plan cannot run (autograd, another module mode, kwargs) go through this
        # torch.compile(backend=autofuse) path when optimize gave one (frontend/optimized.py)
        self.autograd = None
        self._training = self._module.training if self._module is not None else None
        self.__name__ = f"autofuse_{captured.source_name}"
        n = len(captured.leaf_kinds)
        # the common call f(t0, t1, ...) of plain tensors needs no pytree walk
        self._flat_call = (
            self._module is None
            and all(k == "tensor" for k in captured.leaf_kinds)
            and captured.in_spec == pytree.tree_flatten(tuple(range(n)))[1]
        )
        self._leaf_out = captured.out_spec.is_leaf()

    def flat_inputs(self, args: Sequence[Any]) -> list[torch.Tensor]:
        c = self.captured
        if self._flat_call and all(type(a) is torch.Tensor for a in args):
            if len(args) != len(c.leaf_kinds):
                raise InputError(f"the plan takes {len(c.leaf_kinds)} tensors, got {len(args)}")
            return list(args)
        leaves, spec = pytree.tree_flatten(tuple(args))
        if spec != c.in_spec:
            raise InputError(
                f"arguments have structure {spec}, but the plan was captured with {c.in_spec}"
            )
        tensors, scalars = [], []
        for leaf, kind in zip(leaves, c.leaf_kinds):
            (tensors if kind == "tensor" else scalars).append(leaf)
        for k, (got, want) in enumerate(zip(scalars, c.scalars)):
            if got != want:
                raise InputError(
                    f"scalar argument {k} is {got!r}, but the plan was specialized for {want!r}"
                )
        if self._module is not None:
            state = dict(self._module.named_parameters())
            state.update(dict(self._module.named_buffers()))
            tensors += [state[n].detach() for n in c.param_names]
        return tensors

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs or self._training is not None or torch.is_grad_enabled():
            from .frontend.optimized import call_routed, route

            why = route(self, args, kwargs)
            if why is not None:
                return call_routed(self, why, args, kwargs)
        flat = self.flat_inputs(args)
        with torch.no_grad():
            outs = execute(self.plan, flat)
        if self._leaf_out:
            return outs[0]
        return pytree.tree_unflatten(outs, self.captured.out_spec)

    def report(self) -> str:
        times = None
        if self.tuning is not None:
            times = self.tuning.kernel_times
        text = format_summary(summarize(self.plan, times))
        if self.tuning is not None:
            text += "\n" + self.tuning.summary()
        return text


def explain(fn: Callable[..., Any], example_inputs: Sequence[Any]) -> Explanation:
    """Compare the unfused plan (one kernel per op) with the greedy fused plan."""
    captured = capture(fn, example_inputs)
    graph = captured.graph
    space = Partitioner(graph)
    unfused = build_plan(graph, space.unfused().groups, label="unfused")
    greedy = space.greedy()
    fused = build_plan(graph, greedy.groups, label="fused (greedy)")
    return Explanation(
        unfused=summarize(unfused),
        fused=summarize(fused),
        refusals=_describe_refusals(graph, greedy),
        fused_plan=fused,
    )


def optimize(
    fn: Callable[..., Any], example_inputs: Sequence[Any], **options: Any
) -> OptimizedFunction:
    """Capture ``fn``, choose a fusion plan and return a callable that runs it.

    Without search options the greedy plan (every legal fusion taken, default configs) is used.
    With ``trials=`` and/or ``time_budget=`` (seconds) the search picks the partition and its
    configs by measurement (GPU) or by the cost model (CPU, labelled "modeled"); further
    options: ``cache_dir``, ``storage``, ``sampler`` ("tpe" | "random" | "exhaustive"),
    ``verify``, ``isolate``, ``progress``, ``retune``, ``polish`` (configs timed per kernel of
    the best plan by hill climbing after the search, default 16; 0 turns it off). The winner
    is cached under ``cache_dir`` and reused by later calls (and by ``autofuse.load`` in
    production). Unknown option names raise ``TypeError``.

    Autograd, module modes and keyword arguments (``example_kwargs={...}`` for the example
    call): calls the captured plan cannot run (inputs or parameters requiring grad in grad
    mode, a module switched between train and eval, keyword arguments) run through
    ``torch.compile(fn, backend="autofuse")`` with the same options; see
    ``autofuse/frontend/optimized.py``. With ``example_kwargs``, or when ``fn`` cannot be
    captured with make_fx, the result is that backend path alone (a ``BackendFunction``).
    """
    from autofuse.capture import CaptureError

    from .frontend.optimized import BackendFunction, attach
    from .frontend.options import OPTIMIZE, check_options

    check_options(options, OPTIMIZE, "autofuse.optimize")
    example_kwargs = dict(options.pop("example_kwargs", None) or {})
    try:
        captured = None if example_kwargs else capture(fn, example_inputs)
    except CaptureError:
        if not isinstance(fn, torch.nn.Module):
            raise
        captured = None  # a module make_fx cannot trace: the backend path (graph breaks...)
    if captured is None:
        opt = BackendFunction(fn, options)
        opt.autograd.warm(tuple(example_inputs), example_kwargs)
        return opt
    graph = captured.graph
    space = Partitioner(graph)
    if options.get("trials") or options.get("time_budget"):
        opt = _tuned(fn, captured, example_inputs, space, **options)
    else:
        plan = build_plan(graph, space.greedy().groups, label="greedy")
        opt = OptimizedFunction(captured, plan, fn)
    attach(opt, fn, example_inputs, {k: v for k, v in options.items() if k != "study_name"})
    return opt


def _tuned(fn, captured, example_inputs, space, *, retune: bool = False, **options: Any):
    """Tune (or load the plan an earlier tuning run cached) and cache the winner."""
    from autofuse.cache import store as cache
    from autofuse.tune.tuner import tune

    cache_dir = options.setdefault("cache_dir", ".autofuse_cache")
    key = cache.key_for(captured, example_inputs)
    if not retune:
        plan = cache.load_plan(cache_dir, key)
        if plan is not None:
            return OptimizedFunction(captured, plan, fn)
    if retune and not options.get("study_name"):  # a fresh study, not a resumed one
        import time

        options["study_name"] = (
            f"autofuse-{captured.source_name}-{captured.graph.key}-{time.time_ns()}"
        )
    flat = OptimizedFunction(captured, None, fn).flat_inputs(example_inputs)  # + module state
    result = tune(captured, example_inputs, space, example_flat=flat, **options)
    meta = {
        "function": captured.source_name,
        "value_s": result.value,
        "source": result.source,
        "trials": result.trials,
        "kernel_times_s": {k: v[0] for k, v in result.kernel_times.items()},
    }
    cache.save_plan(cache_dir, key, result.plan, meta)
    return OptimizedFunction(captured, result.plan, fn, result)
