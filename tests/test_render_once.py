"""A measured candidate's kernel is rendered once: verifying it on random inputs, pricing (or
timing) it and checking it on the user's example inputs reuse one render."""

from __future__ import annotations

from collections import Counter

import torch

from autofuse.capture import capture
from autofuse.kernels import KINDS, analyze_group, default_config
from autofuse.measure import CostModel
from autofuse.measure import candidate as candidates
from autofuse.measure.candidate import Candidate
from autofuse.partition import Partitioner
from autofuse.tune import tuner


def _count_renders(monkeypatch) -> Counter:
    """(kind, graph key, config) -> renders outside plan building, as they happen."""
    renders: Counter = Counter()
    building = [0]
    monkeypatch.setattr(candidates, "_BUILT", {})  # nothing rendered by an earlier test
    for kind in KINDS:
        real = type(kind).generate

        def counted(self, graph, info, config, index, _real=real):
            if not building[0]:
                renders[(self.name, graph.key, repr(config))] += 1
            return _real(self, graph, info, config, index)

        monkeypatch.setattr(type(kind), "generate", counted)
    real_build = tuner.assemble

    def assemble(*a, **k):
        building[0] += 1
        try:
            return real_build(*a, **k)
        finally:
            building[0] -= 1

    monkeypatch.setattr(tuner, "assemble", assemble)
    return renders


def _softmax(x):
    return torch.softmax(x * 2.0, dim=-1) + 1.0


def test_a_measured_candidate_is_rendered_once_in_a_tuned_run(monkeypatch, tmp_path):
    renders = _count_renders(monkeypatch)
    x = torch.randn(4, 64)
    captured = capture(_softmax, (x,))
    tuner.tune(captured, (x,), Partitioner(captured.graph), trials=3, polish=0, progress=False,
               cache_dir=str(tmp_path), measurer=CostModel(verify=True))  # fmt: skip
    assert renders, "no candidate was measured"
    assert max(renders.values()) == 1, renders


def test_pricing_a_verified_candidate_renders_once(monkeypatch):
    renders = _count_renders(monkeypatch)
    x = torch.randn(4, 64)
    graph = capture(_softmax, (x,)).graph
    group = Partitioner(graph).greedy().groups[0]
    info = analyze_group(graph, group)
    candidate = Candidate(graph, info, default_config(info, graph))
    m = CostModel(verify=True).measure(candidate)
    assert m.ok, m.error
    assert sum(renders.values()) == 1, renders


def test_pricing_renders_nothing(monkeypatch):
    """The cost model prices the group and its config (``kernels.cost_facts``): no render."""
    renders = _count_renders(monkeypatch)
    x = torch.randn(4, 64)
    graph = capture(_softmax, (x,)).graph
    info = analyze_group(graph, Partitioner(graph).greedy().groups[0])
    m = CostModel().measure(Candidate(graph, info, default_config(info, graph)))
    assert m.ok and not renders, renders
