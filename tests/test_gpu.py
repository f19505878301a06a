"""GPU tier: generated kernels on CUDA (skipped without a GPU; run on the lent H200)."""

import pytest
import torch

import autofuse

from .helpers import assert_close, reference
from .workloads import cases, gemm_cases

pytestmark = pytest.mark.gpu


def _cuda(args):
    return tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)


@pytest.mark.parametrize("name", list(cases()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_plan_on_gpu(name, dtype):
    fn, args = cases(dtype, seed=5)[name]
    args = _cuda(args)
    opt = autofuse.optimize(fn, args)
    out = opt(*args)
    out = out if isinstance(out, tuple) else (out,)
    for o, r in zip(out, reference(fn, args, dtype)):
        assert_close(o, r, dtype, name)


@pytest.mark.parametrize("name", list(gemm_cases()))
def test_gemm_greedy_plan_on_gpu(name):
    fn, args = gemm_cases(torch.bfloat16, seed=7)[name]
    args = _cuda(args)
    opt = autofuse.optimize(fn, args)
    out = opt(*args)
    out = out if isinstance(out, tuple) else (out,)
    for o, r in zip(out, reference(fn, args, torch.bfloat16)):
        assert_close(o, r, torch.bfloat16, name)


def test_tuned_plan_on_gpu(tmp_path):
    fn, args = cases(torch.bfloat16)["softmax"]
    args = _cuda(args)
    opt = autofuse.optimize(fn, args, trials=8, cache_dir=str(tmp_path), progress=False)
    assert opt.tuning.source == "measured"
    assert_close(opt(*args), reference(fn, args, torch.bfloat16)[0], torch.bfloat16)
