"""A plan lowered for the host: the per-call work of ``run_plan`` with every lookup made once.

Walking a plan's steps resolves, on each call, which values a step reads (views evaluated on
their first use, through the op table), how each eager op is called, each output's shape and
dtype. None of that changes between calls, so :func:`program` resolves it once per plan into a
flat list of bound operations: evaluate a view, give a loaded intermediate the layout the
kernel reads it with (``buffer_strides``; buffers kernels wrote need nothing), call a library
function or an eager op (``step.bind``), launch a kernel with its argument template. A call then does only the tensor work. Views are
rebuilt with ``_reinterpret_tensor`` once their first evaluation has shown their layout, and a
kernel's output is written into a buffer an earlier kernel made and no later step reads (as
Inductor's generated code reuses buffers: fewer allocations on the host, less memory on the
device; :func:`last_reads` says which buffers qualify).

A kernel whose source cannot be loaded or built still runs its group's ops in eager with one
warning: the runtime hands the program its slow path for a kernel step (``slow``: the first
launch, a TMA kernel's alignment check and any broken kernel go through it) and the record of
broken kernels (``broken``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from autofuse.ir.eager import bind_node, conform
from autofuse.ir.graph import buffer_strides, contiguous_strides
from autofuse.ir.ops import op_def
from autofuse.kernels import INLINE_OPS

Op = Callable[[Any], None]  # one bound operation on a ``runtime._Run``


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


class Program:
    """The operations of one plan on one device kind, in order (see the module docstring)."""

    def __init__(self, plan: Any, slow: Callable[[Any, Any], None], broken: Mapping) -> None:
        self.plan, self.graph = plan, plan.graph
        self.slow, self.broken = slow, broken
        self.ops: list[Op] = []
        self.have: set[int] = set(self.graph.inputs)
        # nodes kernel steps store: contiguous buffers the program allocates (a broken kernel's
        # eager fallback makes its results so too), read by later kernels with no check
        self.kernel_made: set[int] = set()
        self.last_read, self.lent = last_reads(plan), set()
        self.reused = 0  # kernel outputs written into a dead buffer instead of a new one
        for k, step in enumerate(plan.steps):
            if hasattr(step, "kernel"):
                self._kernel(step, k)
            else:  # a library call or an eager op: one bound function
                self._call(step)
        for o in self.graph.outputs:
            self._need(o)
        self.outputs = tuple(self.graph.outputs)
        del self.have, self.kernel_made, self.last_read, self.lent

    # -- building ------------------------------------------------------------------------------
    def _need(self, i: int) -> None:
        """Make node ``i`` available: a view or an inline constant is evaluated where it is
        first read (as ``_Run.get`` does); anything else must come from an earlier step."""
        if i in self.have:
            return
        node = self.graph[i]
        if node.kind != "view" and node.op not in INLINE_OPS:
            raise RuntimeError(f"node %{i} ({node.op}) is read before any step computed it")
        for j in node.inputs:
            self._need(j)
        if node.kind == "view" and len(node.inputs) == 1:
            self.ops.append(_view(i, node.inputs[0], bind_node(node)))
        else:
            self.ops.append(_evaluate(i, node.inputs, bind_node(node)))
        self.have.add(i)

    def _call(self, step: Any) -> None:
        args = step.reads(self.graph)
        for j in args:
            self._need(j)
        self.ops.append(_evaluate(step.out, args, step.bind(self.graph)))
        self.have.update(step.nodes)

    def _donor(self, s: int, k: int) -> int | None:
        """A buffer a kernel step made earlier that no step from ``k`` on reads (nor a view of
        it, nor the graph's outputs), of ``s``'s shape, dtype and layout: ``s`` is written into it
        (stream order makes that safe, as the caching allocator's own reuse), once."""
        g = self.graph
        for b in sorted(self.kernel_made - self.lent):
            last = self.last_read.get(b)
            if last is not None and last < k and g[b].shape == g[s].shape:
                if g[b].dtype == g[s].dtype and buffer_strides(g[b]) == buffer_strides(g[s]):
                    self.lent.add(b)
                    self.reused += 1
                    return b
        return None

    def _kernel(self, step: Any, k: int) -> None:
        g = self.graph
        loads = step.load_kinds(g)
        for i, given in loads:
            self._need(i)
            if given or i in self.kernel_made:
                continue
            node, strides = g[i], buffer_strides(g[i])
            if strides == contiguous_strides(node.shape):
                self.ops.append(_contiguous(i))
            else:  # an eager op's output, read as it comes out (when its strides say so)
                self.ops.append(_laid_out(i, node.shape, strides))
        stored = step.kernel.info.stored
        specs = tuple(
            (
                g[s].shape,
                buffer_strides(g[s]),
                _dtype(g[s].dtype),
                op_def(g[s].op).scatter,
                self._donor(s, k),
            )
            for s in stored
        )
        loaded = tuple(i for i, _ in loads)
        self.ops.append(_launch(step, loaded, stored, specs, self.slow, self.broken))
        self.have.update(step.kernel.info.nodes)
        self.kernel_made.update(stored)

    # -- running -------------------------------------------------------------------------------
    def __call__(self, run: Any) -> list[Any]:
        run.alloc = allocator(run.device)
        for op in self.ops:
            op(run)
        env = run.env
        return [env[o] for o in self.outputs]


def _evaluate(i: int, inputs: tuple[int, ...], fn: Callable[..., Any]) -> Op:
    def op(run: Any) -> None:
        env = run.env
        env[i] = fn(run.device, *[env[j] for j in inputs])

    return op


# the C-level helpers Inductor's generated code calls (absent from some builds: then None)
_GUARDS = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
_REINTERPRET = getattr(_GUARDS, "_reinterpret_tensor", None)


def _view(i: int, j: int, fn: Callable[..., Any]) -> Op:
    """A view (permute, reshape, expand, slice...): its result is a function of the input's
    strides alone, so after one evaluation per input layout it is rebuilt with the C-level
    ``_reinterpret_tensor`` Inductor's generated code uses (no dispatch); a reshape that had
    to copy keeps calling the op."""
    memo: dict[tuple[int, ...], tuple | None] = {}

    def op(run: Any) -> None:
        env = run.env
        x = env[j]
        key = x.stride()
        hit = memo.get(key)
        if hit is not None:
            env[i] = _REINTERPRET(x, *hit)
            return
        env[i] = y = fn(run.device, x)
        if key not in memo:
            same = (
                _REINTERPRET is not None
                and y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
            )
            memo[key] = (
                (y.shape, y.stride(), y.storage_offset() - x.storage_offset()) if same else None
            )

    return op


def _contiguous(i: int) -> Op:
    def op(run: Any) -> None:
        t = run.env[i]
        if not t.is_contiguous():
            run.env[i] = t.contiguous()

    return op


def _laid_out(i: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> Op:
    def op(run: Any) -> None:
        run.env[i] = conform(run.env[i], shape, strides)

    return op


def _launch(step, loads, stored, specs, slow, broken) -> Op:
    """A kernel step: its buffers gathered and its outputs allocated by the prebuilt templates,
    straight to its launcher once the slow path has built it (and while the kernel needs no
    per-call check)."""
    kernel = step.kernel
    key = (kernel.source, kernel.name)
    arg_spec = step.arg_spec

    fresh = tuple((shape, strides, dtype) for shape, strides, dtype, scatter, donor in specs)
    plain = all(not scatter and donor is None for *_, scatter, donor in specs)
    # the usual layout: every buffer in order (inputs, then outputs), then the constants
    n = len(loads) + len(stored)
    ordered = arg_spec[:n] == tuple((True, k) for k in range(n))
    tail = (
        [v for buf, v in arg_spec[n:]] if ordered and not any(b for b, _ in arg_spec[n:]) else None
    )
    if plain and tail is not None and len(fresh) == 1:
        return _launch_one(step, loads, stored[0], fresh[0], tail, slow, broken)

    def op(run: Any) -> None:
        launcher = step.__dict__.get("launcher")
        if launcher is None or launcher.scratch or key in broken:
            return slow(run, step)  # first use, TMA alignment checks, broken
        env, alloc = run.env, run.alloc
        bufs = [env[i] for i in loads]
        if plain:  # every output a new buffer (the common case)
            outs = [alloc(shape, strides, dtype) for shape, strides, dtype in fresh]
        else:
            outs = [
                (alloc(shape, strides, dtype) if donor is None else env[donor]).zero_()
                if scatter
                else alloc(shape, strides, dtype)
                if donor is None
                else env[donor]
                for shape, strides, dtype, scatter, donor in specs
            ]
        bufs += outs
        try:
            launcher(
                bufs + tail if tail is not None else [bufs[v] if b else v for b, v in arg_spec]
            )
        except Exception:  # noqa: BLE001 - the slow path decides (eager fallback, or raise)
            return slow(run, step)
        for s, t in zip(stored, outs):
            env[s] = t

    return op


def _launch_one(step, loads, s, fresh, tail, slow, broken) -> Op:
    """``_launch`` for the commonest step: one new output, the usual argument layout."""
    key = (step.kernel.source, step.kernel.name)
    shape, strides, dtype = fresh

    def op(run: Any) -> None:
        launcher = step.__dict__.get("launcher")
        if launcher is None or launcher.scratch or (broken and key in broken):
            return slow(run, step)  # first use, TMA alignment checks, broken
        env = run.env
        out = run.alloc(shape, strides, dtype)
        try:
            launcher([env[i] for i in loads] + [out] + tail)
        except Exception:  # noqa: BLE001 - the slow path decides (eager fallback, or raise)
            return slow(run, step)
        env[s] = out

    return op


def last_reads(plan: Any) -> dict[int, int]:
    """For each buffer a kernel step of ``plan`` stores, the index of the last step that reads
    it or a view of it, where only kernels, library calls and matmuls (their results new
    tensors) read it and it is not (a view of) a graph output: the buffers a later kernel may
    write into."""
    g = plan.graph
    last: dict[int, int] = {}
    kept = {g.base_of(o) for o in g.outputs}
    for k, step in enumerate(plan.steps):
        if hasattr(step, "kernel"):
            for s in step.kernel.info.stored:
                last.setdefault(s, -1)
            reads = [i for i, _ in step.load_kinds(g)]
        else:
            reads = list(step.reads(g))
            if not _fresh_result(g, step):  # an eager op's result may alias what it reads
                kept.update(g.base_of(i) for i in reads)
        for i in reads:
            last[g.base_of(i)] = k
    return {b: k for b, k in last.items() if b not in kept}


def _fresh_result(graph: Any, step: Any) -> bool:
    """Whether a non-kernel step's result is a new tensor: a library call's, a matmul's."""
    return hasattr(step, "call") or graph[step.out].kind == "matmul"


_ALLOCATORS: dict[torch.device, tuple[Callable[..., torch.Tensor], int | None]] = {}


def allocator(device: torch.device) -> Callable[..., torch.Tensor]:
    """``alloc(shape, strides, dtype)`` on ``device``: the C-level allocators Inductor's own
    generated code calls (no argument parsing) where the device is the current one, else
    ``torch.empty_strided``. Chosen once per device; a CUDA device's C allocator serves only
    while that device is the current one (asked on every call)."""
    hit = _ALLOCATORS.get(device)
    if hit is None:
        hit = _ALLOCATORS[device] = _allocator_for(device)
    alloc, index = hit
    if index is None or index == torch._C._cuda_getDevice():
        return alloc
    return lambda shape, strides, dtype: torch.empty_strided(
        shape, strides, dtype=dtype, device=device
    )


def _allocator_for(device: torch.device) -> tuple[Callable[..., torch.Tensor], int | None]:
    """The allocator for ``device`` and the CUDA device that must be current for it (None:
    any)."""
    guards = _GUARDS
    if device.type == "cuda" and hasattr(guards, "_empty_strided_cuda"):
        # the inputs are on this device: CUDA is initialized, its current device is asked plainly
        return guards._empty_strided_cuda, device.index
    if device.type == "cpu" and hasattr(guards, "_empty_strided_cpu"):
        return guards._empty_strided_cpu, None
    return (
        lambda shape, strides, dtype: torch.empty_strided(
            shape, strides, dtype=dtype, device=device
        )
    ), None


def program(plan: Any, slow: Callable[[Any, Any], None], broken: Mapping) -> Program:
    """The plan's program, built on its first call and kept with the plan."""
    prog = plan.__dict__.get("_program")
    if prog is None:
        prog = Program(plan, slow, broken)
        plan.__dict__["_program"] = prog  # frozen: cached like a cached_property
    return prog


__all__ = ["Program", "program"]
