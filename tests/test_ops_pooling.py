"""Pools, constant pads, hardtanh and log10 generated (capture/pooling.py): one kernel with their
neighbours, eager's values and indices (ties, NaN, -inf windows, padding, ceil_mode, dilation),
and the backward through the backend."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse.frontend import compiled_graphs


def _nan_inf(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x.view(-1)[3] = float("nan")
    x[..., 1:4, 1:4] = float("-inf")  # windows of -inf alone: eager's first element inside
    return x


def _check(f, *xs, kernels: int = 1):
    opt = autofuse.optimize(f, list(xs))
    out, ref = opt(*xs), f(*xs)
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    for o, r in zip(outs, refs):
        assert o.dtype == r.dtype and o.shape == r.shape
        assert torch.allclose(o, r, equal_nan=True, atol=1e-6, rtol=1e-5), (o, r)
    assert not opt.plan.fallbacks, [s.reason for s in opt.plan.fallbacks]
    assert len(opt.plan.kernels) == kernels


MAX_POOLS = {
    "2d": lambda x: F.max_pool2d(x, 2) * 2,
    "stride_pad": lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True),
    "ceil": lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True),
    "dilation": lambda x: F.max_pool2d(x, 2, 1, 1, dilation=2, return_indices=True),
    "1d": lambda x: F.max_pool1d(x.flatten(2), 4, 2, 1, return_indices=True),
    "relu_ties": lambda x: F.max_pool2d(torch.relu(x), 3, 1, 1, return_indices=True),
    "3d": lambda x: F.max_pool3d(x.reshape(1, 2, 3, 5, 7), 3, 2, 1, return_indices=True),
}


@pytest.mark.parametrize("name", sorted(MAX_POOLS))
def test_max_pool_values_and_indices_are_eagers(name):
    _check(MAX_POOLS[name], _nan_inf(torch.randn(1, 2, 7, 15)))


AVG_POOLS = {
    "pad": lambda x: F.avg_pool2d(x, 3, 2, 1) + 1,
    "ceil_exclude_pad": lambda x: F.avg_pool2d(
        x, 3, 2, 1, ceil_mode=True, count_include_pad=False
    ),  # fmt: skip
    "divisor": lambda x: F.avg_pool2d(x, 2, divisor_override=3),
    "large_window": lambda x: F.avg_pool2d(x, (7, 11), (1, 2), (3, 1), count_include_pad=False),
    "1d": lambda x: F.avg_pool1d(x.flatten(2), 4, 3, 2),
    "3d": lambda x: F.avg_pool3d(x.reshape(1, 2, 3, 5, 7), 3, 2, 1, count_include_pad=False),
}


@pytest.mark.parametrize("name", sorted(AVG_POOLS))
def test_avg_pool_is_eagers(name):
    _check(AVG_POOLS[name], torch.randn(1, 2, 7, 15))


def test_16_bit_avg_pool_adds_in_float32_and_int_max_pool():
    _check(lambda x: F.avg_pool2d(x, 2), torch.randn(2, 3, 8, 8).bfloat16())
    _check(lambda x: F.max_pool2d(x, 2, return_indices=True), torch.randint(-5, 5, (2, 3, 8, 8)))


def test_pad_hardtanh_log10_flip_unfold_fuse_with_their_neighbours():
    x = torch.randn(2, 3, 6, 7)
    _check(lambda x: x.flip(3).cumsum(3).flip(3) + x.flip(1, 2), x, kernels=2)  # scan, gather
    _check(lambda x: F.pad(x, (1, 2, -1, 3), value=-2.0) * 2, x)
    _check(lambda x: F.hardtanh(x * 3, -0.5, 0.5) + 1, x)
    _check(lambda x: torch.log10(x.abs() + 1) * 2, x)
    _check(lambda x: x.unfold(3, 3, 2).sum(-1) * 2, x)
    _check(lambda x: x.unfold(2, 2, 1) + 1, x)


def test_a_large_window_stays_one_eager_op():
    opt = autofuse.optimize(lambda x: F.max_pool2d(x, 9), [torch.randn(1, 2, 9, 9)])
    x = torch.randn(1, 2, 9, 9)
    assert torch.equal(opt(x), F.max_pool2d(x, 9)) and len(opt.plan.fallbacks) >= 1


def test_pool_backward_through_the_backend_is_eagers():
    def f(x):
        return F.max_pool2d(torch.relu(x), 3, 2, 1) + F.avg_pool2d(x, 3, 2, 1)

    x = torch.randn(2, 3, 9, 10)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    w = torch.randn_like(f(x))
    (f(a) * w).sum().backward()
    torch._dynamo.reset()
    before = {id(g) for g in compiled_graphs()}
    (torch.compile(f, backend="autofuse")(b) * w).sum().backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-5)
    fw = [g for g in compiled_graphs() if id(g) not in before and g.kind == "forward"]
    assert fw and all(not g.plan.fallbacks for g in fw)
