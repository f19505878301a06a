"""Each convolution's memory format as a stated rule (an IR -> IR pass).

cuDNN's fastest kernel for a convolution may want its operands channels-last (NHWC, or NDHWC
for a 3-D convolution) where the plan holds them contiguous, or the other way round; which one
wins depends on the shapes, the dtype and the GPU, so it is measured, not assumed. The rule
(``settings().conv_layout``, ``AUTOFUSE_CONV_LAYOUT``):

- ``measure`` (default): on a CUDA device, each 2-D and 3-D convolution is timed once in each
  format, as its plan step runs it (random data of its shapes and dtype; in channels-last its
  inputs converted once: the conversions are in the time), and the faster recorded on the node
  (``layout``, with both times in ``layout_us``); measurements are kept per process by the
  convolution's signature. On a CPU (Triton's interpreter) nothing is recorded: eager's layout.
- ``eager``: nothing recorded (the fixed rule of ``ir/eager.py``: 16-bit CUDA convolutions
  channels-last).
- ``contiguous`` / ``channels_last``: that format for every convolution, on any device.

A channels-last convolution *keeps* its result channels-last (``node.strides`` become the
channels-last strides of its shape) where the graph does not return it: the kernels that read it
take those strides (``ir/graph.buffer_strides``), so the layout is converted once, at the
chain's input, and the chain's last kernel writes the output in eager's strides. One the graph
returns is given back in eager's strides (converted in its step). Whether the kernels reading a
channels-last result are as fast as on a contiguous one is a question for the whole plan: the
planner times the plan with every convolution contiguous beside it (``plan/planner.py``).

``ir/eager.library_call`` runs a convolution with a recorded ``layout`` in it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from autofuse.ir.conv_fold import is_convolution
from autofuse.ir.eager import bind_node
from autofuse.ir.graph import Graph, Node, contiguous_strides, dedupe, make_attrs
from autofuse.settings import settings

__all__ = [
    "LAYOUTS",
    "channels_last_differs",
    "channels_last_strides",
    "choose_layouts",
    "measure_layouts",
    "relayout",
]

LAYOUTS = ("contiguous", "channels_last")
_MEASURED: dict[str, tuple[float, float]] = {}  # convolution signature -> (contiguous, cl) s


def channels_last_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a 4-D (``channels_last``) or 5-D (``channels_last_3d``) tensor of
    ``shape`` with its channels innermost."""
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    return tuple(torch.empty(shape, device="meta").contiguous(memory_format=fmt).stride())


def _with_layout(node, layout: str, times: tuple[float, float] | None = None, keep: bool = False):
    """``node`` run in ``layout``; with ``keep`` (channels-last, a result the graph does not
    return) its result stays channels-last: its strides say so."""
    attrs = dict(node.attrs, layout=layout)
    if times is not None:
        attrs["layout_us"] = tuple(round(t * 1e6, 3) for t in times)
    strides = node.strides
    if layout == "channels_last" and keep:
        strides = channels_last_strides(tuple(node.shape))
        attrs["eager_strides"] = tuple(node.strides)
    return replace(node, attrs=make_attrs(**attrs), strides=strides)


def relayout(graph: Graph, layout: str) -> Graph:
    """``graph`` with every convolution that has a recorded layout run in ``layout`` instead
    (its eager strides back where it kept channels-last): the planner's other plan."""
    nodes = list(graph.nodes)
    for i, node in enumerate(graph.nodes):
        if node.attr("layout_copy"):
            continue  # removed below (contiguous), kept as it is (channels-last)
        if not is_convolution(node) and node.attr("eager_strides") is not None:  # a kept input
            nodes[i] = _in_eager_layout(node)
            continue
        if not is_convolution(node) or not node.attr("layout") or node.attr("layout") == layout:
            continue
        plain = _in_eager_layout(node, layout_by="plan")  # the whole plans timed: reported
        nodes[i] = _with_layout(plain, layout, keep=_keepable(graph, i))
    out = Graph(tuple(nodes), graph.inputs, graph.outputs)
    if layout == "channels_last":
        return keep_inputs(convert_inputs(out))
    return _without_copies(out)


# a convolution picked contiguous whose channels-last time alone is within this factor of its
# contiguous one is in doubt: alone, its input is converted by eager's copy, in a plan by a
# generated kernel (L2_54 in bf16 on an H100: 1816 against 1679 us alone, the converting copy
# 360 us of it in the plan, which took 1479 us channels-last against 2142 contiguous)
DOUBT = 1.25


def channels_last_differs(graph: Graph) -> bool:
    """Whether the plan with every convolution channels-last is worth timing beside the graph's
    own: the convolutions' picks differ (each converting between them), two or more picked
    contiguous (each picked alone, its input's conversion in its time: a chain of them all
    channels-last converts once, at its input, as torch.compile's layout pass makes it), or one
    picked contiguous by less than :data:`DOUBT`."""
    convs = [n for n in graph.nodes if is_convolution(n) and n.attr("layout")]
    layouts = [n.attr("layout") for n in convs]
    if len(set(layouts)) > 1 or (len(layouts) > 1 and set(layouts) == {"contiguous"}):
        return True
    return any(_in_doubt(n) for n in convs if n.attr("layout") == "contiguous")


def _in_doubt(node: Node) -> bool:
    """A contiguous pick whose channels-last time alone is within :data:`DOUBT` of it."""
    times = node.attr("layout_us")
    return bool(times) and times[1] < DOUBT * times[0]


