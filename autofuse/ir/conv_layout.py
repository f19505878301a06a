"""Each convolution's memory format as a stated rule (an IR -> IR pass).

cuDNN's fastest kernel for a convolution may want its operands channels-last (NHWC, or NDHWC
for a 3-D convolution) where the plan holds them contiguous, or the other way round; which one
wins depends on the shapes, the dtype and the GPU, so it is measured, not assumed. The rule
(``settings().conv_layout``, ``AUTOFUSE_CONV_LAYOUT``):

- ``measure`` (default): on a CUDA device, each 2-D and 3-D convolution is timed once in each
  format, as its plan step runs it (random data of its shapes and dtype; in channels-last its
  inputs converted once and its output given back in eager's strides: the conversions are in
  the time), and the faster recorded on the node (``layout``, with both times in
  ``layout_us``); measurements are kept per process by the convolution's signature. On a CPU
  (Triton's interpreter) nothing is recorded: eager's layout.
- ``eager``: nothing recorded (the fixed rule of ``ir/eager.py``: 16-bit CUDA convolutions
  channels-last).
- ``contiguous`` / ``channels_last``: that format for every convolution, on any device.

``ir/eager.library_call`` runs a convolution with a recorded ``layout`` in it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from autofuse.ir.conv_fold import is_convolution
from autofuse.ir.eager import bind_node
from autofuse.ir.graph import Graph, make_attrs
from autofuse.settings import settings

__all__ = ["LAYOUTS", "choose_layouts", "measure_layouts"]

LAYOUTS = ("contiguous", "channels_last")
_MEASURED: dict[str, tuple[float, float]] = {}  # convolution signature -> (contiguous, cl) s


def _with_layout(node, layout: str, times: tuple[float, float] | None = None):
    attrs = dict(node.attrs, layout=layout)
    if times is not None:
        attrs["layout_us"] = tuple(round(t * 1e6, 3) for t in times)
    return replace(node, attrs=make_attrs(**attrs))


def cuda_seconds(fn: Callable[[], object], reps: int = 20) -> float:
    """The median time of ``fn()`` on the current CUDA device (CUDA events, after warm-up)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return sorted(times)[len(times) // 2]


def measure_layouts(graph: Graph, i: int, device: str = "cuda",
                    timer: Callable[[Callable[[], object]], float] = cuda_seconds
                    ) -> tuple[float, float]:  # fmt: skip
    """Seconds of convolution ``i``'s plan step in each of :data:`LAYOUTS`, on random data."""
    node = graph[i]
    key = f"{device}:{node.signature()}:" + ";".join(graph[j].signature() for j in node.inputs)
    if key in _MEASURED and timer is cuda_seconds:
        return _MEASURED[key]
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), torch.no_grad():  # (the backend compiles in a fake mode)
        gen = torch.Generator(device=device).manual_seed(0)
        args = [
            torch.randn(graph[j].shape, generator=gen, device=device,
                        dtype=getattr(torch, graph[j].dtype))
            for j in node.inputs
        ]  # fmt: skip
        steps = [bind_node(_with_layout(node, layout)) for layout in LAYOUTS]
        times = tuple(timer(lambda s=s: s(device, *args)) for s in steps)
    _MEASURED[key] = (times[0], times[1])
    return _MEASURED[key]


def choose_layouts(graph: Graph, cuda: bool, rule: str | None = None,
                   timer: Callable[[Callable[[], object]], float] = cuda_seconds,
                   device: str = "cuda") -> Graph:  # fmt: skip
    """``graph`` with each 2-D / 3-D convolution's format recorded by ``rule`` (default: the
    settings'; measured on ``device`` by ``timer``); the graph itself where nothing is."""
    if rule is None:
        rule = settings().conv_layout
    if rule == "eager" or (rule == "measure" and not cuda):
        return graph
    nodes = list(graph.nodes)
    for i, node in enumerate(graph.nodes):
        if not is_convolution(node) or len(node.shape) not in (4, 5) or node.attr("layout"):
            continue
        if rule in LAYOUTS:
            nodes[i] = _with_layout(node, rule)
            continue
        times = measure_layouts(graph, i, device, timer)
        nodes[i] = _with_layout(node, LAYOUTS[int(times[1] < times[0])], times)
    return Graph(tuple(nodes), graph.inputs, graph.outputs)
