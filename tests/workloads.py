"""The seed article's examples and the other fusion patterns the acceptance tests run."""

import math

import torch
import torch.nn.functional as F

from experiments.bench.workloads import (  # noqa: F401 - re-exported for the tests
    attention_scores,
    gemm_bias_gelu,
    layernorm,
    mlp_block,
    softmax,
    swiglu,
)


def pointwise_example(x, w, b):  # the seed: 3 launches -> 1, 8 memory ops -> 4
    tmp = x * w
    tmp = tmp + b
    tmp = tmp.sigmoid()
    return tmp


def reduction_example(x):  # the seed: autofuse_per_fused_add_mul_sum_0
    tmp = x * 2.0
    result = tmp.sum(dim=-1)
    result = result + 1.0
    return result


def log_softmax(x):
    return torch.log_softmax(x, dim=-1)


def rmsnorm_residual(x, residual, w):
    h = x + residual
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    return y, h


def sin_cos(x):
    return torch.sin(x), torch.cos(x)


def gelu_tanh_chain(x, b):
    return F.gelu(x + b, approximate="tanh") * 2.0


def mean_var_dim0(x):
    return x.mean(0), x.var(0)


def masked_softmax_3d(x, mask):
    return torch.softmax(x.masked_fill(mask, float("-inf")) / math.sqrt(x.shape[-1]), dim=-1)


def with_unsupported(x):
    y = torch.logcumsumexp(x * 2.0, dim=-1)  # not generated: runs in eager
    return torch.relu(y) + 1.0, (x * 3.0).sum(-1)


def cases(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    return {
        "pointwise_example": (pointwise_example, (r(33, 17), r(17), r(33, 17))),
        "reduction_example": (reduction_example, (r(9, 70),)),
        "softmax": (softmax, (r(7, 45),)),
        "log_softmax": (log_softmax, (r(6, 33),)),
        "layernorm": (layernorm, (r(5, 40), r(40), r(40))),
        "rmsnorm_residual": (rmsnorm_residual, (r(6, 36), r(6, 36), r(36))),
        "sin_cos": (sin_cos, (r(300),)),
        "gelu_tanh_chain": (gelu_tanh_chain, (r(12, 20), r(20))),
        "mean_var_dim0": (mean_var_dim0, (r(37, 6),)),
        "masked_softmax_3d": (
            masked_softmax_3d,
            (r(3, 5, 24), torch.rand(3, 5, 24, generator=g) < 0.3),
        ),
        "with_unsupported": (with_unsupported, (r(6, 16),)),
    }


def gemm_cases(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    return {
        "gemm_bias_gelu": (gemm_bias_gelu, (r(37, 40), r(40, 45, scale=0.2), r(45))),
        "swiglu": (swiglu, (r(21, 32), r(32, 24, scale=0.2), r(32, 24, scale=0.2))),
        "mlp_block": (
            mlp_block,
            (r(19, 24), r(24), r(24), r(24, 40, scale=0.2), r(40), r(40, 24, scale=0.2), r(24)),
        ),
        "attention_scores": (
            attention_scores,
            (r(2, 20, 16), r(2, 20, 16), torch.rand(20, 20, generator=g) < 0.2),
        ),
    }
