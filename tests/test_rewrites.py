"""The emitter's value rewrites (``autofuse/kernels/common/rewrites.py``): each renders a cheaper
expression with eager's result (interpreter)."""

import torch

import autofuse
from tests.helpers import assert_close


def test_a_select_on_a_constant_condition_renders_the_operand_it_picks():
    """``where(True, a, b)`` stores a itself; a scalar pick stays a select where the other
    operand is wider (the result keeps its shape)."""

    def f(x, y):
        c = torch.ones((), dtype=torch.bool)
        return torch.where(c, x * 2, y), torch.where(c, 1.5, y)

    x, y = torch.randn(5, 7), torch.randn(5, 7)
    opt = autofuse.optimize(f, (x, y))
    for got, want in zip(opt(x, y), f(x, y)):
        assert_close(got, want, torch.float32)
    (kernel,) = opt.plan.kernels
    assert "# where\n" not in kernel.source  # the first select: folded away
    assert "# where_1\n" in kernel.source  # the scalar pick: kept
