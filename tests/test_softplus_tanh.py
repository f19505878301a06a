"""``tanh(softplus(x))`` written out (Mish before ``F.mish``) is computed by one ``exp``
(``ir/softplus_tanh.py``): the same values as eager within float32 rounding, eager's
infinities and NaN, forward and backward through both front ends; other softplus forms kept."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse.ir.softplus_tanh import tanh_of_softplus


def mish_written(x):
    return torch.multiply(torch.tanh(F.softplus(x)), x)


def ops(fn, x):
    return [n.op for n in autofuse.capture(fn, [x]).graph.nodes]


def test_the_rewrite_leaves_one_exp_and_no_log1p_or_tanh():
    x = torch.randn(8, 64)
    graph = autofuse.capture(mish_written, [x]).graph
    out = tanh_of_softplus(graph)
    got = [n.op for n in out.nodes]
    assert got.count("exp") == 1 and "log1p" not in got and "tanh" not in got, got
    assert tanh_of_softplus(out) is out  # nothing left to rewrite


def test_values_match_eager_over_the_whole_range_and_at_the_edges():
    x = torch.cat([torch.linspace(-100, 100, 4001), torch.tensor([
        0.0, -0.0, 19.99, 20.0, 20.01, 1e-30, -1e-30, float("inf"), float("-inf"), float("nan"),
    ])]).reshape(-1, 1)  # fmt: skip
    got = autofuse.optimize(mish_written, [x])(x)
    torch.testing.assert_close(got, mish_written(x), rtol=2e-6, atol=1e-7, equal_nan=True)
    t = autofuse.optimize(lambda a: torch.tanh(F.softplus(a)), [x])(x)
    torch.testing.assert_close(t, torch.tanh(F.softplus(x)), rtol=2e-6, atol=1e-7, equal_nan=True)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: torch.tanh(F.softplus(a, beta=2.0)),
        lambda a: torch.tanh(F.softplus(a, threshold=5.0)),
        lambda a: torch.tanh(F.softplus(a) + 1),
    ],
)
def test_other_softplus_forms_are_left_alone_and_still_right(fn):
    x = torch.randn(16, 32) * 4
    graph = autofuse.capture(fn, [x]).graph
    kept = tanh_of_softplus(graph)
    assert "tanh" in [n.op for n in kept.nodes]
    torch.testing.assert_close(autofuse.optimize(fn, [x])(x), fn(x), rtol=1e-5, atol=1e-5)


def test_the_softplus_read_elsewhere_stays_and_bf16_is_left_alone():
    def both(a):
        s = F.softplus(a)
        return torch.tanh(s) * a, s * 2

    x = torch.randn(8, 32) * 10
    for got, ref in zip(autofuse.optimize(both, [x])(x), both(x)):
        torch.testing.assert_close(got, ref, rtol=2e-6, atol=1e-6)
    xb = x.to(torch.bfloat16)
    assert "tanh" in [
        n.op for n in tanh_of_softplus(autofuse.capture(mish_written, [xb]).graph).nodes
    ]


def test_a_training_step_through_the_backend_matches_eager():
    x = (torch.randn(4, 64) * 6).requires_grad_()
    ref = mish_written(x)
    ref.backward(torch.ones_like(ref))
    gx = x.grad.clone()
    x.grad = None
    torch._dynamo.reset()
    out = torch.compile(mish_written, backend="autofuse")(x)
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(out, ref, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(x.grad, gx, rtol=1e-5, atol=1e-6)
