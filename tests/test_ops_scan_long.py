"""cumsum / cumprod over rows longer than one block holds (rowops.MAX_ROW = 32768 elements):
a looped scan kernel walks the row in RBLOCK chunks, scanning each with tl.associative_scan
and carrying the combine of the earlier chunks. Few rows: the interpreter is slow on them."""

import pytest
import torch

from autofuse.capture.trace import capture
from autofuse.kernels import KernelConfig, config_space
from autofuse.kernels.common.rowops import MAX_ROW
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import build_plan, execute

from .helpers import assert_close, reference

DTYPES = [torch.float32, torch.bfloat16]


def rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def centered_cumsum(x):
    # a reduction (the row mean), then the scan of the centered row, then a pointwise op
    return torch.cumsum((x - x.mean(-1, keepdim=True)) * 2.0, dim=-1) + 1.0


def growth(x):
    return torch.cumprod(1.0 + x * 1e-3, dim=-1)


def scan_then_sum(x):
    return torch.cumsum(x, -1).sum(-1)  # the scan read inside the sum's own chunk loop


def one_kernel(fn, args, dtype, config=None):
    graph = capture(fn, args).graph
    groups = Partitioner(graph).greedy().groups
    plan = build_plan(graph, groups, None if config is None else [config] * len(groups))
    assert not plan.fallbacks, [s.reason for s in plan.fallbacks]
    assert len(plan.kernels) == 1, [k.name for k in plan.kernels]
    k = plan.kernels[0]
    assert k.info.kind == "scan" and k.info.rnumel > MAX_ROW and k.config.RBLOCK < k.info.rnumel
    for o, r in zip(execute(plan, list(args)), reference(fn, args, dtype), strict=True):
        assert_close(o, r, dtype, fn.__name__)
    return plan


@pytest.mark.parametrize("dtype", DTYPES)
def test_long_row_cumsum_is_one_looped_kernel(dtype):
    x = rand(1, 70000, dtype=dtype)
    x[0, 12345] = 1e4  # a jump carried into every later chunk
    plan = one_kernel(centered_cumsum, (x,), dtype)
    src = plan.kernels[0].source
    assert "tl.cumsum" in src and "for roffset in" in src, src
    cfgs = config_space(plan.kernels[0].info, plan.graph)
    assert cfgs and all(c.RBLOCK < 70000 for c in cfgs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_long_row_cumprod(dtype):
    x = rand(1, 40000, dtype=dtype, seed=1)
    x[0, 33000:33010] = float("nan") if dtype == torch.float32 else 0.0  # NaN carried on
    one_kernel(growth, (x,), dtype, KernelConfig(1, 8192, 8))


def test_long_row_scan_inside_a_reduction_loop():
    x = rand(1, 33000, seed=2)
    one_kernel(scan_then_sum, (x,), torch.float32, KernelConfig(1, 4096, 8))
