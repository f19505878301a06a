"""The cuDNN provider: a 2-D convolution with what follows it up to a ReLU — its bias added, a
residual of its shape added — as one call of cuDNN's fused convolution-bias-activation, through
torch's ``cudnn_convolution_relu`` / ``cudnn_convolution_add_relu`` (CUDA only, no autograd
formula: the forward of an inference graph, or of a training graph whose backward reads none
of the chain's intermediates).

The call is a candidate, never assumed faster: a plan is timed with each chain the provider
offers run as its call against the plan as it is (the library convolution and the generated
kernel that fuses its epilogue; ``plan/library_fusion.py``); torch's own fusion of these calls
was reported 17x slower on 7x7 channels-last convolutions (pytorch #68506). The call takes the
convolution's operands in the layout the plan chose for it (``ir/conv_layout.py``: channels-last
converts each 4-D operand) and gives its result in the strides kernels read it with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from autofuse.ir.conv_fold import bias_add_of, is_convolution
from autofuse.ir.eager import conform
from autofuse.ir.graph import Graph, buffer_strides, numel
from autofuse.kernels.conv.spec import conv_call
from autofuse.kernels.library.call import LibraryCall, provided

__all__ = ["CudnnProvider", "conv_add_relu", "conv_relu"]

_DTYPES = ("float32", "float16")  # cuDNN's fused conv-bias-activation: no bfloat16 here


def _operands(x: torch.Tensor, w: torch.Tensor, z: Any, channels_last: bool) -> tuple:
    if not channels_last:
        return x, w, z
    cl = torch.channels_last
    z = z.contiguous(memory_format=cl) if z is not None else None
    return x.contiguous(memory_format=cl), w.contiguous(memory_format=cl), z


def conv_relu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, *,
              stride: tuple[int, ...], padding: tuple[int, ...], dilation: tuple[int, ...],
              groups: int, channels_last: bool, strides: tuple[int, ...]) -> torch.Tensor:  # fmt: skip
    """``relu(conv2d(x, w) + b)`` in one cuDNN call, in ``strides``."""
    x, w, _ = _operands(x, w, None, channels_last)
    bias = None if b is None else b.reshape(-1)
    y = torch.cudnn_convolution_relu(x, w, bias, stride, padding, dilation, groups)
    return conform(y, tuple(y.shape), strides)


def conv_add_relu(x: torch.Tensor, w: torch.Tensor, z: torch.Tensor,
                  b: torch.Tensor | None = None, *, stride: tuple[int, ...],
                  padding: tuple[int, ...], dilation: tuple[int, ...], groups: int,
                  channels_last: bool, strides: tuple[int, ...]) -> torch.Tensor:  # fmt: skip
    """``relu(conv2d(x, w) + b + z)`` in one cuDNN call, in ``strides``."""
    x, w, z = _operands(x, w, z, channels_last)
    bias = None if b is None else b.reshape(-1)
    y = torch.cudnn_convolution_add_relu(x, w, z, 1.0, bias, stride, padding, dilation, groups)
    return conform(y, tuple(y.shape), strides)


_FUNCTIONS: dict[str, Callable[..., Any]] = {"conv_relu": conv_relu, "conv_add_relu": conv_add_relu}
_WORDS = {
    "conv_relu": "torch.cudnn_convolution_relu",
    "conv_add_relu": "torch.cudnn_convolution_add_relu",
}


class CudnnProvider:
    name = "cudnn"

    def offers(self, graph: Graph, group: frozenset[int]) -> tuple[LibraryCall, ...]:
        call = fused_conv_call(graph, group)
        return (call,) if call is not None else ()

    def function(self, name: str) -> Callable[..., Any]:
        return provided(_FUNCTIONS, "cuDNN", name)

    def reason(self, graph: Graph, call: LibraryCall) -> str:
        ops = " + ".join(graph[i].op for i in call.nodes[1:])
        return (
            f"convolution + {ops} as one cuDNN call ({_WORDS[call.name]}: cuDNN's fused "
            "convolution-bias-activation)"
        )

    def preferred(self, graph: Graph, group: frozenset[int]) -> LibraryCall | None:
        return None  # measured against the plan's own chain, never taken unmeasured

    def note(self, graph: Graph, i: int) -> str | None:
        return None

    def key_parts(self, graph: Graph) -> dict[str, str]:
        """The cuDNN version where the graph holds a convolution (a cuDNN call may be in its
        plan; cuDNN's engines, and so results and speed, change by version)."""
        version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        if version is None or not any(is_convolution(n) for n in graph.nodes):
            return {}
        return {"cudnn": str(version)}


def _only_user(graph: Graph, i: int) -> int | None:
    users = graph.users[i]
    outs = {graph.base_of(o) for o in graph.outputs}
    return users[0] if len(users) == 1 and i not in outs else None


def _chain(graph: Graph, conv: int, group: frozenset[int]) -> tuple[list[int], Any, Any] | None:
    """The group's nodes from the convolution to the ReLU in order, the bias vector (a node, or
    None) and the residual (a node, or None); None where the group is not that chain."""
    path, bias, z = [conv], None, None
    add = bias_add_of(graph, conv)
    if add is not None and add in group:
        other = next(j for j in graph[add].inputs if j != conv)
        bias, path = graph.base_of(other), [conv, add]
    nxt = _only_user(graph, path[-1])
    if nxt is not None and graph[nxt].op == "add" and nxt in group:
        others = [j for j in graph[nxt].inputs if j != path[-1]]
        if len(others) != 1 or others[0] in group:
            return None
        z, path = others[0], [*path, nxt]
        if graph[z].shape != graph[conv].shape or graph[z].dtype != graph[conv].dtype:
            return None
        nxt = _only_user(graph, nxt)
    if nxt is None or graph[nxt].op != "relu" or nxt not in group:
        return None
    path.append(nxt)
    return (path, bias, z) if set(path) == group else None


def fused_conv_call(graph: Graph, group: frozenset[int]) -> LibraryCall | None:
    """The call that runs ``group`` when it is a 2-D convolution (float32 / float16, not
    transposed, its bias peeled or in the call) followed by its bias add, a residual add and a
    ReLU (the adds optional), each read only by the next; else None."""
    convs = [i for i in group if is_convolution(graph[i])]
    if len(convs) != 1 or len(graph[convs[0]].shape) != 4:
        return None
    (conv,) = convs
    node = graph[conv]
    x, w = graph[node.inputs[0]], graph[node.inputs[1]]
    if (
        not (node.dtype == x.dtype == w.dtype)
        or node.dtype not in _DTYPES
        or numel(node.shape) == 0
    ):
        return None
    call = conv_call(graph, conv)
    found = _chain(graph, conv, group)
    if call.transposed or found is None:
        return None
    path, bias, z = found
    if call.has_bias:
        if bias is not None:
            return None  # a second bias: not one call's
        bias = node.inputs[2]
    if bias is not None and (
        graph[bias].dtype != node.dtype or numel(graph[bias].shape) != node.shape[1]
    ):
        return None
    args = (
        *node.inputs[:2],
        *((z,) if z is not None else ()),
        *((bias,) if bias is not None else ()),
    )
    params = (
        ("stride", call.stride), ("padding", call.padding), ("dilation", call.dilation),
        ("groups", call.groups), ("channels_last", node.attr("layout") == "channels_last"),
        ("strides", tuple(buffer_strides(graph[path[-1]]))),
    )  # fmt: skip
    name = "conv_add_relu" if z is not None else "conv_relu"
    return LibraryCall("cudnn", name, args, path[-1], tuple(path), params)
