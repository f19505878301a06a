"""The public entry points: ``optimize`` and ``explain``.

The pipeline, as a short list of named steps::

    captured  = capture(fn, example_inputs)          # PyTorch -> IR
    planner   = Planner(captured.graph)              # the graph's legal fusion decisions
    plan      = planner.untuned(...).plan            # or .tuned(...): the cache, else the search;
                                                     # one implementation per group (a Triton
                                                     # kernel, a library call, eager)
    runner    = OptimizedFunction(captured, plan)    # call it like fn
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from autofuse.cache.buckets import BucketNote, spec_for
from autofuse.capture import CaptureError, TraceUnsupported
from autofuse.capture.state import buffers_kept
from autofuse.capture.trace import capture, check_callable, check_real
from autofuse.interpreter import InterpreterNote, interpreting
from autofuse.measure import config_timer
from autofuse.plan.graph_choice import GraphChoice, cuda_inputs, parse_cuda_graph
from autofuse.plan.graphs import GraphReplay
from autofuse.plan.planner import Planner
from autofuse.report import Explanation, summarize
from autofuse.runner import OptimizedFunction, describe_refusals
from autofuse.tune.entry import BucketStore, planning

__all__ = ["OptimizedFunction", "explain", "optimize"]


def explain(fn: Callable[..., Any], example_inputs: Sequence[Any]) -> Explanation:
    """Compare the unfused plan (one kernel per op) with the greedy fused plan; each step says
    which implementation runs its group and why."""
    captured = capture(fn, example_inputs)
    unfused, fused, greedy = Planner(captured.graph).explained()
    return Explanation(
        unfused=summarize(unfused),
        fused=summarize(fused),
        refusals=describe_refusals(captured.graph, greedy),
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
    the best plan by hill climbing after the search, default 16; 0 turns it off),
    ``cuda_graph`` (True: replay the plan as one CUDA graph over static input buffers, off under
    the interpreter, see ``autofuse/plan/graphs.py``; "auto": only where the replay times faster
    end to end on the example inputs, the decision in ``.graph_choice``), ``dynamic``
    (``{"x": [0], "mask": [0, 1]}`` by parameter name or position, or ``True``: those dims vary
    between calls; the result is the backend path with them marked dynamic, one plan per shape
    bucket, ``buckets=[...]`` the buckets' upper edges, default powers of two). The winner
    is cached under ``cache_dir`` and reused by later calls (and by ``autofuse.load`` in
    production). Unknown option names raise ``TypeError``.

    Autograd, module modes and keyword arguments (``example_kwargs={...}`` for the example
    call): calls the captured plan cannot run (inputs or parameters requiring grad in grad
    mode, a module switched between train and eval, keyword arguments) run through
    ``torch.compile(fn, backend="autofuse")`` with the same options; see
    ``autofuse/frontend/optimized.py``. With ``example_kwargs``, or when ``fn`` cannot be
    captured with make_fx, the result is that backend path alone (a ``BackendFunction``).
    A module's buffers (BatchNorm's running statistics) are left as they were: building the
    plan moves none of them.
    """
    with buffers_kept(fn):
        return _optimize(fn, example_inputs, **options)


def _optimize(fn: Callable[..., Any], example_inputs: Sequence[Any], **options: Any) -> Any:
    from autofuse.frontend.optimized import BackendFunction, attach
    from autofuse.frontend.options import OPTIMIZE, check_options

    check_callable(fn, "autofuse.optimize")
    check_options(options, OPTIMIZE, "autofuse.optimize")
    check_real(fn, example_inputs, "autofuse.optimize")
    note_interpreter_size(fn, example_inputs)
    example_kwargs = dict(options.pop("example_kwargs", None) or {})
    cuda_graph = parse_cuda_graph(options.pop("cuda_graph", False), "autofuse.optimize")
    dynamic = options.pop("dynamic", None)
    if dynamic is not None and dynamic is not False:
        from autofuse.frontend.optimized import DynamicFunction, dynamic_spec

        spec = dynamic_spec(fn, example_inputs, dynamic)
        opt = DynamicFunction(fn, options, spec)
        if (options.get("trials") or options.get("time_budget")) and not example_kwargs:
            opt.bucket_entry = _tuned_bucket(fn, example_inputs, spec, options)
        opt(*example_inputs, **example_kwargs)  # the first bucket's plan, built now
        return opt
    if "buckets" in options:
        raise TypeError("autofuse.optimize: buckets= needs dynamic= (the dims they bucket)")
    try:
        captured = None if example_kwargs else capture(fn, example_inputs)
    except CaptureError as e:
        if not isinstance(fn, torch.nn.Module) and not isinstance(e, TraceUnsupported):
            raise
        captured = None  # code make_fx cannot trace: the backend path (graph breaks, guards)
    if captured is None:
        opt = BackendFunction(fn, options)
        opt.autograd.warm(tuple(example_inputs), example_kwargs)
        return opt
    planner = Planner(captured.graph)
    if options.get("trials") or options.get("time_budget"):
        opt = _tuned(fn, captured, example_inputs, planner, **options)
    else:
        ins = OptimizedFunction(captured, None, fn).flat_inputs(example_inputs)  # + module state
        on_cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in ins)
        planned = planner.untuned("greedy", on_cuda, lambda: ins, time_config=config_timer())
        opt = OptimizedFunction(captured, planned.plan, fn)
        opt.plan_choice = planned.choice
    if cuda_graph is True:
        opt.graphs = GraphReplay(opt.plan)
    elif cuda_graph == "auto":
        _choose_graphs(opt, tuple(example_inputs))
    attach(opt, fn, example_inputs, {k: v for k, v in options.items() if k != "study_name"})
    return opt


