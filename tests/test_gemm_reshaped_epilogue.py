"""A GEMM's epilogue over a reshape of its output: ``x @ w + b`` with a 3-D or 4-D ``x`` is a
2-D matmul whose result is viewed back to ``x``'s leading dims before the bias and the
activation; the epilogue stores each element at the tile's flat offset, so the group is one
GEMM kernel as with a 2-D ``x``. A reshape that is not the output's own order (a transpose)
reads other programs' accumulators and stays outside. Through the interpreter on CPU."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse.kernels.gemm.kind import GemmKind

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py


@pytest.fixture(autouse=True)
def gemm_kernels(monkeypatch):
    """Untuned plans run GEMM groups as generated kernels (not the library call + epilogue)."""
    monkeypatch.setattr(GemmKind, "library_first", False)


def _bias_gelu(x, w, b):
    return F.gelu(x @ w + b)


def _linear_silu(x, w, b):
    return F.silu(F.linear(x, w, b)) * 2.0


def _transposed_out(x, w, b):
    return (x @ w).transpose(-1, -2) + b[:, None]


def _kernel_names(opt) -> list[str]:
    return [line.split()[0] for line in opt.report().splitlines() if line.startswith("autofuse_")]


@pytest.mark.parametrize("lead", [(2, 5), (3, 1, 4), (1, 7)])
def test_a_reshaped_gemm_output_keeps_its_epilogue_in_the_gemm_kernel(lead):
    torch.manual_seed(0)
    x, w, b = torch.randn(*lead, 24), torch.randn(24, 40), torch.randn(40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = autofuse.optimize(_bias_gelu, (x, w, b))
        compiled = torch.compile(_bias_gelu, backend="autofuse")
        torch.testing.assert_close(fast(x, w, b), _bias_gelu(x, w, b), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(compiled(x, w, b), _bias_gelu(x, w, b), rtol=1e-4, atol=1e-4)
    names = _kernel_names(fast)
    assert len(names) == 1 and names[0].startswith("autofuse_mm_"), fast.report()


def test_linear_on_3d_input_fuses_and_a_transposed_output_stays_correct():
    torch.manual_seed(1)
    x, w, b = torch.randn(2, 6, 16), torch.randn(12, 16), torch.randn(12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = autofuse.optimize(_linear_silu, (x, w, b))
        torch.testing.assert_close(fast(x, w, b), _linear_silu(x, w, b), rtol=1e-4, atol=1e-4)
        assert len(_kernel_names(fast)) == 1, fast.report()
        wt = torch.randn(16, 12)
        args = (x, wt, torch.randn(12))
        t = autofuse.optimize(_transposed_out, args)
        torch.testing.assert_close(t(*args), _transposed_out(*args), rtol=1e-4, atol=1e-4)
