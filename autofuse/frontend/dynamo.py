"""autofuse as a ``torch.compile`` backend, forward and backward.

::

    fast = torch.compile(model, backend="autofuse", options={"trials": 8, "cache_dir": "c"})
    loss = fast(x).float().pow(2).mean()
    loss.backward()  # the backward graph runs its own plan

Dynamo hands the backend an FX graph of torch ops; AOTAutograd (with autofuse's decomposition
table, SDPA kept whole, and the min-cut rematerialization partitioner, told by ``remat`` to
recompute attention's T x T tensors in the backward) turns it into a
functionalized ATen forward graph and, when something requires grad, a backward graph. Each of
them is converted to the IR (``graph.prepare`` + ``capture.fx_to_ir``), partitioned (the greedy
plan, or the tuned one when the options ask for ``trials`` / ``time_budget`` and a GPU is
present) and run by a plan; ops the IR cannot generate (sort, topk, random ops...) are eager
steps of that plan, and SDPA is a library step (one of its backends: ``kernels/library/sdpa.py``)
or, in a training pair, its ops as traced.

Shapes: one plan per concrete shape. A graph whose example inputs are static compiles once.
A graph Dynamo hands over with symbolic sizes (after a shape change, Dynamo's automatic
dynamic shapes, ``dynamic=True`` or ``mark_dynamic``) goes through AOTAutograd once, with its
symbolic sizes (``symbolic.py``): each call's concrete sizes are looked up and, on a miss, the
traced graph is specialized to them with no new trace and compiled under runtime sizes, its
plan the partition of its graph structure, made once for every shape (``plan/buckets.py``).
A float read from an input with ``.item()`` is kept symbolic by AOTAutograd, or Dynamo traces
again with it specialized. Where that symbolic trace fails, and for a static graph that reads
an input's value, the backend returns a dispatcher (``specialize.py``) that traces the graph
through AOTAutograd for each call's concrete sizes (and integer arguments, and the values
read). Either way every
plan is static (``dynamic=False`` semantics inside the backend). Data-dependent ops
(``.item()`` of a computed tensor, ``nonzero``) do not abort the capture: such a graph runs in
eager. Plans are also memoized per IR graph, so a shape seen before (in another Dynamo cache
entry) reuses its plan.

Options (``options={...}`` of ``torch.compile``, or keywords of :func:`make_backend`): those of
``autofuse.optimize``'s tuning (``trials``, ``time_budget``, ``cache_dir``, ``storage``,
``sampler``, ``verify``, ``isolate``, ``progress``, ``retune``, ``polish``, ...). Unknown names
raise ``TypeError`` naming them (at the first call, when Dynamo calls the backend).
``cuda_graph=True`` replays each inference graph's plan as a CUDA graph (``plan/graphs.py``:
the weights are read in place, a new batch is copied into the graph's buffers), ``"auto"`` (the
default) only where the replay times faster end to end on CUDA (``plan/graph_choice.py``),
``False`` never; forward and backward graphs of training run kernel by kernel. Without a
GPU the options are accepted and the greedy plan is used (the kernels run in Triton's
interpreter); ``trials`` / ``time_budget`` then say so once (an ``OptionNote``).
"""

from __future__ import annotations

import collections
import functools
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._dynamo.exc import RestartAnalysis
from torch._subclasses.fake_tensor import unset_fake_temporarily

from autofuse import logs
from autofuse.capture import Captured, decomposition_table, function_fixes
from autofuse.capture.overlap import dynamo_overlapping_write, no_op_expands_as_views
from autofuse.ir import Graph
from autofuse.ir.eager import restride, same_layout
from autofuse.kernels.common.sizes import runtime_bucket, runtime_sizes_on
from autofuse.measure import config_timer
from autofuse.plan import Plan, execute
from autofuse.plan.buckets import BucketPlans, ShapeBucket, structure_key
from autofuse.plan.graph_choice import parse_cuda_graph
from autofuse.plan.graphs import GraphReplay
from autofuse.plan.planner import Planned, Planner
from autofuse.plan.runtime import input_guard, run_plan
from autofuse.settings import settings
from autofuse.tune.entry import planning

from .graph import Prepared, SymbolicShapes, is_symbolic, place, prepare, to_ir
from .options import BACKEND, check_options, note_backend_tuning, wants_tuning
from .sdpa_written import WRITTEN, written_variant
from .specialize import SpecializedGraph, dynamic_dims, needs_specializing
from .symbolic import SymbolicGraph

