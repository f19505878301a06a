"""linspace / logspace: the core decomposition (float32 steps from the unrounded endpoints,
rounded once) runs only where the result is float32 or float64; in an integer or 16-bit dtype
the op is eager's (an eager step), whose values differ from the decomposition's: int32
linspace(4.3, -3, 50) is 1 off in 7 places, bf16 logspace(4.3, -3, 2) starts at 20480 where
the decomposition gives 19968 (OpInfo's linspace / logspace samples)."""

from __future__ import annotations

import pytest
import torch

from autofuse.plan.steps import EagerStep

from .helpers import FRONT_ENDS, assert_close, through


def _space(op, dtype):
    def fn(s):
        return op(4.3, -3, 50, dtype=dtype) + s.to(dtype)

    return fn


@pytest.mark.parametrize("front", FRONT_ENDS)
@pytest.mark.parametrize(
    "op, dtype",
    [(torch.linspace, torch.int32), (torch.linspace, torch.bfloat16),
     (torch.logspace, torch.bfloat16), (torch.logspace, torch.int64)],
)  # fmt: skip
def test_integer_and_16_bit_results_are_eagers(op, dtype, front):
    fn, s = _space(op, dtype), torch.zeros(50)
    got = through(front, fn, (s,))(s)
    assert got.dtype == dtype and torch.equal(got, fn(s))


def test_float32_results_are_generated():
    fn, s = _space(torch.linspace, torch.float32), torch.zeros(50)
    opt = through("optimize", fn, (s,))
    assert not any(isinstance(st, EagerStep) for st in opt.plan.steps)
    assert_close(opt(s), fn(s), torch.float32, "linspace")
