"""GEMM groups: every listed partition of the GEMM workloads matches eager in the interpreter,
and the greedy plan fuses epilogues, prologues and sibling GEMMs into the matmul kernel."""

import pytest
import torch
import torch.nn.functional as F

import autofuse

from .helpers import assert_close, check_partitions
from .workloads import gemm_cases

NAMES = list(gemm_cases())


@pytest.mark.parametrize("name", NAMES)
def test_every_partition_fp32(name):
    fn, args = gemm_cases(torch.float32)[name]
    n_parts, n_checked = check_partitions(fn, args, torch.float32, configs_per_group=2)
    assert n_parts > 1 and n_checked >= n_parts


@pytest.mark.parametrize("name", ["gemm_bias_gelu", "swiglu"])
def test_greedy_bf16(name):
    fn, args = gemm_cases(torch.bfloat16, seed=3)[name]
    check_partitions(fn, args, torch.bfloat16, configs_per_group=1, max_enumerate=4, sample=3)


def test_epilogue_fused_into_the_gemm():
    fn, args = gemm_cases()["gemm_bias_gelu"]
    opt = autofuse.optimize(fn, args)
    (k,) = opt.plan.kernels
    assert k.name.startswith("autofuse_mm_fused_") and not opt.plan.fallbacks
    assert "tl.dot(" in k.source and "tl.erf(" in k.source
    assert_close(opt(*args), fn(*args), torch.float32)


def test_horizontal_gemm_pair_shares_the_a_tile():
    fn, args = gemm_cases()["swiglu"]
    opt = autofuse.optimize(fn, args)
    (k,) = opt.plan.kernels
    assert "acc1" in k.source and k.source.count("tl.dot(") == 2
    assert_close(opt(*args), fn(*args), torch.float32)


def test_prologue_fused_into_operand_load():
    def scaled(x, s, w):
        return (x * s).to(torch.bfloat16) @ w

    x, s = torch.randn(33, 40), torch.rand(33, 1) + 0.5
    w = torch.randn(40, 24).to(torch.bfloat16)
    opt = autofuse.optimize(scaled, (x, s, w))
    (k,) = opt.plan.kernels  # mul and cast happen while loading A
    assert_close(opt(x, s, w), scaled(x, s, w), torch.bfloat16)


def test_transposed_weight_is_strides_not_a_copy():
    def linear(x, w, b):
        return F.relu(F.linear(x, w, b))

    x, w, b = torch.randn(17, 24), torch.randn(30, 24), torch.randn(30)
    opt = autofuse.optimize(linear, (x, w, b))
    assert len(opt.plan.kernels) == 1 and not opt.plan.fallbacks
    assert "clone" not in opt.plan.kernels[0].name
    assert_close(opt(x, w, b), linear(x, w, b), torch.float32)


def test_lone_matmul_runs_as_torch_mm():
    def mm(a, b):
        return a @ b

    a, b = torch.randn(8, 16), torch.randn(16, 4)
    opt = autofuse.optimize(mm, (a, b))
    assert not opt.plan.kernels and "cuBLAS" in opt.plan.fallbacks[0].reason
