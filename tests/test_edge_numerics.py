"""Numerics at the edge of the finite range: the fused attention's output stays finite where
eager's does (values near the dtype's max: the accumulator holds the normalized output), and
var / std are finite where eager's are (the sum of squares scaled where it would overflow;
16-bit inputs in float32 as eager). Tiny shapes through the interpreter on CPU."""

# ruff: noqa: E402

import os

import torch

if not torch.cuda.is_available():  # before triton is imported: kernels run in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

import autofuse


def attn(q, k, v):
    return torch.softmax((q @ k.transpose(-1, -2)) * 0.125, -1) @ v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_attention_over_values_at_the_dtypes_max_stays_finite(dtype):
    fmax = torch.finfo(dtype).max
    q, k = torch.zeros(1, 2, 16, 16, dtype=dtype), torch.zeros(1, 2, 2, 16, dtype=dtype)
    v = torch.full((1, 2, 2, 16), fmax, dtype=dtype)  # two keys, each with v = finfo.max
    fast = autofuse.optimize(attn, (q, k, v))
    assert any("att" in kern.name for kern in fast.plan.kernels)
    out = fast(q, k, v)
    assert torch.isfinite(attn(q, k, v)).all() and torch.isfinite(out).all()
    torch.testing.assert_close(out, attn(q, k, v))
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 16, 16, generator=g).to(dtype)
    k, v = (torch.randn(1, 2, 2, 16, generator=g).to(dtype) for _ in range(2))
    v = v * 1e3  # ordinary values: as close to float64 as eager is
    exact = attn(q.double(), k.double(), v.double())
    err = (fast(q, k, v).double() - exact).abs().max()
    assert err <= 2 * (attn(q, k, v).double() - exact).abs().max() + 1e-3


REDUCTIONS = {
    "var": lambda x: x.var(-1),
    "std": lambda x: x.std(-1),
    "var_mean": lambda x: torch.var_mean(x, -1, correction=0)[0],
    "std_all": lambda x: x.std(),
}


@pytest.mark.parametrize("dtype,scale", [(torch.float32, 2e19), (torch.float32, 1e37),
                                         (torch.float16, 300.0), (torch.bfloat16, 2e19)])  # fmt: skip
@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_var_and_std_are_finite_where_eager_is(dtype, scale, name):
    fn = REDUCTIONS[name]
    g = torch.Generator().manual_seed(1)
    x = ((torch.rand(3, 33, generator=g, dtype=torch.float64) * 2 - 1) * scale).to(dtype)
    got, eager, exact = autofuse.optimize(fn, (x,))(x), fn(x), fn(x.double())
    assert torch.equal(torch.isfinite(got), torch.isfinite(eager)), (got, eager)
    fin = torch.isfinite(eager)
    rel = ((got.double() - exact) / exact).abs()[fin]
    erel = ((eager.double() - exact) / exact).abs()[fin]
    assert (rel <= 4 * erel + 4 * torch.finfo(dtype).eps).all(), (rel, erel)
