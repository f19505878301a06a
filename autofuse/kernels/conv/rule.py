"""When a convolution runs as autofuse's own kernel without being measured: the stated rule.

cuDNN's convolutions are tuned per GPU, shape and layout over many algorithms (Winograd, FFT,
implicit GEMMs with tensor-core layouts); a Triton implicit GEMM is one of them. So the kernel
is a *candidate beside* the library call: the search times both (a group with the
convolution against the convolution alone, its epilogue in a kernel of its own), and the
untuned planner times the two plans end to end on CUDA where the untuned plan fuses one
(``Partitioner.library_gemms``). Without a measurement (``AUTOFUSE_CONV_KERNEL``):

- ``rule`` (default): the library call. A *depthwise* convolution with its epilogue fused was
  once the kernel's by rule (memory-bound, the output written once); measured on an H100 in
  MobileNetV2 (fp32, batch 10, 224 x 224) the kernel took 342 us for one convolution where
  torch.compile's whole network, its depthwise convolutions in cuDNN's channels-last engines,
  took 612 us of kernel time: it is the kernel's only where measured faster;
- ``kernel``: the kernel wherever the kind takes the convolution (tests, the GPU comparison);
- ``library``: the library call always (the kind takes no convolution).
"""

from __future__ import annotations

from autofuse.settings import settings

__all__ = ["FORCED", "kernel_reason"]

FORCED = "AUTOFUSE_CONV_KERNEL=kernel"


def kernel_reason() -> str | None:
    """Why a convolution runs as the kernel in a plan chosen without measuring, or None: it
    runs as the library call (every one, under the rule)."""
    return FORCED if settings().conv_kernel == "kernel" else None
