"""The order a row reduction walks its row (``kernels/common/row_order.py``,
``AUTOFUSE_REDUCTION_ORDER=stride``): a GroupNorm row of a channels-last convolution's result
walked each pixel's channels together, the plan's values eager's, forward and backward; the
row's logical order wherever the setting is off, the buffer is contiguous, or the reduction's
result depends on the order."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse.capture import capture
from autofuse.kernels.common.row_order import row_swap
from autofuse.plan.planner import Planner

from .helpers import settings_env


def _conv_group_norm(x, w, b, gw, gb):
    y = F.conv2d(x, w, b)
    return torch.tanh(F.group_norm(y, 4, gw, gb)) + y


def _inputs(grad: bool = False):
    torch.manual_seed(0)
    ins = [torch.randn(2, 3, 10, 10), torch.randn(16, 3, 3, 3), torch.randn(16),
           torch.rand(16) + 0.5, torch.randn(16)]  # fmt: skip
    return [t.requires_grad_(grad) for t in ins]


def _swaps(fn, ins) -> list[tuple[int, int] | None]:
    planner = Planner(capture(fn, ins).graph)
    infos = [planner.space.check(g) for g in planner.space.untuned().groups]
    return [row_swap(planner.graph, i) for i in infos if i.kind == "reduction"]


def test_a_channels_last_group_row_walks_each_pixels_channels_together(monkeypatch):
    with settings_env(
        monkeypatch, AUTOFUSE_REDUCTION_ORDER="stride", AUTOFUSE_CONV_LAYOUT="channels_last"
    ):
        assert (4, 64) in _swaps(_conv_group_norm, _inputs())  # 4 channels x 8 x 8 pixels


@pytest.mark.parametrize("env", [
    {"AUTOFUSE_CONV_LAYOUT": "channels_last"},  # the setting off: the logical order
    {"AUTOFUSE_REDUCTION_ORDER": "stride", "AUTOFUSE_CONV_LAYOUT": "contiguous"},
])  # fmt: skip
def test_the_logical_order_elsewhere(monkeypatch, env):
    with settings_env(monkeypatch, **env):
        assert set(_swaps(_conv_group_norm, _inputs())) == {None}


def test_an_index_valued_reduction_keeps_the_logical_order(monkeypatch):
    """argmax over the row returns the first maximum's column: the walk decides which."""

    def f(x, w, b):
        y = F.conv2d(x, w, b).reshape(2, 4, -1)
        return y.argmax(-1), y.sum(-1)

    with settings_env(
        monkeypatch, AUTOFUSE_REDUCTION_ORDER="stride", AUTOFUSE_CONV_LAYOUT="channels_last"
    ):
        assert set(_swaps(f, _inputs()[:3])) == {None}


@pytest.mark.parametrize("front", ["optimize", "compile"])
def test_the_swapped_walk_gives_eagers_values_and_gradients(monkeypatch, front):
    with settings_env(
        monkeypatch, AUTOFUSE_REDUCTION_ORDER="stride", AUTOFUSE_CONV_LAYOUT="channels_last"
    ):
        ins, ref_ins = _inputs(True), _inputs(True)
        torch._dynamo.reset()
        if front == "optimize":
            fn = autofuse.optimize(_conv_group_norm, ins)
        else:
            fn = torch.compile(_conv_group_norm, backend="autofuse", dynamic=False)
        out, ref = fn(*ins), _conv_group_norm(*ref_ins)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
        gy = torch.randn_like(ref)
        got = torch.autograd.grad(out, ins, gy)
        want = torch.autograd.grad(ref, ref_ins, gy)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_row_read_by_the_reduction_alone_is_walked_by_stride(monkeypatch):
    def f(x, w):
        return F.conv2d(x, w).reshape(2, 4, -1).sum(-1)

    env = {"AUTOFUSE_REDUCTION_ORDER": "stride", "AUTOFUSE_CONV_LAYOUT": "channels_last"}
    with settings_env(monkeypatch, **env):
        ins = _inputs()[:2]
        assert (4, 64) in _swaps(f, ins)
        torch.testing.assert_close(autofuse.optimize(f, ins)(*ins), f(*ins), rtol=1e-4, atol=1e-4)


def test_the_kernel_says_its_row_is_walked_by_stride(monkeypatch):
    from autofuse.kernels import default_config, generate

    env = {"AUTOFUSE_REDUCTION_ORDER": "stride", "AUTOFUSE_CONV_LAYOUT": "channels_last"}
    with settings_env(monkeypatch, **env):
        planner = Planner(capture(_conv_group_norm, _inputs()).graph)
        infos = [planner.space.check(g) for g in planner.space.untuned().groups]
        swapped = [i for i in infos if i.kind == "reduction" and row_swap(planner.graph, i)]
        assert swapped
        info = swapped[0]
        kernel = generate(planner.graph, info, default_config(info, planner.graph))
        assert "its 4 x 64 row walked by stride (4 innermost)" in kernel.source
        assert "16 * (rindex // 4)" in kernel.source  # a pixel 16 channels on


def test_a_gemm_row_keeps_the_logical_order(monkeypatch):
    """The row GEMM kind bounds its columns on the logical walk: a group with a matmul is
    never walked by stride."""
    from dataclasses import replace

    env = {"AUTOFUSE_REDUCTION_ORDER": "stride", "AUTOFUSE_CONV_LAYOUT": "channels_last"}
    with settings_env(monkeypatch, **env):
        planner = Planner(capture(_conv_group_norm, _inputs()).graph)
        infos = [planner.space.check(g) for g in planner.space.untuned().groups]
        (info,) = [i for i in infos if i.kind == "reduction" and row_swap(planner.graph, i)]
        assert row_swap(planner.graph, replace(info, matmuls=(info.nodes[0],))) is None
