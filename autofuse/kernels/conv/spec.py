"""A convolution node as an implicit GEMM: which captured convolutions the kind takes, and the
sizes of the product it computes.

A forward ``aten.convolution`` of ``groups`` groups over ``d`` spatial dims (1-3) is, per group
``g``, the product ``out[m, n] = sum_k A[m, k] * B[k, n]`` with

- ``m`` an output pixel: ``(image, o_1 .. o_d)`` flattened (``M = N * prod(out)``);
- ``n`` an output channel of the group (``N = C_out / groups``);
- ``k`` an input channel of the group and a kernel tap: ``(c, t_1 .. t_d)`` flattened, the
  weight's own order (``K = C_in / groups * prod(kernel)``), or ``(t_1 .. t_d, c)`` for a
  channels-last input (``channel_inner``: a K step reads consecutive channels);
- ``A[m, k] = x[image, g * C_in/groups + c, i_1 .. i_d]`` at ``i = o * stride - pad + t *
  dilation``, zero where ``i`` falls in the padding (never loaded);
- ``B[k, n] = w[g * C_out/groups + n, c, t_1 .. t_d]``.

A transposed convolution of stride 1 (no output padding) is the same product on the weight
flipped along its taps with its two channel dims swapped (``w[g * C_in/groups + c, n,
K - 1 - t]``) and the padding ``dilation * (K - 1) - pad``: :class:`ConvSpec` holds that
mapping (``flipped``). A strided transposed convolution scatters each input pixel over several
output pixels (no one-to-one tap per output): the library runs it, as it does a convolution
with its bias still in the call (``AUTOFUSE_CONV_BIAS=library``), one of 64-bit floats (no
``tl.dot`` for them), one with an empty dim, a non-float one, and one of more groups than the
grid's group axis holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from autofuse.ir.conv_fold import is_convolution
from autofuse.ir.graph import Graph, buffer_strides

__all__ = ["ConvCall", "ConvSpec", "conv_call", "conv_refusal", "conv_spec"]

_DOT_DTYPES = ("float32", "float16", "bfloat16")
MAX_GROUPS = 65535  # the GEMM template's batch (here: group) axis is grid axis 1


@dataclass(frozen=True)
class ConvSpec:
    """A convolution as the implicit GEMM of the module docstring (transposed ones mapped)."""

    x: int  # the input and weight nodes
    w: int
    batch: int
    c_in: int
    c_out: int
    groups: int
    in_size: tuple[int, ...]  # spatial dims of x, of the output, of the kernel
    out_size: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]  # the forward padding (a transposed one's mapped)
    dilation: tuple[int, ...]
    flipped: bool = False  # a stride-1 transposed convolution (weight flipped and swapped)
    # K ordered (tap, channel), the channel fastest: the input is channels-last (its channel
    # stride 1), so a K step reads consecutive channels; else (channel, tap), the weight's order
    channel_inner: bool = False

    @property
    def cg_in(self) -> int:
        return self.c_in // self.groups

    @property
    def cg_out(self) -> int:
        return self.c_out // self.groups

    @property
    def taps(self) -> int:
        return prod(self.kernel)

    @property
    def pixels(self) -> int:
        return prod(self.out_size)

    def gemm(self) -> tuple[int, int, int, int]:
        """(batch of the product: the groups, M, N, K)."""
        return self.groups, self.batch * self.pixels, self.cg_out, self.cg_in * self.taps

    @property
    def depthwise(self) -> bool:
        """One input and one output channel per group."""
        return self.cg_in == 1 and self.cg_out == 1 and self.groups > 1

    @property
    def pointwise(self) -> bool:
        """A 1x1 (1, 1x1x1) kernel of stride 1 and no padding: a plain GEMM over pixels."""
        return self.taps == 1 and set(self.stride) == {1} and set(self.padding) == {0}


@dataclass(frozen=True)
class ConvCall:
    """A captured ``aten.convolution``'s constant arguments, per spatial dim."""

    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    transposed: bool
    output_padding: tuple[int, ...]
    groups: int
    has_bias: bool  # the bias is in the call (``AUTOFUSE_CONV_BIAS=library``)


