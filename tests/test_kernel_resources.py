"""experiments/probes/kernel_resources.py: a generated kernel compiled for sm_90 by Triton's own
toolchain on a machine without a GPU, with ptxas's register and spill counts."""

import os

import pytest
import torch

import autofuse
from experiments.probes.kernel_resources import resources, signature, spec


def _plan(fn, *args):
    os.environ.setdefault("TRITON_INTERPRET", "1")
    return autofuse.optimize(fn, args).plan


def test_signature_types_buffers_by_dtype_and_marks_constexprs():
    plan = _plan(lambda x, y: (x * y).sum(-1), torch.randn(8, 32), torch.randn(8, 32))
    (k,) = plan.kernels
    sig = signature(k, plan.graph)
    assert [sig[f"in_ptr{i}"] for i in range(2)] == ["*fp32", "*fp32"]
    assert sig["out_ptr0"] == "*fp32" and sig["XBLOCK"] == "constexpr"


def test_resources_of_a_kernel_compiled_for_sm90():
    pytest.importorskip("triton.backends.nvidia.compiler")
    plan = _plan(lambda x: torch.sigmoid(x) * 2.0, torch.randn(64, 64))
    (k,) = plan.kernels
    (row,) = resources([spec(k, plan.graph)])
    assert "error" not in row, row
    assert 0 < row["registers"] <= 255 and row["spill_stores_bytes"] == 0
    assert row["blocks_per_sm_by_registers"] >= 1