__all__ = [
    "AutofuseBackend",
    "CompiledGraph",
    "autofuse_backend",
    "backend_decompositions",
    "compiled_count",
    "compiled_graphs",
    "compiled_since",
    "make_backend",
]


@functools.lru_cache(maxsize=1)
def _decompositions() -> dict:
    return {
        op: fn
        for op, fn in decomposition_table().items()
        if "scaled_dot_product" not in str(op)  # SDPA runs as a library call (its backends)
    }


def backend_decompositions() -> dict:
    """autofuse's decomposition table without the SDPA decompositions: attention stays one
    ``aten._scaled_dot_product_*`` op (and its backward), run by one of SDPA's backends
    (``kernels/library/sdpa.py``)."""
    return dict(_decompositions())


# ---------------------------------------------------------------------------------------------
# One compiled graph
# ---------------------------------------------------------------------------------------------


@dataclass
class CompiledGraph:
    """A plan run in an AOTAutograd graph's calling convention (boxed: one list argument)."""

    kind: str  # "forward" | "backward" | "inference"
    name: str
    prepared: Prepared = field(repr=False)
    plan: Plan = field(repr=False)
    tuning: Any = field(default=None, repr=False)
    restrided: int = 0  # outputs copied to the traced strides so far
    ran_captured: int = 0  # calls run as captured (an input of another shape than traced)
    replay: Any = field(default=None, repr=False)  # GraphReplay (option cuda_graph), inference
    graph_choice: Any = field(default=None, repr=False)  # cuda_graph="auto": what was measured
    plan_choice: Any = field(default=None, repr=False)  # untuned: fused vs cuBLAS matmuls timed
    _out_strides: tuple[tuple[int, ...], ...] = field(default=(), repr=False)
    _in_strides: tuple[tuple[int, ...], ...] = field(default=(), repr=False)
    # after a call whose inputs passed the C-level guard (exactly the plan's layouts): the
    # outputs that needed their traced strides back (the same ones on every such call)
    _restride_when_checked: tuple[int, ...] | None = field(default=None, repr=False)

    # AOTAutograd passes the arguments as one list, except where the backward compiler's result
    # is wrapped by Dynamo (then as separate arguments): __call__ takes both
    _boxed_call = True

    def __post_init__(self) -> None:
        self._boxed_call = True  # in the instance too: Dynamo's wrapper copies __dict__
        self._out_strides = tuple(tuple(m.stride()) for m in self.prepared.out_meta)
        g = self.plan.graph
        self._in_strides = tuple(tuple(g[i].strides) for i in g.inputs)
        self._out_base_is_input = tuple(
            g[g.base_of(o)].kind == "input" for o in g.outputs
        )  # a view of an input keeps the input's layout (it aliases it)

    @property
    def graph(self) -> Graph:
        return self.plan.graph

    def fallback_ops(self) -> collections.Counter:
        """The ops that run outside generated kernels, by ATen target: eager steps, and library
        calls by the op they compute (an SDPA op's target) or their call (``mm`` / ``bmm``)."""
        g = self.plan.graph
        ops = [str(g[s.out].attr("target", s.call.name)) for s in self.plan.library]
        ops += [str(g[s.node].attr("target", g[s.node].op)) for s in self.plan.fallbacks]
        return collections.Counter(ops)

    def _run(self, ins: list[Any], checked: bool) -> list[Any]:
        """The plan on ``ins``; ``checked``: they passed the plan's input guard already."""
        if self.replay is not None and (checked or input_guard(self.plan)(ins)):
            outs = self.replay(ins)
            if outs is not None:
                return outs
        return run_plan(self.plan, ins) if checked else execute(self.plan, ins)

    def __call__(self, *args: Any) -> list[Any]:
        if len(args) == 1 and type(args[0]) is list:  # boxed (graph inputs are never lists)
            args = args[0]
        p = self.prepared
        for k, value in p.specialized.items():
            if args[k] != value:
                raise RuntimeError(
                    f"autofuse: {self.name} was specialized for argument {k} = {value!r}, "
                    f"got {args[k]!r}"
                )
        ins = [args[k] for k in p.tensor_args]
        for k in p.moved:  # a 0-d CPU tensor beside tensors of another device, as eager takes
            ins[k] = place(ins[k], p.device)
        ins += p.constants
        guard = input_guard(self.plan)
        exact = guard.exact(ins)  # the C-level check: every layout is the plan's
        checked = exact or guard(ins)  # or, in Python, the same up to size-1 dims' strides
        if not checked and (other := self._other_shape(ins)) is not None:
            return self._as_captured(ins, other)
        if not checked:
            g = self.plan.graph
            for k, (x, strides) in enumerate(zip(ins, self._in_strides)):
                if x.stride() != strides and not same_layout(x, g[g.inputs[k]].shape, strides):
                    ins[k] = restride(x, strides) if x.shape == g[g.inputs[k]].shape else x
        if torch.is_grad_enabled():  # AOTAutograd runs forward graphs with grad off already
            with torch.no_grad():
                outs = self._run(ins, checked)
        else:
            outs = self._run(ins, checked)
        known = self._restride_when_checked if exact else None
        if known is None:
            known = self._restride_outputs(outs)
            if exact:
                self._restride_when_checked = known
        for k in known:
            outs[k] = restride(outs[k], self._out_strides[k])
            self.restrided += 1
        return [outs[v] if tag == "node" else v for tag, v in p.outputs]

    def _other_shape(self, ins: list[Any]) -> str | None:
        """Which input has another shape than the traced one, where one has: a tensor the
        forward saved whose real kernel disagrees with its meta function (``embedding_bag``'s
        ``offset2bag`` is empty in bfloat16 on CPU, traced with one entry per index)."""
        g = self.plan.graph
        for k, (x, i) in enumerate(zip(ins, g.inputs)):
            if isinstance(x, torch.Tensor) and tuple(x.shape) != g[i].shape:
                return f"input {k} ({g[i].name}) is {list(x.shape)}, traced {list(g[i].shape)}"
        return None

    def _as_captured(self, ins: list[Any], why: str) -> list[Any]:
        """The captured graph run in eager on ``ins`` (warned once per graph): what eager
        computes where the plan's shapes are not the call's."""
        if not self.ran_captured:
            warnings.warn(f"autofuse: {self.name}: {why}; this call runs the graph as captured, "
                          "in eager", RuntimeWarning, stacklevel=3)  # fmt: skip
        self.ran_captured += 1
        with torch.no_grad():
            outs = list(self.prepared.gm(*ins))
        return [outs[v] if tag == "node" else v for tag, v in self.prepared.outputs]

    def _restride_outputs(self, outs: list[Any]) -> tuple[int, ...]:
        """The outputs not laid out with their traced strides (a view of an input keeps the
        input's layout)."""
        return tuple(
            k
            for k, (t, strides) in enumerate(zip(outs, self._out_strides))
            if t.stride() != strides
            and not self._out_base_is_input[k]
            and not same_layout(t, t.shape, strides)
        )