INTERPRETER_NUMEL = 1 << 18  # elements above which a call under the interpreter takes seconds


def note_interpreter_size(fn: Any, example_inputs: Any) -> None:
    """Under Triton's interpreter a kernel runs as numpy on CPU: say so (an
    :class:`InterpreterNote`) where the inputs are large enough for a call to take seconds,
    rather than leave a silent wait."""
    from torch.utils._pytree import tree_leaves

    state = list(fn.parameters()) if isinstance(fn, torch.nn.Module) else []
    tensors = [t for t in [*tree_leaves(tuple(example_inputs)), *state] if torch.is_tensor(t)]
    numel = sum(t.numel() for t in tensors if not t.is_cuda)
    if interpreting() and numel > INTERPRETER_NUMEL:
        warnings.warn(
            f"autofuse.optimize: the example inputs hold {numel:,} elements and the kernels run "
            "in Triton's interpreter on CPU: each call may take seconds to minutes (a 1024 x "
            "1024 softmax takes about 27 s a call), with no progress shown; use small shapes "
            "on CPU (64 x 64 runs in a fraction of a second) or run on a CUDA GPU",
            InterpreterNote,
            stacklevel=4,
        )


def _choose_graphs(opt: OptimizedFunction, args: tuple) -> None:
    """``cuda_graph="auto"``: the planner's choice (:meth:`Planner.replay`) of whether the plan
    replays a CUDA graph, timed on the call's inputs (a fresh replay is kept: the timing one
    was captured over the example inputs' buffers)."""
    if not opt.plain_call:  # a module's (or nested inputs') call takes the checked path
        opt.graph_choice = GraphChoice(False, None, None, "only plain tensor calls replay")
        return
    opt.graph_choice = Planner.replay(opt.plan, cuda_inputs(args), lambda: opt.flat_inputs(args))
    opt.graphs = GraphReplay(opt.plan) if opt.graph_choice.replay else None


def _tuned_bucket(fn: Any, example_inputs: Sequence[Any], dims: dict, options: dict) -> Any:
    """``dynamic=`` with a search: ``fn`` captured at the example sizes, tuned (or the plan of
    its shape bucket found in the cache) and cached by bucket (``cache/buckets.py``), so that
    ``autofuse.load`` runs it at every size of the bucket; None where ``fn`` is not one graph
    over the bucket (it cannot be captured, or its graph changes with the sizes)."""
    try:
        captured = capture(fn, example_inputs)
        spec = spec_for(fn, captured, example_inputs, dims, options.get("buckets"))
        why = None if spec is not None else "its graph changes with the dynamic sizes"
    except CaptureError as e:
        why = f"it cannot be captured as one plan ({e})"[:300]
    if why is not None:
        name = getattr(fn, "__name__", type(fn).__name__)
        warnings.warn(f"autofuse.optimize: {name}'s plan is not cached by shape bucket: {why}; "
                      "autofuse.load finds it at no other size", BucketNote, stacklevel=4)  # fmt: skip
        return None
    opts = {k: v for k, v in options.items() if k != "buckets"}
    store = BucketStore(opts.get("cache_dir"), spec)
    return _tuned(fn, captured, example_inputs, Planner(captured.graph), store, **opts)


def _tuned(
    fn, captured, example_inputs, planner: Planner, store: Any = None, **options: Any
) -> OptimizedFunction:
    """Tune (or load the plan an earlier tuning run cached), cache the winner, index the call
    (``store``: the cache by exact shapes where None)."""
    flat = OptimizedFunction(captured, None, fn).flat_inputs(example_inputs)  # + module state
    default, search = planning(options.get("cache_dir"))
    planned = planner.tuned(
        captured, example_inputs, store or default, search, fn=fn, example_flat=flat, **options
    )
    return OptimizedFunction(captured, planned.plan, fn, planned.tuning)
