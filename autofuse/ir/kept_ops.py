"""Ops autofuse keeps whole where torch's traced form differs from eager: custom ops (the
``autofuse`` namespace) that call eager's kernel, opaque to AOTAutograd's decompositions and run
by a plan as eager steps. Registered on import (``ir/eager.py`` imports this module, so a plan
loaded in a new process resolves them by name)."""

from __future__ import annotations

import torch

__all__ = ["upsample_bicubic2d"]


@torch.library.custom_op("autofuse::upsample_bicubic2d", mutates_args=())
def upsample_bicubic2d(
    x: torch.Tensor,
    output_size: list[int],
    align_corners: bool,
    scales_h: float | None,
    scales_w: float | None,
) -> torch.Tensor:
    """Eager's bicubic upsampling (torch decomposes ``aten.upsample_bicubic2d`` at the autograd
    key, and on uint8 that form rounds some outputs one step from eager's integer kernel)."""
    return torch.ops.aten.upsample_bicubic2d.default(
        x, output_size, align_corners, scales_h, scales_w
    )


@upsample_bicubic2d.register_fake
def _(x, output_size, align_corners, scales_h, scales_w):  # noqa: ANN001, ANN202
    return x.new_empty((*x.shape[:-2], *output_size))
