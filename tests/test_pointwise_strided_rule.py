"""The pointwise kind's rule for flat kernels whose loads step 2-4 elements per lane (pooling
windows, strided slices): two outputs per thread (``STRIDED_CONFIG``: XBLOCK 512, 8 warps)
where other flat kernels take eight (1024, 4 warps). The rule applies off the interpreter (on
a GPU); here it is switched on by hand, and the kernel it picks is run in the interpreter."""

from __future__ import annotations

import pytest
import torch

from autofuse.capture import capture
from autofuse.kernels import KernelConfig, default_config
from autofuse.kernels.pointwise import kind as pointwise
from autofuse.partition import Partitioner
from autofuse.plan import build_plan, execute

CASES = {
    "avg_pool3d": (torch.nn.AvgPool3d(2), lambda: [torch.rand(2, 4, 16, 64, 64)], True),
    "max_pool2d": (torch.nn.MaxPool2d(3), lambda: [torch.randn(2, 8, 96, 96)], True),
    "every_other": (lambda a: a[:, ::2] * 2, lambda: [torch.rand(64, 8192)], True),
    "contiguous": (lambda a: a * 2 + 1, lambda: [torch.rand(64, 4096)], False),
    "broadcast": (lambda a, b: a + b, lambda: [torch.rand(64, 4096), torch.rand(4096)], False),
    "transposed": (lambda a: a.t() * 2, lambda: [torch.rand(256, 256)], False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_strided_flat_kernels_take_two_outputs_per_thread(name, monkeypatch):
    fn, make, strided = CASES[name]
    ins = make()
    graph = capture(fn, ins).graph
    space = Partitioner(graph)
    (group,) = space.greedy().groups
    info = space.check(group)
    monkeypatch.setattr(pointwise, "interpreting", lambda: False)
    cfg = default_config(info, graph)
    want = pointwise.STRIDED_CONFIG if strided else KernelConfig(1024, 0, 4)
    assert cfg == want, (name, cfg)
    monkeypatch.undo()  # run it in the interpreter, at the config the rule picked
    (out,) = execute(build_plan(graph, [group], [cfg]), ins)
    torch.testing.assert_close(out, fn(*ins))


def test_the_rule_is_off_in_the_interpreter():
    fn, make, _ = CASES["avg_pool3d"]
    graph = capture(fn, make()).graph
    space = Partitioner(graph)
    (group,) = space.greedy().groups
    assert default_config(space.check(group), graph) != pointwise.STRIDED_CONFIG
