"""The public workload suite (bf16 on the GPU). Each workload is a plain function plus a
factory of its inputs, its minimum bytes moved and its flops (for the roofline floor)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def pointwise(x, w, b):
    return torch.sigmoid(x * w + b)


def seed_reduction(x):
    return (x * 2.0).sum(-1) + 1.0


def softmax(x):
    return torch.softmax(x, dim=-1)


def layernorm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def rmsnorm_residual(x, residual, w):
    h = x + residual
    y = (h.float() * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w
    return y, h


def sin_cos(x):
    return torch.sin(x), torch.cos(x)


def gemm_bias_gelu(x, w, b):
    return F.gelu(x @ w + b)


def swiglu(x, w1, w2):
    return F.silu(x @ w1) * (x @ w2)


def mlp_block(x, ln_w, ln_b, w1, b1, w2, b2):
    h = F.layer_norm(x, (x.shape[-1],), ln_w, ln_b)
    return x + (F.gelu(h @ w1 + b1) @ w2 + b2)


def attention_scores(q, k, mask):
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)


def attention_scores_causal(q, k):
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    i = torch.arange(q.shape[-2], device=q.device)
    return torch.softmax(s.masked_fill(i[:, None] < i[None, :], float("-inf")), dim=-1)


@dataclass(frozen=True)
class Workload:
    name: str
    fn: Callable
    make: Callable[[str, torch.dtype], tuple]
    kind: str  # "memory" | "compute"

    def inputs(self, device="cuda", dtype=torch.bfloat16, seed=0):
        torch.manual_seed(seed)
        return self.make(device, dtype)

    def flops(self, inputs) -> float:
        if self.name == "gemm_bias_gelu":
            m, k = inputs[0].shape
            return 2.0 * m * k * inputs[1].shape[1]
        if self.name == "swiglu":
            m, k = inputs[0].shape
            return 2 * 2.0 * m * k * inputs[1].shape[1]
        if self.name == "mlp_block":
            m, k = inputs[0].shape
            return 2 * 2.0 * m * k * inputs[3].shape[1]
        if self.name.startswith("eager_attention"):  # two products; causal skipping not counted
            b, h, s, d = inputs[0].shape
            return 4.0 * b * h * s * inputs[1].shape[-2] * d
        if self.name.startswith("attention_scores"):
            b, s, d = inputs[0].shape
            return 2.0 * b * s * s * d
        return 0.0


def _r(device, dtype, *shape):
    return torch.randn(*shape, device=device, dtype=dtype)


SUITE = [
    Workload("pointwise", pointwise,
             lambda d, t: (_r(d, t, 2**26), _r(d, t, 2**26), _r(d, t, 2**26)), "memory"),
    Workload("seed_reduction", seed_reduction, lambda d, t: (_r(d, t, 8192, 8192),), "memory"),
    Workload("softmax", softmax, lambda d, t: (_r(d, t, 8192, 8192),), "memory"),
    Workload("layernorm", layernorm,
             lambda d, t: (_r(d, t, 8192, 4096), _r(d, t, 4096), _r(d, t, 4096)), "memory"),
    Workload("rmsnorm_residual", rmsnorm_residual,
             lambda d, t: (_r(d, t, 8192, 4096), _r(d, t, 8192, 4096), _r(d, t, 4096)), "memory"),
    Workload("sin_cos", sin_cos, lambda d, t: (_r(d, t, 2**26),), "memory"),
    Workload("gemm_bias_gelu", gemm_bias_gelu,
             lambda d, t: (_r(d, t, 8192, 4096), _r(d, t, 4096, 4096) * 0.02, _r(d, t, 4096)),
             "compute"),
    Workload("swiglu", swiglu,
             lambda d, t: (_r(d, t, 8192, 4096), _r(d, t, 4096, 8192) * 0.02,
                           _r(d, t, 4096, 8192) * 0.02), "compute"),
    Workload("mlp_block", mlp_block,
             lambda d, t: (_r(d, t, 8192, 4096), _r(d, t, 4096), _r(d, t, 4096),
                           _r(d, t, 4096, 16384) * 0.02, _r(d, t, 16384),
                           _r(d, t, 16384, 4096) * 0.02, _r(d, t, 4096)), "compute"),
    Workload("attention_scores", attention_scores,
             lambda d, t: (_r(d, t, 32, 2048, 128), _r(d, t, 32, 2048, 128),
                           torch.rand(2048, 2048, device=d) > 0.9), "compute"),
    Workload("attention_scores_causal", attention_scores_causal,
             lambda d, t: (_r(d, t, 32, 2048, 128), _r(d, t, 32, 2048, 128)), "compute"),
]  # fmt: skip

BY_NAME = {w.name: w for w in SUITE}


def min_bytes(inputs, outputs) -> int:
    """Each input read once, each output written once."""
    ts = [t for t in (*inputs, *outputs) if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in ts)
