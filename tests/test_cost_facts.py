"""The cost model prices a group under a config from the IR and the config alone: no kernel is
rendered to price it (``kernels/common/reads.py`` finds what a loop kernel reads in each loop
as its emitter would), and what it finds is what the emitters record as they render."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from autofuse.capture.trace import capture
from autofuse.kernels import KINDS, config_space, generate, kind_of
from autofuse.kernels.common.emitter import Emitter
from autofuse.kernels.common.reads import streamed_loads
from autofuse.measure import Candidate, CostModel
from autofuse.partition.partitioner import Partitioner
from autofuse.tune.prune import ModelPrune
from tests.test_gemm_row import _BOUND_CASES, _cases
from tests.test_kernel_sources import default_corpus_kernels


def _corpus() -> list:
    """(graph, info, config, kernel) of every kernel of the pinned corpus (every kind)."""
    return [(g, k.info, k.config, k) for _, _, g, k in default_corpus_kernels()
            if not isinstance(k, str)]  # fmt: skip


def test_pricing_renders_nothing(monkeypatch):
    """With every kind's ``generate`` and the loop emitter raising, the cost model and the
    search's pruner price every kernel of the corpus (all the kinds)."""
    kernels = _corpus()

    def rendered(*args, **kwargs):
        raise AssertionError("a kernel was rendered to price it")

    for kind in KINDS:
        monkeypatch.setattr(kind, "generate", rendered)
    monkeypatch.setattr(Emitter, "emit", rendered)
    monkeypatch.setattr("autofuse.measure.candidate.generate", rendered)
    model, kinds = CostModel(), set()
    for graph, info, config, _ in kernels:
        m = model.measure(Candidate(graph, info, config))
        assert m.ok or "out of resources" in m.failure, (info.kind, config, m.failure)
        kinds.add(info.kind)
    assert {"pointwise", "reduction", "gemm", "gemm_row", "attention", "attention_bwd"} <= kinds
    graph, info, config, _ = kernels[0]
    assert ModelPrune(graph).cost([(info, config)]) is not None


def _reads_of(graph, info, config):
    return kind_of(info).reads(graph, info, config)


def test_reads_are_what_the_emitters_record():
    """Every loop kernel of the corpus (the attention backward's too): the load passes and
    dots found from the IR equal those its emitter recorded while rendering it."""
    seen = 0
    for graph, info, config, kernel in _corpus():
        if hasattr(kind_of(info), "reads"):
            got = _reads_of(graph, info, config)
            assert got == (kernel.meta.load_passes, kernel.meta.dots), (info.kind, config)
            seen += 1
    assert seen > 300


def _row_gemm_groups():
    gen = torch.Generator().manual_seed(1)
    args = (torch.randn(2, 32, 16, generator=gen), torch.randn(2, 80, 16, generator=gen))
    cases = [(fn, a) for fn, a in _cases().values()]
    cases += [(fn, args) for fn, _ in _BOUND_CASES.values()]
    for fn, a in cases:
        graph = capture(fn, a).graph
        space = Partitioner(graph)
        for group in space.greedy().groups:
            info = space.check(group)
            if getattr(info, "kind", None) == "gemm_row":
                yield graph, info


@pytest.mark.parametrize("skip", [False, True], ids=["live", "skip"])
def test_row_gemm_reads_are_what_its_emitter_records(skip):
    """The row GEMM's loops: the whole row or looped, one BLOCK_K or a K loop, a causal mask's
    bound (the constant tiles' loop has no product), SKIP's tested tiles."""
    seen = 0
    for graph, info in _row_gemm_groups():
        configs = [replace(c, SKIP=skip) for c in config_space(info, graph)]
        looped = [c for c in configs if c.RBLOCK < info.rnumel][:6]
        for config in [*looped, *[c for c in configs if c.RBLOCK >= info.rnumel][:2]]:
            kernel = generate(graph, info, config)
            got = _reads_of(graph, info, config)
            assert got == (kernel.meta.load_passes, kernel.meta.dots), config
            seen += 1
    assert seen > 40


def test_streamed_loads_are_those_one_loop_alone_reads():
    """A looped reduction's loads read by one column loop alone (streamed ``evict_first``),
    found with no render, are those its emitter reads in one loop alone."""
    seen = 0
    for graph, info, config, _ in _corpus():
        if info.kind not in ("reduction", "scan") or config.RBLOCK >= info.rnumel:
            continue
        probe = Emitter(graph, info, config)
        probe.emit()
        regions = probe.regions
        want = {i for i in info.loads if i not in regions[0] and sum(i in r for r in regions) == 1}
        assert streamed_loads(graph, info) == want, config
        seen += 1
    assert seen > 20
