"""Acceptance: every legal partition of the reference workloads, with sampled configs, matches
eager through Triton's interpreter (fp32 tight, bf16 within bf16 tolerance)."""

import pytest
import torch

from autofuse.capture import capture
from autofuse.partition import Partitioner

from .helpers import check_partitions
from .workloads import cases

NAMES = list(cases())


@pytest.mark.parametrize("name", NAMES)
def test_every_partition_fp32(name):
    fn, args = cases(torch.float32)[name]
    n_parts, n_checked = check_partitions(fn, args, torch.float32)
    assert n_parts >= 1 and n_checked >= n_parts


@pytest.mark.parametrize(
    "name", ["pointwise_example", "softmax", "layernorm", "rmsnorm_residual", "masked_softmax_3d"]
)
def test_every_partition_bf16(name):
    fn, args = cases(torch.bfloat16, seed=1)[name]
    check_partitions(fn, args, torch.bfloat16, configs_per_group=1, sample=8)


def test_greedy_fuses_each_pattern_into_one_kernel():
    expect_one = ["pointwise_example", "reduction_example", "softmax", "log_softmax", "layernorm",
                  "rmsnorm_residual", "sin_cos", "gelu_tanh_chain", "mean_var_dim0",
                  "masked_softmax_3d"]  # fmt: skip
    for name in expect_one:
        fn, args = cases()[name]
        greedy = Partitioner(capture(fn, args).graph).greedy()
        assert len(greedy.groups) == 1, f"{name}: greedy gave {greedy.key}"


def test_unsupported_op_runs_in_eager_while_neighbours_fuse():
    import autofuse

    fn, args = cases()["with_unsupported"]
    opt = autofuse.optimize(fn, args)
    fallbacks = [opt.plan.graph[s.node].attr("target") for s in opt.plan.fallbacks]
    assert fallbacks == ["aten.cumsum.default"]
    names = [k.name for k in opt.plan.kernels]
    assert any("add_relu" in n for n in names), names  # relu and +1 after the cumsum fuse
    out = opt(*args)
    ref = fn(*args)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r)
    assert "cumsum" in autofuse.explain(fn, args).__str__()