# (graph key, device, tuned, runtime sizes, AUTOFUSE_SDPA) -> (plan, tuning, the untuned plan's
# measured choice)
_PLANS: dict[tuple, tuple[Plan, Any, Any]] = {}
_PLANS_LOCK = threading.Lock()
_COMPILED: collections.deque[CompiledGraph] = collections.deque(maxlen=512)
_COUNT = [0]  # every graph compiled (the deque keeps the last 512)
_BUCKETS = BucketPlans()  # (traced graph, structure, kind, device, tuned) -> a partition


def _shared_structure(graph: Graph, extra: tuple) -> tuple[tuple, Any] | None:
    """(the key of ``graph``'s structure in the traced graph being compiled, the bucket of its
    sizes) where a traced graph with runtime sizes is being compiled, else None."""
    bucket = runtime_bucket()
    if bucket is None:
        return None
    if not isinstance(bucket, ShapeBucket):
        bucket = ShapeBucket(None, bucket)
    return (bucket.scope, structure_key(graph), *extra), bucket.sizes


def compiled_graphs() -> list[CompiledGraph]:
    """The graphs this process compiled through the backend, oldest first (the last 512)."""
    return list(_COMPILED)


def compiled_count() -> int:
    """How many graphs this process compiled through the backend (all, not only those kept)."""
    return _COUNT[0]


def compiled_since(count: int) -> list[CompiledGraph]:
    """The graphs compiled after :func:`compiled_count` returned ``count``, oldest first (of
    those still kept: the last 512)."""
    new = _COUNT[0] - count
    return list(_COMPILED)[-new:] if new > 0 else []


def _timing_inputs(metas: Sequence[Any]) -> tuple[bool, Callable[[], list[Any]]]:
    """(whether the graph runs on CUDA, a function making real inputs of ``metas``' shapes):
    what the planner times plans on, the inputs made only if it times."""
    return _device_of(metas).startswith("cuda"), lambda: [_realize(m) for m in metas]


