"""Where torch's own traced form of an op is wrong, or a kernel's literal types differ from the
IR's: multilabel_margin_loss with -1-terminated targets (torch's decomposition, registered at
the autograd key, keeps the padded target slots), and an int64 select of two literals beside an
int64 reduction's identity. Both front ends; forward, and backward where it applies."""

import pytest
import torch
import torch.nn.functional as F

import autofuse
from tests.helpers import assert_close

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py

TARGETS = {
    "ended early": ([[1, 3, -1, 0, 0], [0, -1, 0, 0, 0], [4, 2, 1, -1, 0]], (3, 5)),
    "unbatched": ([2, 0, -1, 3, 3], (5,)),
    "no end": ([[3, 0, 1, 2], [-1, 1, 1, 1]], (2, 4)),
}


def _loss(reduction):
    return lambda x, t: F.multilabel_margin_loss(x, t, reduction=reduction)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("case", sorted(TARGETS))
def test_multilabel_margin_loss_stops_at_the_first_minus_one(case, reduction):
    target, shape = TARGETS[case]
    torch.manual_seed(len(case))
    x, t = torch.randn(shape), torch.tensor(target)
    f = _loss(reduction)
    want = f(x, t)
    assert_close(autofuse.optimize(f, (x, t))(x, t), want, torch.float32, "optimize")
    got = torch.compile(f, backend="autofuse")(x, t)
    assert got.shape == want.shape
    assert_close(got, want, torch.float32, "compile")
    xg, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch.compile(f, backend="autofuse")(xg, t).sum().backward()
    f(xe, t).sum().backward()
    assert_close(xg.grad, xe.grad, torch.float32, "gradient")


def ends(t):
    """Each row's first -1 over a size-1 dim (the arange folds to the literal 0)."""
    return torch.amin(torch.where(t == -1, torch.arange(t.shape[-1]), t.shape[-1]), dim=-1)


@pytest.mark.parametrize("front", ["optimize", "compile"])
def test_an_int64_select_of_literals_beside_an_int64_identity_builds(front):
    t = torch.tensor([[3], [-1], [0]])
    fast = (
        autofuse.optimize(ends, (t,))
        if front == "optimize"
        else torch.compile(ends, backend="autofuse")
    )
    got = fast(t)
    assert got.dtype == torch.int64 and torch.equal(got, ends(t))


@pytest.mark.parametrize("front", ["optimize", "compile"])
def test_bicubic_upsampling_of_uint8_is_eagers(front):
    """uint8 bicubic runs as eager's integer kernel: the decomposition rounds an element one
    step off here (27 -> 13: 1 of 169)."""
    x = torch.randint(
        0, 256, (1, 1, 27, 27), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )

    def up(x):
        return F.interpolate(x, size=(13, 13), mode="bicubic")

    fast = (
        autofuse.optimize(up, (x,))
        if front == "optimize"
        else torch.compile(up, backend="autofuse")
    )
    assert torch.equal(fast(x), up(x))
