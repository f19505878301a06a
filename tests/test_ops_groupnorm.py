"""group_norm + SiLU as one kernel: the (N, G) statistics over (C/G, H, W) and the per-channel
affine + SiLU epilogue over [N, C, H, W], stored at the reduction domain's flat index."""

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse.ir.indexing import Expr
from autofuse.kernels.common.views import domain_of_flat
from experiments.bench.model_functions import group_norm_silu

from .helpers import (
    ROW_CLASSES,
    assert_close,
    check_config_classes,
    check_partitions,
    reference,
    row_class,
)

DTYPES = [torch.float32, torch.bfloat16]


def rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def group_norm_relu_no_affine(x):
    return F.relu(F.group_norm(x, 4, eps=1e-5)) * 2.0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 6, 3, 5), (3, 64, 5, 7), (1, 32, 3, 1), (2, 96, 3)])
def test_group_norm_silu_is_one_kernel(dtype, shape):
    x = rand(*shape, dtype=dtype)
    x[0, :3] = x[0, :3] * 50.0 + 1e3  # one group far from zero
    w, b = rand(shape[1], dtype=dtype, seed=1), rand(shape[1], dtype=dtype, seed=2)
    fast = autofuse.optimize(group_norm_silu, (x, w, b))
    assert not fast.plan.fallbacks
    assert len(fast.plan.kernels) == 1, [k.name for k in fast.plan.kernels]
    (ref,) = reference(group_norm_silu, (x, w, b), dtype)
    assert_close(fast(x, w, b), ref, dtype, f"group_norm_silu {shape}")


def _looped_inputs(dtype):
    # rows of 3 * 7 * 5 = 105 elements: persistent and looped (RBLOCK < 105) configs
    x = rand(2, 12, 7, 5, dtype=dtype)
    x[1, 4:8] = float("-inf")  # a group of -inf gives NaN, as in eager
    w, b = rand(12, dtype=dtype, seed=1), rand(12, dtype=dtype, seed=2)
    return (x,), (x[:, :6], w[:6], b[:6])


@pytest.mark.parametrize("dtype", DTYPES)
def test_group_norm_one_kernel_persistent_and_looped(dtype):
    relu_args, silu_args = _looped_inputs(dtype)
    for fn, args in ((group_norm_relu_no_affine, relu_args), (group_norm_silu, silu_args)):
        assert check_config_classes(fn, args, dtype, row_class(105)) == ROW_CLASSES
        check_partitions(fn, args, dtype, configs_per_group=2, max_enumerate=1, sample=4)


@pytest.mark.exhaustive
@pytest.mark.parametrize("dtype", DTYPES)
def test_group_norm_sampled_partitions_exhaustive(dtype):
    relu_args, silu_args = _looped_inputs(dtype)
    check_partitions(group_norm_relu_no_affine, relu_args, dtype, configs_per_group=4,
                     max_enumerate=1)  # fmt: skip
    check_partitions(group_norm_silu, silu_args, dtype, configs_per_group=4, max_enumerate=1)


def test_flat_index_splits_over_a_multiple_of_the_divisor():
    # ((45 * x + r) // 15) % 6 with 0 <= r < 45: 3 * (x % 2) + r // 15 (was an opaque term)
    x, r = Expr.dim("xindex", 1, 4, True), Expr.dim("rindex", 1, 45, True)
    flat = x.scale(45) + r
    n, c, h, w = domain_of_flat(flat, (2, 6, 3, 5))
    assert c.render() == "3 * (xindex % 2) + (rindex // 15)"
    assert n.render() == "(xindex // 2)"
    assert w.render() == "(rindex % 5)"


def test_hoisted_loads_skip_inputs_read_through_a_reshape():
    # HOIST once loaded x at the domain index through its reshape's user: out of bounds
    from autofuse.capture.trace import capture
    from autofuse.kernels import KernelConfig
    from autofuse.plan.runtime import build_plan, execute

    def f(x):
        return (x.reshape(2, 2, -1) * 0.5).sum(-1)

    x = rand(2, 6, 7, 5)
    graph = capture(f, (x,)).graph
    group = frozenset(i for i in graph.compute_nodes())
    plan = build_plan(graph, [group], [KernelConfig(4, 128, 8, True)])
    src = plan.kernels[0].source
    assert src.count("tl.load(in_ptr0") == 1, src
    assert_close(execute(plan, [x])[0], f(x), torch.float32)