def _realize(meta: Any) -> Any:
    """A real tensor with ``meta``'s shape, strides, dtype and device (for tuning and timing);
    a value that is not a tensor (a size, a flag) as it is."""
    if not isinstance(meta, torch.Tensor):
        return meta
    shape, strides = tuple(meta.shape), tuple(meta.stride())
    out = torch.empty_strided(shape, strides, dtype=meta.dtype, device=meta.device)
    if meta.dtype.is_floating_point:
        out.normal_()
    else:
        out.zero_()  # indices: zero is in range of every table
    return out


def _fix_functions(gm: torch.fx.GraphModule) -> None:
    """Dynamo's graph with each call of a function whose traced form is wrong (torch's own
    decomposition; ``capture.function_fixes``) calling the function that computes it right."""
    fixes = function_fixes()
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in fixes:
            node.target, changed = fixes[node.target], True
    if changed:
        gm.recompile()


def _as_captured(gm: torch.fx.GraphModule, why: str) -> Callable[..., Any]:
    """Dynamo's graph ``gm`` run as captured, in eager, with a warning saying ``why``
    (strict mode raises instead)."""
    if settings().strict:
        raise RuntimeError(f"autofuse (strict): a graph cannot be compiled: {why}")
    warnings.warn(f"autofuse: {why}; the graph runs as captured, in eager", RuntimeWarning,
                  stacklevel=3)  # fmt: skip
    return gm.forward


def _effectful_ops(gm: torch.fx.GraphModule) -> list[str]:
    """The ops an AOTAutograd graph calls through ``with_effects`` (ordered side effects such
    as ``linalg.inv``'s error check, threaded through effect tokens)."""
    from torch._higher_order_ops.effects import with_effects

    return [
        str(n.args[1])
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target is with_effects
    ]


def _device_of(metas: Sequence[Any]) -> str:
    for m in metas:
        if isinstance(m, torch.Tensor):
            return str(m.device)
    return "cpu"


