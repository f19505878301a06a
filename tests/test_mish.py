"""Mish by one exp (``capture/activations.py``): forward and backward through both front ends,
fp32 and bf16, on values across the range (both signs, past eager's softplus threshold of 20,
infinities, NaN) equal to eager's; the captured graph holds one ``exp`` and no ``log1p`` or
``tanh``. Through the interpreter on CPU."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse.capture import capture
from tests.helpers import assert_close

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py

SPECIAL = [-float("inf"), -90.0, -20.5, -1e-30, -0.0, 0.0, 1e-30, 19.99, 20.0, 20.5, 80.0]


def _values(dtype: torch.dtype) -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.cat([torch.randn(39) * 6, torch.tensor(SPECIAL + [float("inf"), float("nan")])])
    return x.reshape(4, 13).to(dtype)


def _mish_mish(x):
    return F.mish(F.mish(x) * 1.5)


def test_captured_mish_is_one_exp_no_log1p_or_tanh():
    ops = [n.op for n in capture(F.mish, (torch.randn(8),)).graph.nodes]
    assert ops.count("exp") == 1 and "tanh" not in ops and "log1p" not in ops, ops


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mish_forward_as_eager_through_both_front_ends(dtype):
    x = _values(dtype)
    want = _mish_mish(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fn in (
            autofuse.optimize(_mish_mish, (x,)),
            torch.compile(_mish_mish, backend="autofuse"),
        ):
            assert_close(fn(x), want, dtype, "mish forward")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mish_backward_as_eager(dtype):
    x = _values(dtype)
    x = torch.where(x.isinf(), torch.zeros_like(x), x)  # d/dx at -inf is NaN in eager too
    g = torch.randn(x.shape).to(dtype)
    xe = x.clone().requires_grad_()
    (want,) = torch.autograd.grad(_mish_mish(xe), xe, g)
    compiled = torch.compile(_mish_mish, backend="autofuse")
    xa = x.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (got,) = torch.autograd.grad(compiled(xa), xa, g)
    assert_close(got, want, dtype, "mish backward")
