"""What the pipeline asks of a kernel kind, answered by the kind itself (kernels/__init__.py is
the one list of kinds): the fields its configs switch on and off, whether it takes runtime
sizes, its cost facts."""

from __future__ import annotations

import dataclasses

import torch

from autofuse.capture import capture
from autofuse.kernels import (
    KINDS,
    analyze_group,
    bucket_config_fits,
    cost_facts,
    default_config,
    generate,
    switches,
)
from autofuse.kernels.common.cost import LoopCost, TileCost
from autofuse.partition import Partitioner

# the switch fields the search and the polish used before the config classes named their own
SWITCHED_BEFORE = {"TMA", "PERSISTENT", "SKIP", "PIPELINE", "HOIST", "ONE_STAGE", "flip", "whole"}


def test_each_config_class_names_its_switches_among_its_fields():
    for kind in KINDS:
        cls = kind.config_class
        fields = {f.name for f in dataclasses.fields(cls)}
        assert set(cls.SWITCHES) <= fields, cls
        # the same fields as the one list the search had: behaviour unchanged
        assert set(cls.SWITCHES) == fields & SWITCHED_BEFORE, cls
    assert switches(object()) == ()


def test_every_kind_says_whether_it_takes_runtime_sizes():
    takes = {k.name for k in KINDS if k.runtime_sizes}
    loops = {"pointwise", "reduction", "scan", "scatter", "gemm", "gemm_row"}
    assert loops | {"attention", "attention_bwd"} <= takes
    assert "conv" not in takes  # sizes baked in (its index arithmetic)
    assert all(isinstance(k.runtime_sizes, bool) for k in KINDS)


def _kernels(fn, *inputs):
    graph = capture(fn, inputs).graph
    for group in Partitioner(graph).greedy().groups:
        if len(group) > 1 or graph[next(iter(group))].kind != "matmul":
            info = analyze_group(graph, group)
            yield graph, info, generate(graph, info, default_config(info, graph))


def test_cost_facts_come_from_the_kind():
    """A loop kind gives loop facts, a GEMM tiled-product facts with its tile's shared memory;
    the runtime-size answer reaches the bucket rule."""
    x, w = torch.randn(16, 32), torch.randn(32, 24)
    facts = {
        info.kind: (cost_facts(g, info, k.config), bucket_config_fits(info))
        for g, info, k in _kernels(lambda a, b: (torch.relu(a @ b) + 1.0, a.sum(-1)), x, w)
    }
    (gemm,) = [v for v in facts.values() if isinstance(v[0], TileCost)]
    assert gemm[0].smem > 0 and gemm[0].quantized and gemm[1]
    loops = [v for v in facts.values() if isinstance(v[0], LoopCost)]
    assert loops and all(f.bytes > 0 and fits for f, fits in loops)
