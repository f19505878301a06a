"""Activations decomposed with fewer transcendental calls than torch's own decompositions.

Mish, ``x * tanh(softplus(x))``, is taken down by torch to ``exp``, ``log1p`` and ``tanh`` (and
its backward adds a sigmoid). With ``u = exp(-|x|)`` (never above 1, so nothing overflows):

    tanh(softplus(x)) = (1 + 2u) / (1 + 2u + 2u^2)      for x >= 0
                      = u (u + 2) / (u (u + 2) + 2)     for x < 0
    sigmoid(x)        = 1 / (1 + u)   or   u / (1 + u)

one ``exp`` and a division or two per element, the same values to rounding (the identities
are exact: ``tanh(log(1 + e^x)) = ((1 + e^x)^2 - 1) / ((1 + e^x)^2 + 1)``). Infinities and NaN
come out as eager's (``mish(-inf)`` is NaN, ``-inf * 0``). 16-bit inputs are computed in
float32 and rounded once, as eager's kernels compute them.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def _wide(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _tanh_softplus(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``tanh(softplus(x))`` from ``u = exp(-|x|)`` (see the module)."""
    pos = x >= 0
    n = torch.where(pos, 1 + 2 * u, u * (u + 2))
    return n / torch.where(pos, n + 2 * u * u, n + 2)


def _mish(x: torch.Tensor) -> torch.Tensor:
    xf = _wide(x)
    return (xf * _tanh_softplus(xf, torch.exp(-xf.abs()))).to(x.dtype)


def _mish_backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """d mish / dx = tanh(softplus(x)) + x * sigmoid(x) * (1 - tanh(softplus(x))^2)."""
    xf = _wide(x)
    u = torch.exp(-xf.abs())
    t = _tanh_softplus(xf, u)
    sig = torch.where(xf >= 0, 1, u) / (1 + u)
    return (_wide(grad) * (t + xf * sig * (1 - t * t))).to(grad.dtype)


def activation_decompositions() -> dict:
    """The decompositions of this module, by ATen overload."""
    return {aten.mish.default: _mish, aten.mish_backward.default: _mish_backward}
