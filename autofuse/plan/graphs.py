"""A plan replayed as one CUDA graph (like ``torch.compile(mode="reduce-overhead")``).

``GraphReplay(plan)`` captures ``execute(plan, static_inputs)`` once, on the first call with
CUDA tensors (after warm-up runs on a side stream, which compile the kernels), into a
``torch.cuda.CUDAGraph`` over static input buffers. Each later call copies its inputs into those
buffers, replays the graph (one launch from the host for the whole plan) and returns copies of
the static outputs, so a result stays valid after the next call. Inputs must match the plan
exactly (shapes, dtypes, strides; the runner checks that before it gets here).

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


class GraphReplay:
    def __init__(self, plan: Any, warmup: int = 2) -> None:
        self.plan, self.warmup = plan, warmup
        self.graph: Any = None
        self.static_in: list[torch.Tensor] = []
        self.static_out: list[torch.Tensor] = []
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
        if self.graph is None:
            if self.off is not None:
                return None
            if interpreting():
                self._note("kernels run in Triton's interpreter (CPU), which has no CUDA graphs")
                return None
            if not inputs or not all(x.is_cuda for x in inputs):
                self._note("the inputs are not CUDA tensors")
                return None
            try:
                self._capture(inputs)
            except Exception as e:  # noqa: BLE001 - not capturable: run step by step
                self.graph = None
                self._note(f"capture failed ({type(e).__name__}: {str(e)[:200]})")
                return None
        for s, x in zip(self.static_in, inputs):
            s.copy_(x)
        self.graph.replay()
        return [o.clone() for o in self.static_out]

    def _capture(self, inputs: Sequence[torch.Tensor]) -> None:
        from autofuse.plan.runtime import execute

        self.static_in = [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype,
                                              device=x.device).copy_(x) for x in inputs]  # fmt: skip
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):  # compiles every kernel, outside the capture
                execute(self.plan, self.static_in)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.static_out = execute(self.plan, self.static_in)
        self.graph = graph
