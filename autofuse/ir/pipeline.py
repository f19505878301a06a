"""The IR passes every captured graph goes through before planning, in order (both front
ends: ``capture/trace.py`` and ``frontend/graph.py``)."""

from __future__ import annotations

from dataclasses import replace

from autofuse.ir.conv_fold import fold_batchnorm
from autofuse.ir.conv_layout import choose_layouts, relayout
from autofuse.ir.graph import Graph, Lowering, dedupe
from autofuse.ir.pool_monotone import pool_before_monotone
from autofuse.ir.recompute import recompute_for_chunk_readers
from autofuse.ir.softplus_tanh import tanh_of_softplus
from autofuse.ir.split import split_for_pipeline
from autofuse.settings import settings

__all__ = ["before_planning", "relaid"]


def before_planning(graph: Graph, cuda: bool) -> Graph:
    """``graph`` (deduplicated) with each written-out ``tanh(softplus(x))`` computed by one
    ``exp`` (``ir/softplus_tanh.py``), each max pool of a non-decreasing chain taken before it
    (``ir/pool_monotone.py``), inference BatchNorm folded into the convolution before it where
    the settings say ``fold`` (by default the planner times that plan beside: ``ir/conv_fold.py``),
    each convolution's memory format recorded by the settings' rule (``ir/conv_layout.py``); its long reductions split where the settings split them (by
    default on ``cuda`` inputs), inner or outer by the layouts just chosen (``ir/split.py``);
    a value that split chunks and full-size readers both read computed again for the latter
    (``ir/recompute.py``)."""
    graph = pool_before_monotone(tanh_of_softplus(graph))
    if settings().bn_fold == "fold":
        graph = fold_batchnorm(graph)
    return _after_layouts(choose_layouts(dedupe(graph), cuda), cuda)


def _after_layouts(graph: Graph, cuda: bool) -> Graph:
    """The passes that read the layouts chosen (split reductions, values computed again) over
    ``graph``; the result records ``graph`` as what it was made from (:func:`relaid`)."""
    out = recompute_for_chunk_readers(dedupe(split_for_pipeline(graph, cuda)))
    return replace(out, lowering=Lowering(graph, cuda, out))


def relaid(graph: Graph, layout: str) -> Graph:
    """``graph`` with every convolution that has a recorded layout run in ``layout``
    (``ir/conv_layout.relayout``), the passes that read layouts run again on it where
    :func:`before_planning` made ``graph``: a reduction split for a channels-last result
    (an outer reduction, its chunks read in memory's order) is split again, or not, for the
    contiguous one. A graph the pipeline did not make (or one changed since) is relaid as
    it is: its splits kept, read in the other layout (slower there, never wrong)."""
    low = graph.lowering
    if low is None or low.made != graph:  # compared node by node, not hashed
        return relayout(graph, layout)
    return _after_layouts(relayout(low.graph, layout), low.cuda)
