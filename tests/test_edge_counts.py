"""Reductions over counts at their edge: var / std / var_mean with a correction >= the number of
elements. Eager divides by max(n - correction, 0): x / 0, inf where the row varies (however
little: its squares may underflow, its differences can not) and NaN where it is constant."""

import warnings

import pytest
import torch

import autofuse

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ROWS = [[1e-5, 2e-5], [0.5, 0.5], [1.0, 1.015625], [1e-30, 2e-30], [-3.0, 2.0]]


def _var(x):
    return torch.var(x, -1, correction=2)


def _std(x):
    return torch.std(x, -1, correction=3)


def _var_mean(x):
    return torch.var_mean(x, dim=-1, correction=2)


def _std_mean(x):
    return torch.std_mean(x, dim=-1, correction=2)


def _front_ends(fn, x):
    yield autofuse.optimize(fn, [x])
    torch._dynamo.reset()
    yield torch.compile(fn, backend="autofuse", dynamic=False)


def _run(fn, x, backward):
    x = x.detach().clone().requires_grad_(backward)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager's "degrees of freedom is <= 0"
        out = fn(x)
    outs = out if isinstance(out, tuple) else (out,)
    if not backward:
        return [o.detach() for o in outs]
    sum(o.float().sum() for o in outs).backward()
    return [x.grad]


def _same(got, ref):
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == r.dtype and g.shape == r.shape
        assert torch.equal(g.isnan(), r.isnan()), (g, r)
        assert torch.equal(g.isinf(), r.isinf()), (g, r)
        torch.testing.assert_close(g, r, equal_nan=True, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", [_var, _std, _var_mean, _std_mean])
def test_correction_at_least_count_matches_eager(fn, dtype):
    x = torch.tensor(ROWS).to(dtype)
    for backward in (False, True):
        ref = _run(fn, x, backward)
        for compiled in _front_ends(fn, x):
            _same(_run(compiled, x, backward), ref)
        torch._dynamo.reset()


@pytest.mark.parametrize("shape", [(3, 0), (3, 1)])
def test_correction_over_empty_and_single_rows(shape):
    x = torch.randn(shape)
    for fn in (_var, _var_mean):
        for backward in (False, True):
            ref = _run(fn, x, backward)
            for compiled in _front_ends(fn, x):
                _same(_run(compiled, x, backward), ref)
            torch._dynamo.reset()


@pytest.mark.parametrize("shape", [(0, 4, 3), (2, 4, 0), (2, 4, 0, 3)])
def test_group_norm_backward_on_empty_input(shape):
    """Eager's backward works on every shape here; PyTorch's own aot_eager raises
    ZeroDivisionError on (2, 4, 0) and (2, 4, 0, 3) (its decomposition's 1 / (HxW * C / G))."""

    def fn(x, w, b):
        return torch.nn.functional.group_norm(x, 2, w, b)

    args = [torch.randn(shape), torch.randn(4), torch.randn(4)]

    def grads(f):
        leaves = [a.detach().clone().requires_grad_() for a in args]
        (f(*leaves) * 1.5).sum().backward()
        return [leaf.grad for leaf in leaves]

    ref = grads(fn)
    for compiled in (
        autofuse.optimize(fn, args),
        torch.compile(fn, backend="autofuse", dynamic=False),
    ):
        _same(grads(compiled), ref)
    torch._dynamo.reset()
