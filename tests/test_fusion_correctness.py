"""Acceptance: every legal partition of the reference workloads, with sampled configs, matches
eager through Triton's interpreter (fp32 tight, bf16 within bf16 tolerance)."""

import pytest
import torch

from autofuse.capture.trace import capture
from autofuse.partition.partitioner import Partitioner

from .helpers import check_partitions
from .workloads import cases

NAMES = list(cases())


@pytest.mark.parametrize("name", NAMES)
def test_every_partition_fp32(name):
    fn, args = cases(torch.float32)[name]
    n_parts, n_checked = check_partitions(fn, args, torch.float32)
    assert n_parts >= 1 and n_checked >= n_parts


BF16 = ["pointwise_example", "softmax", "layernorm", "rmsnorm_residual", "masked_softmax_3d"]


@pytest.mark.parametrize("name", BF16)
def test_sampled_partitions_bf16(name):
    """bf16 through every partition where there are at most 8, else the greedy one and 7 drawn
    (every partition is checked in fp32 above, and in bf16 under -m exhaustive)."""
    fn, args = cases(torch.bfloat16, seed=1)[name]
    check_partitions(fn, args, torch.bfloat16, configs_per_group=1, max_enumerate=8, sample=8)


@pytest.mark.exhaustive
@pytest.mark.parametrize("name", BF16)
def test_every_partition_bf16(name):
    fn, args = cases(torch.bfloat16, seed=1)[name]
    check_partitions(fn, args, torch.bfloat16, configs_per_group=1)


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
    assert fallbacks == ["aten.logcumsumexp.default"]
    names = [k.name for k in opt.plan.kernels]
    assert any("add_relu" in n for n in names), names  # relu and +1 after the eager op fuse
    out = opt(*args)
    ref = fn(*args)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r)
    assert "logcumsumexp" in autofuse.explain(fn, args).__str__()


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm_residual", "softmax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hoisted_loads(name, dtype):
    """HOIST configs issue every load before the first reduction (a norm's weight and bias
    are in flight while the row is reduced); the values are the same."""
    from autofuse.kernels import config_space
    from autofuse.plan.runtime import build_plan, execute

    from .helpers import assert_close, reference

    fn, args = cases(dtype, seed=2)[name]
    graph = capture(fn, args).graph
    space = Partitioner(graph)
    groups = space.greedy().groups
    infos = [space.check(g) for g in groups]
    configs = []
    for info in infos:
        hoisted = [c for c in config_space(info, graph) if getattr(c, "HOIST", False)]
        configs.append(hoisted[0] if hoisted else None)
    assert any(configs), "a persistent reduction offers HOIST configs"
    plan = build_plan(graph, groups, configs)
    for k in plan.kernels:
        if k.config.HOIST:
            src = k.source
            last_load = max(i for i, ln in enumerate(src.splitlines()) if "tl.load(" in ln)
            first_sum = min(
                i
                for i, ln in enumerate(src.splitlines())
                if "tl.sum(" in ln or "tl.max(" in ln or "tl.reduce(" in ln
            )
            assert last_load < first_sum, src
    flat = [a for a in args if isinstance(a, torch.Tensor)]
    for o, r in zip(execute(plan, flat), reference(fn, args, dtype)):
        assert_close(o, r, dtype, f"{name} hoisted")
