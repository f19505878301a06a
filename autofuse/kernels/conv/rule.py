"""When a convolution runs as autofuse's own kernel without being measured: the stated rule.

cuDNN's convolutions are tuned per GPU, shape and layout over many algorithms (Winograd, FFT,
implicit GEMMs with tensor-core layouts); a Triton implicit GEMM is one of them. So the kernel
is a *candidate beside* the library call: the search times both (a group with the
convolution against the convolution alone, its epilogue in a kernel of its own), and the
untuned planner times the two plans end to end on CUDA where the untuned plan fuses one
(``Partitioner.library_gemms``). Without a measurement (``AUTOFUSE_CONV_KERNEL``):

- ``rule`` (default): the library call, except for a *depthwise* convolution (one input and
  one output channel per group) with its epilogue fused: there the product is a few taps per
  output (K of 9 for 3x3), memory-bound work that cuDNN's tensor-core algorithms gain nothing
  on, and the fused kernel writes the output once where the library writes it and the epilogue
  kernel reads and writes it again. A lone depthwise convolution (nothing to fuse) keeps the
  library call;
- ``kernel``: the kernel wherever the kind takes the convolution (tests, the GPU comparison);
- ``library``: the library call always (the kind takes no convolution).
"""

from __future__ import annotations

from autofuse.kernels.conv.spec import ConvSpec
from autofuse.settings import settings

__all__ = ["DEPTHWISE", "FORCED", "kernel_reason"]

DEPTHWISE = (
    "depthwise with its epilogue fused: memory-bound, the output written once "
    "(kernels/conv/rule.py)"
)
FORCED = "AUTOFUSE_CONV_KERNEL=kernel"


def kernel_reason(spec: ConvSpec, fused: bool) -> str | None:
    """Why the convolution ``spec`` (alone, or with an epilogue when ``fused``) runs as the
    kernel in a plan chosen without measuring, or None: it runs as the library call."""
    mode = settings().conv_kernel
    if mode == "kernel":
        return FORCED
    if mode == "rule" and fused and spec.depthwise:
        return DEPTHWISE
    return None