def _in_eager_layout(node: Node, **extra: str) -> Node:
    """``node`` with the layout it kept undone (eager's strides back, ``eager_strides``
    dropped) and ``extra`` attributes added."""
    attrs = {k: v for k, v in node.attrs if k != "eager_strides"}
    strides = node.attr("eager_strides") or node.strides
    return replace(node, attrs=make_attrs(**{**attrs, **extra}), strides=strides)


def _keepable(graph: Graph, i: int) -> bool:
    """Whether convolution ``i``'s result may stay channels-last: the graph does not return it
    (or a view of it) and it has eager's contiguous strides to begin with."""
    outs = {graph.base_of(o) for o in graph.outputs}
    return i not in outs and tuple(graph[i].strides) == contiguous_strides(graph[i].shape)


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
                    timer: Callable[[Callable[[], object]], float] = cuda_seconds,
                    keep: bool = False) -> tuple[float, float]:  # fmt: skip
    """Seconds of convolution ``i``'s plan step in each of :data:`LAYOUTS`, on random data
    (``keep``: the channels-last step keeps its result channels-last)."""
    node = graph[i]
    key = f"{device}:{keep}:{node.signature()}:" + ";".join(
        graph[j].signature() for j in node.inputs
    )
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
        steps = [bind_node(_with_layout(node, layout, keep=keep)) for layout in LAYOUTS]
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
        keep = _keepable(graph, i)
        if rule in LAYOUTS:
            nodes[i] = _with_layout(node, rule, keep=keep)
            continue
        times = measure_layouts(graph, i, device, timer, keep)
        nodes[i] = _with_layout(node, LAYOUTS[int(times[1] < times[0])], times, keep)
    return keep_inputs(convert_inputs(Graph(tuple(nodes), graph.inputs, graph.outputs)))


def _remapped(graph: Graph, visit) -> Graph:
    """``graph`` rebuilt node by node: ``visit(node, nodes)`` appends what replaces ``node``
    (its inputs already renumbered) to ``nodes`` and returns its new index."""
    nodes: list[Node] = []
    remap: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        remap[i] = visit(replace(node, inputs=tuple(remap[j] for j in node.inputs)), nodes)
    return Graph(tuple(nodes), tuple(remap[i] for i in graph.inputs),
                 tuple(remap[o] for o in graph.outputs))  # fmt: skip


def convert_inputs(graph: Graph) -> Graph:
    """``graph`` with a generated copy (``layout_copy``) converting each channels-last
    convolution's input to channels-last where that input is a contiguous graph input: a
    kernel tiled by the channels writes it (``kernels/pointwise``) instead of ATen's copy inside
    the convolution's step. Inputs computed by kernels are written channels-last by them
    (:func:`keep_inputs`)."""

    def visit(node: Node, nodes: list[Node]) -> int:
        if is_convolution(node) and node.attr("layout") == "channels_last":
            x = nodes[node.inputs[0]]
            if _converts(x):
                attrs = make_attrs(eager_strides=tuple(x.strides), layout_copy=True)
                cl = channels_last_strides(tuple(x.shape))
                nodes.append(Node("copy", (node.inputs[0],), x.shape, x.dtype, cl, attrs,
                                  name=f"{x.name}_channels_last"))  # fmt: skip
                node = replace(node, inputs=(len(nodes) - 1, *node.inputs[1:]))
        nodes.append(node)
        return len(nodes) - 1

    return dedupe(_remapped(graph, visit))


def _converts(x: Node) -> bool:
    """Whether a convolution's input ``x`` is a graph input worth converting by a kernel: 4-D
    or 5-D floating, contiguous, with channels and a plane to transpose between."""
    if x.kind != "input" or len(x.shape) not in (4, 5) or x.dtype not in _FLOATS:
        return False
    return tuple(x.strides) == contiguous_strides(x.shape) and x.shape[1] > 1


def _without_copies(graph: Graph) -> Graph:
    """``graph`` with every ``layout_copy`` bypassed (its readers read its input)."""

    def visit(node: Node, nodes: list[Node]) -> int:
        if node.attr("layout_copy"):
            return node.inputs[0]
        nodes.append(node)
        return len(nodes) - 1

    return _remapped(graph, visit)


def keep_inputs(graph: Graph) -> Graph:
    """``graph`` with each channels-last convolution's input written channels-last by the
    kernel that computes it (``eager_strides`` recorded, as for a kept result) where that input
    is a pointwise result read by channels-last convolutions alone and not returned: the chain
    converts nothing between its convolutions (the previous one's epilogue writes the layout the
    next one reads)."""
    outs = {graph.base_of(o) for o in graph.outputs}
    nodes = list(graph.nodes)
    for j, node in enumerate(graph.nodes):
        users = graph.users[j]
        if node.kind != "pointwise" or j in outs or len(node.shape) not in (4, 5) or not users:
            continue
        if tuple(node.strides) != contiguous_strides(node.shape) or node.dtype not in _FLOATS:
            continue
        if all(_reads_channels_last(graph[u], j) for u in users):
            attrs = dict(node.attrs, eager_strides=tuple(node.strides))
            strides = channels_last_strides(tuple(node.shape))
            nodes[j] = replace(node, attrs=make_attrs(**attrs), strides=strides)
    return Graph(tuple(nodes), graph.inputs, graph.outputs)


_FLOATS = ("float32", "float16", "bfloat16")


def _reads_channels_last(user, j: int) -> bool:
    """Whether ``user`` is a channels-last convolution reading ``j`` as its input alone."""
    if not is_convolution(user) or user.attr("layout") != "channels_last":
        return False
    return user.inputs[0] == j and list(user.inputs).count(j) == 1
