"""The convolution kind: a forward convolution (1-3 D; strided, padded, dilated, grouped,
depthwise; transposed of stride 1) as an implicit GEMM on the GEMM template, its pointwise
epilogue fused (``kind``); which convolutions it takes (``spec``); when a plan chosen without
measuring runs it instead of the library call (``rule``). The backward of a convolution stays
the library's ``convolution_backward`` (an opaque op the kind does not take): training gains
nothing from a forward kernel whose gradients need cuDNN's anyway, and the forward is where the
epilogue fuses."""

from __future__ import annotations

from autofuse.ir.graph import Graph
from autofuse.kernels.conv.rule import kernel_reason
from autofuse.kernels.conv.spec import conv_refusal
from autofuse.settings import settings

__all__ = ["LONE_RULE", "library_alternative", "lone_library", "takes"]

LONE_RULE = "rule: a lone convolution runs as its library call (cuDNN on GPU)"


def takes(graph: Graph, i: int) -> bool:
    """Whether node ``i`` is a convolution the kind may run (``AUTOFUSE_CONV_KERNEL`` not
    ``library``, and ``spec.conv_refusal`` has no objection)."""
    node = graph[i]
    if node.kind != "opaque" or settings().conv_kernel == "library":
        return False
    return conv_refusal(graph, i) is None


def lone_library(graph: Graph, group: frozenset[int]) -> bool:
    """Whether ``group`` is one convolution that a plan chosen without measuring runs as its
    library call (``rule.py``)."""
    if len(group) != 1:
        return False
    (i,) = group
    return takes(graph, i) and kernel_reason() is None


def library_alternative(graph: Graph, i: int) -> bool:
    """Whether convolution ``i`` runs in the kernel with the library call as an alternative an
    unmeasured plan is timed against and the search starts from (not under
    ``AUTOFUSE_CONV_KERNEL=kernel``, which forces the kernel)."""
    return takes(graph, i) and settings().conv_kernel != "kernel"
