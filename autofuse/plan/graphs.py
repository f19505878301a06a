"""A plan replayed as one CUDA graph (like ``torch.compile(mode="reduce-overhead")``).

``GraphReplay(plan)`` captures ``execute(plan, inputs)`` once, on the first call with CUDA
tensors (after warm-up runs on a side stream, which compile the kernels), into a
``torch.cuda.CUDAGraph`` over the first call's own input tensors (kept alive here, so their
memory cannot be handed to another tensor). A later call with those same tensors (the same
buffers, their contents may have changed: a training or serving loop that refills its inputs in
place) replays the graph with no copy at all; a call with other tensors copies them into buffers
of a second graph, captured on first need, in one multi-tensor copy. The outputs are returned as
copies of the graph's static outputs, so a result stays valid after the next call. Inputs must
match the plan exactly (shapes, dtypes, strides; the runner checks that before it gets here).

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


class CudaGraphNote(UserWarning):
    """``cuda_graph=True`` has no effect here (interpreter, CPU tensors, capture failed)."""


class _Captured:
    """One CUDA graph over fixed input buffers, with its static outputs."""

    def __init__(self, plan: Any, inputs: Sequence[torch.Tensor], warmup: int) -> None:
        from autofuse.plan.runtime import execute

        self.inputs = list(inputs)
        self.ptrs = [x.data_ptr() for x in inputs]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):  # compiles every kernel, outside the capture
                execute(plan, self.inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = execute(plan, self.inputs)

    def holds(self, inputs: Sequence[torch.Tensor]) -> bool:
        return all(x.data_ptr() == p for x, p in zip(inputs, self.ptrs))

    def replay(self) -> list[torch.Tensor]:
        self.graph.replay()
        if len(self.outputs) == 1:
            return [self.outputs[0].clone()]
        outs = [torch.empty_like(o) for o in self.outputs]
        torch._foreach_copy_(outs, self.outputs)
        return outs


class GraphReplay:
    def __init__(self, plan: Any, warmup: int = 2) -> None:
        self.plan, self.warmup = plan, warmup
        self.graph: Any = None  # over the first call's own inputs
        self.copied: Any = None  # over buffers other inputs are copied into
        self.off: str | None = None  # why replay is off (the plan then runs step by step)

    def _note(self, why: str) -> None:
        self.off = why
        warnings.warn(
            f"autofuse: cuda_graph=True is off for this plan: {why}; it runs kernel by kernel",
            CudaGraphNote,
            stacklevel=4,
        )

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
        """The plan's outputs by replay, or None when replay is off (run it as usual)."""
        if self.graph is not None and self.graph.holds(inputs):
            return self.graph.replay()
        if self.off is not None:
            return None
        try:
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
            if self.copied is None:
                buffers = [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype,
                                               device=x.device) for x in inputs]  # fmt: skip
                torch._foreach_copy_(buffers, list(inputs))
                self.copied = _Captured(self.plan, buffers, self.warmup)
        except Exception as e:  # noqa: BLE001 - not capturable: run step by step
            self.graph = self.copied = None
            self._note(f"capture failed ({type(e).__name__}: {str(e)[:200]})")
            return None
        torch._foreach_copy_(self.copied.inputs, list(inputs))
        return self.copied.replay()
