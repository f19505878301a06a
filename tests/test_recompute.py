"""Pointwise values computed again where they are read (``ir/recompute.py``): a value that a
split variance's chunks and the normalization both read is not written by the statistics'
kernel and read back by the normalization's; the normalization computes it from the value's own
inputs, and every result still equals eager."""

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse.capture.trace import capture
from autofuse.ir.graph import numel
from autofuse.ir.recompute import recompute_for_chunk_readers
from tests.conftest import _settings_with


@pytest.fixture
def split_small(monkeypatch):
    """Split on for CPU inputs from 64 reduced elements (long variance rows from 512)."""
    yield from _settings_with(
        monkeypatch, AUTOFUSE_SPLIT_REDUCTIONS="1", AUTOFUSE_SPLIT_MIN_RNUMEL="64"
    )


def swish_group_norm(x):  # L2_60's chain: swish, then GroupNorm
    return F.group_norm(x * torch.sigmoid(x + 0.5), 2)


def mish_batch_norm(x):  # L2_52's chain: mish, then training BatchNorm
    y = torch.tanh(F.softplus(x)) * x
    return F.batch_norm(y, None, None, training=True)


def _full_writes(plan, shape):
    """The full-size buffers the plan's kernels write (but the outputs)."""
    g = plan.graph
    outs = {g.base_of(o) for o in g.outputs}
    return [
        g[i].name
        for step in plan.steps
        if getattr(step, "kernel", None) is not None
        for i in step.kernel.info.stored
        if numel(g[i].shape) == numel(shape) and i not in outs
    ]


CASES = [(swish_group_norm, (66, 4, 16, 16)), (mish_batch_norm, (4, 140, 16, 16))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fn,shape", CASES, ids=[c[0].__name__ for c in CASES])
def test_activation_is_not_written_and_read_back(split_small, fn, shape, dtype):
    """In bfloat16 the chunks read the activation through the split's float32 cast and the
    normalization reads it as it is: computed again all the same."""
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=dtype)
    g = capture(fn, (x,)).graph
    assert any(n.name.endswith(".again") for n in g.nodes), "nothing computed again"
    opt = autofuse.optimize(fn, (x,))
    assert _full_writes(opt.plan, shape) == []
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(opt(x), fn(x), **tol)
    torch.testing.assert_close(torch.compile(fn, backend="autofuse")(x), fn(x), **tol)


def test_without_the_split_nothing_is_copied():
    x = torch.randn(4, 140, 16, 16)
    g = capture(mish_batch_norm, (x,)).graph  # CPU inputs: no split, one domain per value
    assert recompute_for_chunk_readers(g) is g


def test_a_returned_value_is_not_copied(split_small):
    def returns_it(x):
        y = x * torch.sigmoid(x)
        return F.group_norm(y, 2), y

    x = torch.randn(66, 4, 16, 16)
    g = capture(returns_it, (x,)).graph
    assert not any(n.name.endswith(".again") for n in g.nodes)
    out = autofuse.optimize(returns_it, (x,))(x)
    for a, b in zip(out, returns_it(x)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_a_cone_reading_two_full_buffers_is_not_copied(split_small):
    def two_inputs(x, y):  # computing x * y again reads two buffers where one was read back
        return F.group_norm(x * y, 2)

    x, y = torch.randn(66, 4, 16, 16), torch.randn(66, 4, 16, 16)
    g = capture(two_inputs, (x, y)).graph
    assert not any(n.name.endswith(".again") for n in g.nodes)
    torch.testing.assert_close(autofuse.optimize(two_inputs, (x, y))(x, y), two_inputs(x, y),
                               rtol=1e-4, atol=1e-4)  # fmt: skip


def test_training_step_through_the_copy(split_small):
    m = torch.nn.Sequential(torch.nn.SiLU(), torch.nn.GroupNorm(2, 4))
    x = torch.randn(66, 4, 16, 16, requires_grad=True)
    ref = m(x)
    ref.sum().backward()
    ref_grad, x.grad = x.grad.clone(), None
    out = torch.compile(m, backend="autofuse")(x)
    out.sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(x.grad, ref_grad, rtol=1e-3, atol=1e-3)
