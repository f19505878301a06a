"""A max pool after a non-decreasing pointwise chain pools the chain's input and applies the
chain once per output (``ir/pool_monotone.py``); values equal eager's, NaNs included, and
pools whose indices are read, padded pools and chains that may decrease are left alone."""

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse.capture.trace import capture

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py


def tanh_scale_bias(x, b):  # KernelBench L2_82's epilogue
    return F.max_pool2d(torch.tanh(x) * 2.0 + b, 2)


def relu_pool(x, b):
    return F.max_pool2d(torch.relu(x + b), 3, stride=2)


def sigmoid_clamp_3d(x, b):
    return F.max_pool3d(torch.sigmoid(x - b).clamp(0.1, 0.9), 2)


def _pooled_ops(graph) -> set[str]:
    return {n.op for n in graph.nodes if n.name.endswith(".pooled")}


CASES = [
    (tanh_scale_bias, (2, 4, 6, 8), {"tanh", "mul", "add"}),
    (relu_pool, (2, 4, 7, 7), {"relu", "add"}),
    (sigmoid_clamp_3d, (1, 4, 4, 4, 6), {"sigmoid", "clamp", "sub"}),
]


@pytest.mark.parametrize("fn,shape,ops", CASES, ids=[c[0].__name__ for c in CASES])
def test_the_chain_runs_after_the_pool(fn, shape, ops):
    torch.manual_seed(0)
    x = torch.randn(*shape)
    x.view(-1)[::7] = float("nan")  # a NaN in some windows: the pooled value is NaN there
    x.view(-1)[3] = float("inf")
    b = torch.randn(shape[1], *([1] * (len(shape) - 2)))
    assert _pooled_ops(capture(fn, (x, b)).graph) == ops
    ref = fn(x, b)
    torch.testing.assert_close(autofuse.optimize(fn, (x, b))(x, b), ref, equal_nan=True)
    got = torch.compile(fn, backend="autofuse")(x, b)
    torch.testing.assert_close(got, ref, equal_nan=True)


def gelu_pool(x, b):  # GELU dips below zero: not non-decreasing
    return F.max_pool2d(F.gelu(x + b), 2)


def negative_scale(x, b):
    return F.max_pool2d(torch.tanh(x) * -2.0, 2)


def padded(x, b):  # the pad value is the chain's output's: left alone
    return F.max_pool2d(torch.tanh(x), 3, stride=2, padding=1)


def full_size_shift(x, b):  # x + x.flip(-1) varies over the window in its second operand
    return F.max_pool2d(torch.tanh(x) + x.flip(-1), 2)


@pytest.mark.parametrize("fn", [gelu_pool, negative_scale, padded, full_size_shift])
def test_chains_that_may_decrease_or_vary_are_left(fn):
    x, b = torch.randn(2, 4, 6, 6), torch.randn(4, 1, 1)
    assert not _pooled_ops(capture(fn, (x, b)).graph)
    torch.testing.assert_close(autofuse.optimize(fn, (x, b))(x, b), fn(x, b))


def test_a_pool_whose_indices_are_read_is_left():
    def with_indices(x):
        v, i = F.max_pool2d(torch.tanh(x) * 2.0, 2, return_indices=True)
        return v, i

    x = torch.randn(2, 3, 6, 6)  # (saturating inputs tie in tanh: rewritten, a tie's index
    # would follow x; left, it follows tanh's rounding)
    assert not _pooled_ops(capture(with_indices, (x,)).graph)
    got, ref = autofuse.optimize(with_indices, (x,))(x), with_indices(x)
    torch.testing.assert_close(got[0], ref[0])
    assert torch.equal(got[1], ref[1])


def test_training_through_the_pool():
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Tanh(), torch.nn.MaxPool2d(2))
    x = torch.randn(2, 3, 10, 10, requires_grad=True)
    ref = net(x)
    ref.sum().backward()
    ref_grad, x.grad = x.grad.clone(), None
    out = torch.compile(net, backend="autofuse")(x)
    out.sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x.grad, ref_grad, rtol=1e-4, atol=1e-5)
