"""Ops autofuse does not generate run as their eager ATen op (a library call) at a partition
boundary, with their neighbours still fused on both sides: topk, sort."""

import pytest
import torch

from autofuse.capture.trace import capture
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import build_plan, execute

from .helpers import assert_close, reference


def top3(x):
    v, i = torch.topk(x * 2.0, 3, dim=-1)
    return v.exp() + 1.0, i, torch.sort(x.abs(), -1).values[..., :2] * 0.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_and_sort_are_library_steps_between_fused_kernels(dtype):
    x = torch.randn(5, 37, generator=torch.Generator().manual_seed(0)).to(dtype)
    graph = capture(top3, (x,)).graph
    plan = build_plan(graph, Partitioner(graph).greedy().groups)
    targets = {graph[s.node].attr("target") for s in plan.fallbacks} - {None}
    assert targets == {"aten.topk.default", "aten.sort.default"}, targets
    fused = {graph[n].op for k in plan.kernels for n in k.info.nodes}
    assert {"mul", "exp", "add", "abs"} <= fused, fused  # neighbours still in kernels
    outs = execute(plan, [x])
    for k, (o, r) in enumerate(zip(outs, reference(top3, (x,), dtype), strict=True)):
        assert_close(o, r, dtype, f"out {k}")
