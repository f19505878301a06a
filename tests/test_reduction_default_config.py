"""The reduction kind's default launch config for outer reductions (column statistics): a
variance (phases: the mean, then the squared deviations) holds its rows whole in a narrower
block instead of walking them twice; a one-phase column sum keeps the wide looped block."""

import torch

import autofuse
from autofuse.kernels import default_config
from autofuse.kernels.reduction.kind import phases
from autofuse.partition.partitioner import Partitioner


def _reduction_info(fn, x):
    graph = autofuse.capture(fn, (x,)).graph
    part = Partitioner(graph)
    infos = [part.check(g) for g in part.greedy().groups]
    (info,) = [i for i in infos if not isinstance(i, str) and i.kind == "reduction"]
    return graph, info


def test_column_variance_holds_rows_whole():
    graph, info = _reduction_info(lambda x: x.var(0), torch.randn(1000, 2048))
    assert phases(graph, info) >= 2
    cfg = default_config(info, graph)
    assert cfg.RBLOCK >= info.rnumel  # persistent: one pass over each row
    assert cfg.XBLOCK >= 8 and cfg.XBLOCK * cfg.RBLOCK <= 8192


def test_column_sum_keeps_the_looped_block():
    graph, info = _reduction_info(lambda x: x.sum(0), torch.randn(1000, 2048))
    assert phases(graph, info) == 1
    cfg = default_config(info, graph)
    assert cfg.RBLOCK < info.rnumel and cfg.XBLOCK == 16
