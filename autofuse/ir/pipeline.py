"""The IR passes every captured graph goes through before planning, in order (both front
ends: ``capture/trace.py`` and ``frontend/graph.py``)."""

from __future__ import annotations

from autofuse.ir.conv_fold import fold_batchnorm
from autofuse.ir.conv_layout import choose_layouts
from autofuse.ir.graph import Graph, dedupe
from autofuse.ir.pool_monotone import pool_before_monotone
from autofuse.ir.recompute import recompute_for_chunk_readers
from autofuse.ir.split import split_for_pipeline
from autofuse.settings import settings

__all__ = ["before_planning"]


def before_planning(graph: Graph, cuda: bool) -> Graph:
    """``graph`` (deduplicated) with each max pool of a non-decreasing chain taken before it
    (``ir/pool_monotone.py``), inference BatchNorm folded into the convolution before it where
    the settings say ``fold`` (by default the planner times that plan beside: ``ir/conv_fold.py``),
    each convolution's memory format recorded by the settings' rule (``ir/conv_layout.py``); its long reductions split where the settings split them (by
    default on ``cuda`` inputs), inner or outer by the layouts just chosen (``ir/split.py``);
    a value that split chunks and full-size readers both read computed again for the latter
    (``ir/recompute.py``)."""
    graph = pool_before_monotone(graph)
    if settings().bn_fold == "fold":
        graph = fold_batchnorm(graph)
    graph = choose_layouts(dedupe(graph), cuda)
    graph = dedupe(split_for_pipeline(graph, cuda))
    return recompute_for_chunk_readers(graph)
