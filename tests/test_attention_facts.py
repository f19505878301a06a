"""An attention group is analysed once: its analysis (``attention_parts`` of the forward,
``bwd_parts`` of the backward: parts, sizes, clones, the scale fold) runs once per group while
the kind analyses it, lists and picks its configs, generates its kernels and prices them; both
kinds read their operands through the same record."""

import pytest
import torch

from autofuse.kernels import analyze_group, config_space, default_config, generate
from autofuse.kernels.attention import analysis as forward_analysis
from autofuse.kernels.attention.facts import AttentionGroup
from autofuse.kernels.attention_bwd import analysis as backward_analysis
from autofuse.measure.cost_model import CostModel
from autofuse.partition import Partitioner
from tests.test_kernel_sources import _attention_step, _backend_graphs

ANALYSES = {"attention": (forward_analysis, "attention_parts"),
            "attention_bwd": (backward_analysis, "bwd_parts")}  # fmt: skip


def _training_graphs() -> list:
    g = torch.Generator().manual_seed(0)
    qkv = [torch.randn(2, 19, 16, generator=g).requires_grad_() for _ in range(3)]
    return _backend_graphs(_attention_step, tuple(qkv))()


@pytest.mark.parametrize("kind", sorted(ANALYSES))
def test_an_attention_group_is_analysed_once(kind, monkeypatch):
    module, name = ANALYSES[kind]
    real, calls = getattr(module, name), []

    def counted(graph, members):
        calls.append(members)
        return real(graph, members)

    monkeypatch.setattr(module, name, counted)
    seen = 0
    for graph in _training_graphs():
        for group in Partitioner(graph).greedy().groups:
            info = analyze_group(graph, group)
            if info.kind != kind:
                continue
            configs = config_space(info, graph)
            for config in (default_config(info, graph), configs[0], configs[-1]):
                kernel = generate(graph, info, config, 0)
                assert isinstance(CostModel().kernel_time(graph, info, kernel.config), float)
            # once, here or already while the backend compiled the same graph
            assert calls.count(frozenset(info.nodes)) <= 1, calls
            facts = module.forward_facts if kind == "attention" else module.backward_facts
            members = frozenset(info.nodes)
            record = facts(graph, members)
            assert isinstance(record, AttentionGroup) and record is facts(graph, members)
            seen += 1
    assert seen
