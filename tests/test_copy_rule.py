"""``aten.copy(dst, src)`` (what a functionalized in-place op leaves: ``ReLU6(inplace=True)``
decomposes to ``copy_(x, clamp(x))``) is src's values in dst's dtype, fused like any cast; it ran
as an eager copy between a convolution and its epilogue (35 copies in MobileNetV2's plan)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autofuse

from .helpers import FRONT_ENDS, through


def _eager_steps(plan) -> list[str]:
    return [s.reason for s in plan.steps if type(s).__name__ == "EagerStep"]


def _block() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(4, 8, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6(inplace=True),
        nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8),
        nn.ReLU6(inplace=True),
    ).eval()  # fmt: skip
    for bn in (m[1], m[4]):
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.data.uniform_(-2, 2)
    return m


def test_in_place_relu6_leaves_no_eager_copy():
    m = _block()
    x = torch.randn(2, 4, 8, 8) * 4
    f = autofuse.optimize(m, [x])
    assert not [r for r in _eager_steps(f.plan) if "copy" in r], _eager_steps(f.plan)
    x2 = torch.randn(2, 4, 8, 8) * 4
    torch.testing.assert_close(f(x2), m(x2))


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_a_copy_into_another_dtype_is_a_cast(front):
    def fn(x):
        y = torch.zeros(x.shape, dtype=torch.int32)
        y.copy_(x * 3)  # truncates toward zero, as eager's copy does
        return y + 1

    f = through(front, fn, [torch.randn(4, 6) * 5])
    if front == "optimize":
        assert not [r for r in _eager_steps(f.plan) if "copy" in r]
    x2 = torch.randn(4, 6) * 5
    torch.testing.assert_close(f(x2), fn(x2))


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_a_broadcast_copy_keeps_eagers_values(front):
    def fn(x, r):
        y = x * 2
        y.copy_(r)  # r [1, 6] broadcast over y's rows
        return y.relu()

    f = through(front, fn, [torch.randn(4, 6), torch.randn(1, 6)])
    new = [torch.randn(4, 6), torch.randn(1, 6)]
    torch.testing.assert_close(f(*new), fn(*new))
