"""Convolutions at capture: the bias peeled off the library call, inference BatchNorm as a
per-channel scale and shift (which ``ir/conv_fold.py`` folds into the convolution's weights).

- ``aten.convolution`` with a bias becomes the convolution without it plus the bias broadcast
  over the channel dim (dim 1), 1-3 D, transposed and grouped alike: the add is an ordinary
  pointwise op that joins the generated epilogue kernel (cuDNN runs the convolution alone, and
  faster: Inductor peels every CUDA convolution's bias for the same reason).
- ``aten.convolution_backward`` asked for the bias gradient computes it as the sum of the
  output gradient over every dim but the channel one (a generated reduction) and asks the
  library for the input and weight gradients only. This covers AOTAutograd's backward graphs,
  where autograd records the convolution before the decomposition peels its forward.
- ``_native_batch_norm_legit_no_training`` (BatchNorm in eval mode on its running statistics)
  is ``x * scale + shift`` per channel, ``scale = weight * rsqrt(running_var + eps)`` and
  ``shift = bias - running_mean * scale`` in float32 (as eager's CPU kernel computes it), the
  result cast back to ``x``'s dtype.

A 16-bit convolution is rounded to its dtype before the bias is added (eager rounds the sum
once): where the bias nearly cancels the convolution the sum differs from eager's by up to half
an ulp of the convolution's output, as Inductor's does. ``AUTOFUSE_CONV_BIAS=library``
(``settings().conv_bias``) keeps the bias in the library call, forward and backward; BatchNorm's form does not depend on it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._decomp import get_decompositions

from autofuse.settings import settings

aten = torch.ops.aten


def _per_channel(v: torch.Tensor, dim: int) -> torch.Tensor:
    """A [C] vector viewed to broadcast over dim 1 of a ``dim``-D tensor."""
    return v.reshape((1, -1) + (1,) * (dim - 2))


def _peeled(b: Any) -> bool:
    return b is not None and settings().conv_bias == "kernel"


def _convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    """The library convolution without its bias, the bias added per output channel."""
    if not _peeled(b) or x.dim() < 3 or x.shape[1] == 0:
        return NotImplemented  # (no input channels: eager's output has no channels either)
    y = aten.convolution.default(
        x, w, None, stride, padding, dilation, transposed, output_padding, groups
    )
    return y + _per_channel(b, y.dim())


def _convolution_backward(
    grad, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask
):
    """The bias gradient as a sum of ``grad`` over every dim but dim 1; the library call
    computes the input and weight gradients it is asked for, and no bias gradient."""
    if not mask[2] or settings().conv_bias != "kernel" or grad.dim() < 3:
        return NotImplemented
    if bias_sizes is None or list(bias_sizes) != [grad.shape[1]]:
        return NotImplemented  # no input channels: eager's gradient is zeros, not a sum
    grad_bias = aten.sum.dim_IntList(grad, [0, *range(2, grad.dim())])
    if not (mask[0] or mask[1]):
        return None, None, grad_bias
    grad_x, grad_w, _ = aten.convolution_backward.default(
        grad, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
        [mask[0], mask[1], False],
    )  # fmt: skip
    return grad_x, grad_w, grad_bias


def _batch_norm_inference(x, weight, bias, running_mean, running_var, momentum, eps):
    """``x * scale + shift`` per channel, scale and shift computed in float32 from the
    parameters and running statistics (the form ``ir/conv_fold.py`` folds into a preceding
    convolution's weights); no saved statistics, as eager returns none in inference."""
    scale = torch.rsqrt(running_var.float() + eps)
    if weight is not None:
        scale = scale * weight.float()
    mean = running_mean.float() * scale
    shift = -mean if bias is None else bias.float() - mean
    y = x * _per_channel(scale, x.dim()) + _per_channel(shift, x.dim())
    empty = x.new_zeros((0,))
    return y.to(x.dtype), empty, empty


def _inference_or(op: Any, training_at: int) -> Any:
    """``op``'s decomposition: :func:`_batch_norm_inference` when its ``training`` argument
    (position ``training_at``) is False and it has running statistics, else torch's own."""
    torch_decomp = get_decompositions([op])[op]

    def decomposed(x, weight, bias, running_mean, running_var, *rest):
        training = rest[training_at - 5]
        if training or running_mean is None or running_var is None:
            return torch_decomp(x, weight, bias, running_mean, running_var, *rest)
        return _batch_norm_inference(x, weight, bias, running_mean, running_var, *rest[1:])

    return decomposed


def conv_decompositions() -> dict:
    """The convolution and inference BatchNorm entries of autofuse's decomposition table."""
    return {
        aten.convolution.default: _convolution,
        aten.convolution_backward.default: _convolution_backward,
        aten._native_batch_norm_legit_no_training.default: _batch_norm_inference,
        aten.native_batch_norm.default: _inference_or(aten.native_batch_norm.default, 5),
        aten._native_batch_norm_legit.default: _inference_or(
            aten._native_batch_norm_legit.default, 5
        ),
    }
