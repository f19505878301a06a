"""A plan replayed as one CUDA graph (like ``torch.compile(mode="reduce-overhead")``).

``GraphReplay(plan)`` captures ``execute(plan, inputs)`` once, on the first call with CUDA
tensors (after warm-up runs on a side stream, which compile the kernels), into a
``torch.cuda.CUDAGraph`` over the first call's own input tensors (kept alive here, so their
memory cannot be handed to another tensor). A later call with those same tensors (the same
buffers, their contents may have changed: a training or serving loop that refills its inputs in
place) replays the graph with no copy at all; a call with other tensors copies those that are
not the first call's (a new batch; the weights stay where they are) into buffers of a second
graph, captured on first need, in one multi-tensor copy. Inputs must match the plan exactly
(shapes, dtypes, strides; the runner checks that before it gets here).

The outputs are not copied out either: a call returns aliases of the graph's own output
buffers, and the next replay happens only once no alias of them is alive (the storages' use
counts, as torch.compile's CUDA-graph trees check theirs). While the caller still holds the
last results (``y = f(x)`` in a loop holds the previous ``y`` during the call), a twin graph
over the same inputs, with its own outputs, is replayed instead; when both are held the call
runs kernel by kernel. A result therefore never changes under the caller. The twin costs a
second copy of the plan's working memory.

Off, with one note (:class:`CudaGraphNote`), under Triton's interpreter and for CPU tensors: the
plan then runs step by step as usual. A plan that cannot be captured (an eager step that
synchronizes with the host, for instance) is run step by step too, after one note naming the
error.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from autofuse.interpreter import interpreting
from autofuse.plan.runtime import execute


class CudaGraphNote(UserWarning):
    """``cuda_graph=True`` has no effect here (interpreter, CPU tensors, capture failed)."""


def _use_counts(ts: Sequence[torch.Tensor]) -> list[int]:
    return [torch._C._storage_Use_Count(t.untyped_storage()._cdata) for t in ts]


def unheld_counts(outputs: Sequence[torch.Tensor], lent: Sequence[int]) -> list[int]:
    """The use counts of the ``lent`` outputs' storages while nobody else holds them: one per
    distinct output tensor on the storage, one for the storage object the count is read
    through."""
    owners = {id(o): o.untyped_storage().data_ptr() for o in outputs}
    mine = list(owners.values())
    return [1 + mine.count(outputs[k].untyped_storage().data_ptr()) for k in lent]


class _Captured:
    """One CUDA graph over fixed input buffers, with its static outputs. ``copied``: the inputs
    a call copies into the graph's own buffers; the others are read where the capture found
    them (a call must pass those same tensors: ``holds``). ``twin``: a second graph over the
    same inputs with outputs of its own, replayed while this one's results are held."""

    def __init__(
        self, plan: Any, inputs: Sequence[torch.Tensor], warmup: int, copied: Sequence[int] = ()
    ) -> None:
        self.plan = plan
        self.inputs = list(inputs)
        self.ptrs = [x.data_ptr() for x in inputs]
        self.copied = tuple(copied)
        self.fixed = tuple(k for k in range(len(self.inputs)) if k not in set(self.copied))
        self.twin: _Captured | None = None
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):  # compiles every kernel, outside the capture
                execute(plan, self.inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = execute(plan, self.inputs)
        # an output in one of our own input buffers is copied out (the next call refills
        # them); the graph's own outputs are lent out and checked by their use counts
        mine = {self.inputs[k].untyped_storage().data_ptr() for k in self.copied}
        theirs = {self.inputs[k].untyped_storage().data_ptr() for k in self.fixed}
        where = [o.untyped_storage().data_ptr() for o in self.outputs]
        self.clone_out = tuple(k for k, p in enumerate(where) if p in mine)
        self.lent = tuple(k for k, p in enumerate(where) if p not in mine and p not in theirs)
        # unheld, a storage is referenced by our output tensors on it and by the storage
        # object the count is read through (not measured here: a reference the capture left
        # behind and later dropped would hide a caller's)
        self.base = unheld_counts(self.outputs, self.lent)

    def holds(self, inputs: Sequence[torch.Tensor]) -> bool:
        ptrs = self.ptrs
        return all(inputs[k].data_ptr() == ptrs[k] for k in self.fixed)

    def free(self) -> bool:
        """No alias of this graph's outputs is alive outside: a replay overwrites nothing."""
        return _use_counts([self.outputs[k] for k in self.lent]) == self.base

    def replay(self, inputs: Sequence[torch.Tensor] = ()) -> list[torch.Tensor] | None:
        """Replay this graph, or its twin while this one's results are held (capturing the
        twin on first need); None when both are held."""
        run = self if self.free() else self.twin
        if run is None:
            run = self.twin = _Captured(self.plan, self.inputs, 0, self.copied)
        elif run is not self and not run.free():
            return None
        if self.copied:
            torch._foreach_copy_(
                [self.inputs[k] for k in self.copied], [inputs[k] for k in self.copied]
            )
        run.graph.replay()
        outs = [o.detach() for o in run.outputs]  # aliases: their use counts are the check
        for k in run.clone_out:
            outs[k] = outs[k].clone()
        return outs


def _buffers_for(inputs: Sequence[torch.Tensor], moved: Sequence[int]) -> list[torch.Tensor]:
    """The inputs, with those at ``moved`` replaced by new buffers of the same layout."""
    out = list(inputs)
    for k in moved:
        x = inputs[k]
        out[k] = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
    return out


class GraphReplay:
    MAX_CAPTURES = 4  # graphs over other inputs; past that, every input is copied

    def __init__(self, plan: Any, warmup: int = 2) -> None:
        self.plan, self.warmup = plan, warmup
        self.graph: Any = None  # over the first call's own inputs
        self.copied: Any = None  # over buffers the inputs that moved are copied into
        self.captures = 0
        self.off: str | None = None  # why replay is off (the plan then runs step by step)

    def _note(self, why: str) -> None:
        self.off = why
        warnings.warn(
            f"autofuse: cuda_graph=True is off for this plan: {why}; it runs kernel by kernel",
            CudaGraphNote,
            stacklevel=4,
        )

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
        """The plan's outputs by replay, or None when replay is off or the results of every
        graph over these inputs are still held (run it as usual)."""
        if self.off is not None:
            return None
        try:
            if self.graph is not None and self.graph.holds(inputs):
                return self.graph.replay()
            if self.copied is not None and self.copied.holds(inputs):
                return self.copied.replay(inputs)
            if self.graph is None:
                if interpreting():
                    self._note(
                        "kernels run in Triton's interpreter (CPU), which has no CUDA graphs"
                    )
                    return None
                if not inputs or not all(x.is_cuda for x in inputs):
                    self._note("the inputs are not CUDA tensors")
                    return None
                self.graph = _Captured(self.plan, inputs, self.warmup)
                return self.graph.replay()
            self.copied = self._capture_moved(inputs)
        except Exception as e:  # noqa: BLE001 - not capturable: run step by step
            self.graph = self.copied = None
            self._note(f"capture failed ({type(e).__name__}: {str(e)[:200]})")
            return None
        return self.copied.replay(inputs)

    def _capture_moved(self, inputs: Sequence[torch.Tensor]) -> _Captured:
        """A graph whose buffers take the inputs that are not the first call's tensors (a new
        batch) while those that are (weights) are read in place; once the set of moved inputs
        has changed ``MAX_CAPTURES`` times, one that copies every input."""
        self.captures += 1
        first = self.graph.ptrs
        moved = {k for k, x in enumerate(inputs) if x.data_ptr() != first[k]}
        if self.copied is not None:
            moved |= set(self.copied.copied)
        if self.captures > self.MAX_CAPTURES:
            moved = set(range(len(inputs)))
        moved_k = sorted(moved)
        buffers = _buffers_for(inputs, moved_k)
        torch._foreach_copy_([buffers[k] for k in moved_k], [inputs[k] for k in moved_k])
        return _Captured(self.plan, buffers, self.warmup, moved_k)