def conv_call(graph: Graph, i: int) -> ConvCall:
    """Convolution ``i``'s arguments as its ATen call holds them (node ``i`` must be one)."""
    if not is_convolution(graph[i]):
        raise ValueError(f"node {i} ({graph[i].op}) is not a convolution")
    args, dims = _args(graph, i), len(graph[i].shape) - 2
    stride, padding, dilation, out_pad = (
        tuple(_per_dim(_ints(args[k]), dims)) for k in (3, 4, 5, 7)
    )
    return ConvCall(stride, padding, dilation, bool(args[6]), out_pad, int(args[8]),
                    args[2] is not None)  # fmt: skip


def _args(graph: Graph, i: int) -> tuple:
    """The convolution's ATen arguments (tensors as their ``("__node__", k)`` references)."""
    return graph[i].attr("args")[2]


def conv_refusal(graph: Graph, i: int) -> str | None:
    """Why the kind does not take convolution ``i`` (it stays the library call), or None."""
    node = graph[i]
    if not is_convolution(node):
        return f"{node.attr('target', node.op)} is not a forward convolution"
    call = conv_call(graph, i)
    if call.has_bias or len(node.inputs) != 2:
        return "its bias is in the library call (AUTOFUSE_CONV_BIAS=library)"
    x, w = graph[node.inputs[0]], graph[node.inputs[1]]
    if not (node.dtype == x.dtype == w.dtype) or node.dtype not in _DOT_DTYPES:
        return f"{node.dtype} operands: tl.dot takes float32, float16 and bfloat16"
    if len(node.shape) not in (3, 4, 5) or len(x.shape) != len(node.shape):
        return f"a {len(node.shape)}-D convolution: 1-3 spatial dims with a batch dim only"
    if call.transposed and (set(call.stride) != {1} or set(call.output_padding) != {0}):
        return (
            "a strided transposed convolution scatters each input pixel over several output "
            "pixels: no implicit GEMM with one tap per output (cuDNN's own)"
        )
    if 0 in node.shape or 0 in x.shape or 0 in w.shape:
        return "an empty dim: nothing to compute (the library call's empty result)"
    spec = _spec(graph, i)
    if spec.groups > MAX_GROUPS:
        return f"{spec.groups} groups: the grid's group axis holds at most {MAX_GROUPS}"
    if spec.out_size != tuple(node.shape[2:]) or spec.c_out != node.shape[1]:
        return "its output shape is not the implicit GEMM's (an unexpected argument form)"
    return None


def conv_spec(graph: Graph, i: int) -> ConvSpec:
    """Convolution ``i`` as an implicit GEMM; call :func:`conv_refusal` first."""
    why = conv_refusal(graph, i)
    if why is not None:
        raise ValueError(f"node {i}: {why}")
    return _spec(graph, i)


def _spec(graph: Graph, i: int) -> ConvSpec:
    node = graph[i]
    call = conv_call(graph, i)
    x, w = graph[node.inputs[0]], graph[node.inputs[1]]
    stride, padding, dilation = call.stride, call.padding, call.dilation
    groups, flipped = call.groups, call.transposed
    kernel = tuple(w.shape[2:])
    if flipped:  # stride-1 transposed: the forward padding that gives its output
        padding = tuple(d * (k - 1) - p for d, k, p in zip(dilation, kernel, padding))
        c_out = w.shape[1] * groups
    else:
        c_out = w.shape[0]
    out = tuple(
        (n + 2 * p - d * (k - 1) - 1) // s + 1
        for n, p, d, k, s in zip(x.shape[2:], padding, dilation, kernel, stride)
    )
    strides = buffer_strides(x) if x.kind != "view" else ()
    channel_inner = len(strides) > 2 and strides[1] == 1 and x.shape[1] > 1
    return ConvSpec(
        node.inputs[0], node.inputs[1], x.shape[0], x.shape[1], c_out, groups, tuple(x.shape[2:]),
        out, kernel, stride, padding, dilation, flipped, channel_inner,
    )  # fmt: skip


def _ints(a) -> list[int]:
    """An int list argument as captured (``("__seq__", kind, items)``) or a bare int."""
    if isinstance(a, tuple) and a and a[0] == "__seq__":
        return [int(v) for v in a[2]]
    return [int(v) for v in a] if isinstance(a, (list, tuple)) else [int(a)]


def _per_dim(v: list[int], dims: int) -> list[int]:
    return v * dims if len(v) == 1 else v