class AutofuseBackend:
    """A Dynamo backend with fixed options; see the module docstring."""

    def __init__(self, **options: Any) -> None:
        check_options(options, BACKEND, "autofuse backend")
        self.options = dict(options)
        self.origin = "backend"  # the front end that made it, for its notes (options.py)
        self.records: list[CompiledGraph] = []
        # plans: partitions made (greedy or searched: one per graph structure of a traced
        # graph); bucket_instances: that partition built for another shape (no partition, no
        # search, its loop kernels shared within a bucket)
        self.counts: collections.Counter[str] = collections.Counter()
        self.__name__ = "autofuse"

    # -- Dynamo entry ----------------------------------------------------------------------------
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kw: Any):
        if kw.get("options"):
            check_options(kw["options"], BACKEND, "torch.compile(backend='autofuse')")
        _fix_functions(gm)
        shared = dynamo_overlapping_write(gm)
        no_op_expands_as_views(gm)
        if shared is not None:  # functionalizing it changes the values (capture/overlap.py)
            return _as_captured(gm, f"an in-place {shared} writes into a view whose elements "
                                "share memory (an expand)")  # fmt: skip
        dims = dynamic_dims(gm, example_inputs)
        symbolic = any(is_symbolic(x) for x in example_inputs)
        if not needs_specializing(gm, symbolic):
            return self.traced_or_captured(gm, list(example_inputs))
        per_shape = SpecializedGraph(self.aot, gm, dims, self.options.get("buckets"))
        if not symbolic:
            return per_shape
        compiled = self.symbolic(gm, list(example_inputs))  # traced once, where it can be
        return per_shape if compiled is None else compiled

    def symbolic(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        """``gm`` through AOTAutograd once with its symbolic sizes, each graph that comes out
        a :class:`SymbolicGraph` (compiled per shape with no new trace); None where a graph
        cannot be so compiled (the caller traces each shape on its own)."""

        def compile_symbolic(kind: str, g: torch.fx.GraphModule, ex: Sequence[Any]) -> Any:
            compile = functools.partial(self.compile_graph, kind)
            # a backward graph may be compiled at its first call, past any fallback
            strict = kind != "backward"
            return SymbolicGraph(compile, g, ex, self.options.get("buckets"), strict)

        try:
            return self.aot(gm, example_inputs, compile_symbolic)
        except RestartAnalysis:  # Dynamo traces again (floats read from inputs specialized)
            raise
        except Exception as e:  # noqa: BLE001 - e.g. a size the graph cannot specialize
            logs.log.info("autofuse backend: a symbolic trace failed (%s: %s); each shape is "
                          "traced on its own", type(e).__name__, e)  # fmt: skip
            return None

    def traced_or_captured(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        """``gm`` through AOTAutograd; where AOTAutograd itself cannot trace it (an error raised
        before any graph reached autofuse: torch's own functionalization refuses some in-place
        ops on expanded views that eager runs), ``gm`` as Dynamo captured it, in eager, with a
        warning (strict mode raises)."""
        reached: list[str] = []

        def compile(kind: str, g: torch.fx.GraphModule, ex: Sequence[Any]) -> Any:
            reached.append(kind)
            return self.compile_graph(kind, g, ex)

        try:
            return self.aot(gm, example_inputs, compile)
        except RestartAnalysis:
            raise
        except Exception as e:
            if reached or settings().strict:
                raise
            why = f"AOTAutograd could not trace it ({type(e).__name__}: {str(e)[:200]})"
            return _as_captured(gm, why)

    def aot(
        self, gm: torch.fx.GraphModule, example_inputs: list[Any], compile: Any = None
    ) -> Callable[..., Any]:
        """``gm`` through AOTAutograd, ``compile(kind, graph, example_inputs)`` (by default
        :meth:`compile_graph`) compiling each forward, backward or inference graph."""
        from torch._dynamo.backends.common import aot_autograd

        from .remat import attention_partition

        compile = compile or self.compile_graph
        compiler = aot_autograd(
            fw_compiler=functools.partial(compile, "forward"),
            bw_compiler=functools.partial(compile, "backward"),
            inference_compiler=functools.partial(compile, "inference"),
            decompositions=_decompositions(),
            partition_fn=attention_partition,
        )
        return compiler(gm, example_inputs)

    # -- one ATen graph ------------------------------------------------------------------------
    def compile_graph(
        self, kind: str, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
    ) -> Callable[..., Any]:
        effects = _effectful_ops(gm)
        if effects:  # its effect tokens are None at run time: the graph as traced runs it
            logs.log.info(
                "autofuse backend: the %s graph calls %s; it runs in eager", kind, effects
            )
            return gm
        try:
            prepared = prepare(gm, example_inputs)
        except SymbolicShapes as e:  # not expected: symbolic graphs are specialized first
            warnings.warn(
                f"autofuse: the {kind} graph has symbolic sizes ({e}); it runs in eager",
                RuntimeWarning,
                stacklevel=2,
            )
            return gm
        cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs)
        forced = settings().sdpa == "autofuse"
        # SDPA written out: timed beside SDPA's graph on CUDA (off CUDA nothing is timed and
        # SDPA's graph is kept, so it is not made), or forced
        written = (
            written_variant(kind, gm, example_inputs, prepared, _decompositions())
            if cuda or forced
            else None
        )
        if written is not None and forced:
            prepared, written = written, None  # forced: the written-out graph alone
        graph = to_ir(prepared, cuda)
        variants = () if written is None else ((WRITTEN, to_ir(written, cuda)),)
        metas = [prepared.gm.graph.find_nodes(op="placeholder")[k].meta["val"]
                 for k in range(len(graph.inputs))]  # fmt: skip
        with unset_fake_temporarily():  # AOTAutograd compiles the forward in its fake mode:
            plan, tuning, choice = self.plan_for(graph, kind, metas, variants)  # real inputs
        compiled = CompiledGraph(kind, f"{kind}_{graph.key[:8]}", prepared, plan, tuning)
        compiled.plan_choice = choice
        mode = parse_cuda_graph(self.options.get("cuda_graph", "auto"), "autofuse backend")
        if kind == "inference" and mode is True:
            compiled.replay = GraphReplay(plan)
        elif kind == "inference" and mode == "auto":
            with unset_fake_temporarily():
                compiled.graph_choice = Planner.replay(plan, *_timing_inputs(metas))
            compiled.replay = GraphReplay(plan) if compiled.graph_choice.replay else None
        self.records.append(compiled)
        _COMPILED.append(compiled)
        _COUNT[0] += 1
        logs.log.info(
            "autofuse backend: %s graph, %d nodes -> %d kernels, %d library calls, %d eager steps",
            kind,
            len(graph.nodes),
            len(plan.kernels),
            len(plan.library),
            len(plan.fallbacks),
        )
        return compiled

    def plan_for(
        self, graph: Graph, kind: str, metas: Sequence[Any], variants: Sequence[Any] = ()
    ) -> tuple[Plan, Any, Any]:
        """The plan of ``graph`` (or of one of the ``variants``, (what, graph) computing the
        same from the same inputs: SDPA written out, timed beside it untuned)."""
        tuned = wants_tuning(self.options) and torch.cuda.is_available()
        note_backend_tuning(self.options, torch.cuda.is_available(), self.origin)
        key = (graph.key, _device_of(metas), tuned, runtime_sizes_on(), settings().sdpa)
        with _PLANS_LOCK:
            hit = _PLANS.get(key)
        if hit is not None and not self.options.get("retune"):
            return hit
        planner = Planner(graph, variants)
        shared = _shared_structure(graph, (kind, _device_of(metas), tuned))
        if shared is not None:  # a shape of a traced graph: its structure's partition, if any
            part = _BUCKETS.partition(*shared)
            plan = None if part is None else planner.rebuilt(part, f"{kind}, bucket plan")
            if plan is not None:
                self.counts["bucket_instances"] += 1
                return plan, None, None
        self.counts["plans"] += 1
        if tuned:
            planned = self._tuned(planner, kind, metas)
        else:  # inputs of the graph's shapes are made only if two plans are timed
            planned = planner.untuned(
                f"greedy {kind}", *_timing_inputs(metas), time_config=config_timer()
            )
        plan, tuning, choice = planned.plan, planned.tuning, planned.choice
        with _PLANS_LOCK:
            _PLANS[key] = (plan, tuning, choice)
        if shared is not None and plan.graph is graph:  # (a variant's plan: not this graph's)
            _BUCKETS.remember(*shared, plan, searched=tuned)
        return plan, tuning, choice

    def _tuned(self, planner: Planner, kind: str, metas: Sequence[Any]) -> Planned:
        """The tuned plan of ``planner``'s graph, or, where it has variants (SDPA written out),
        of the one whose untuned plan was faster: a graph already tuned in the cache is used
        as it is (no timing); else the untuned plans are timed and the faster graph tuned."""
        inputs = tuple(_realize(m) for m in metas)
        options = {k: v for k, v in self.options.items() if k not in ("cuda_graph", "buckets")}
        options.setdefault("progress", False)
        store, search = planning(options.get("cache_dir"))
        chosen = planner
        if planner.variants:
            planners = [planner, *(Planner(g) for _, g in planner.variants)]
            for p in planners if not options.get("retune") else ():
                hit = p.cached(store, _captured(p.graph, kind), inputs, dict(options))
                if hit is not None:
                    return hit  # tuned before: the cached plan, nothing timed or read again
            pick = planner.untuned(f"greedy {kind}", True, lambda: list(inputs)).plan.graph
            # another layout or BatchNorm folded: the graph's own planner (its search's plan
            # is timed against those again)
            chosen = next((p for p in planners if p.graph is pick), planner)
        captured = _captured(chosen.graph, kind)
        return chosen.tuned(captured, inputs, store, search, example_flat=inputs, **options)


def _captured(graph: Graph, kind: str) -> Captured:
    """``graph`` as the tuner and the cache take a captured program (its inputs and outputs
    in order, no Python-level structure)."""
    n = len(graph.inputs)
    return Captured(
        graph=graph,
        in_spec=pytree.tree_flatten(tuple(range(n)))[1],
        out_spec=pytree.tree_flatten(list(range(len(graph.outputs))))[1],
        leaf_kinds=("tensor",) * n,
        scalars=(),
        param_names=(),
        source_name=f"{kind}_{graph.key[:8]}",
    )


# ---------------------------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------------------------


def make_backend(**options: Any) -> AutofuseBackend:
    """A backend object with fixed options: ``torch.compile(fn, backend=make_backend(...))``;
    its ``records`` lists the graphs it compiled."""
    return AutofuseBackend(**options)


def autofuse_backend(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict | None = None, **kw: Any
) -> Callable[..., Any]:
    """The backend registered as ``"autofuse"`` (``torch.compile(..., backend="autofuse",
    options={...})``)."""
    if kw.get("mode") not in (None, "default"):
        warnings.warn(
            f"autofuse backend: mode={kw['mode']!r} is ignored", RuntimeWarning, stacklevel=2
        )
    options = dict(options or {})
    check_options(options, BACKEND, "torch.compile(backend='autofuse', options=...)")
    return AutofuseBackend(**options)(gm, example_inputs)
