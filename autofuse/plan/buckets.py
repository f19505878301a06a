"""Plans shared by the shapes of one bucket: a graph compiled for a new shape in a bucket that
already has a plan (same graph structure: ops and edges) gets that plan's partition and its
loop kernels' launch configs (other kinds choose theirs at the exact shape), instantiated at
the exact shape (``Planner.rebuilt``): no new partition, no new search, and its loop kernels' text is
the bucket plan's (runtime sizes, ``kernels/common/sizes.py``), so those kernels are not built again."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from typing import Any

from autofuse.ir.graph import Graph
from autofuse.kernels import bucket_config_fits
from autofuse.plan.steps import Plan

__all__ = ["BucketPlans", "partition_of", "structure_key"]


def structure_key(graph: Graph) -> str:
    """The graph without its sizes: each node's op, inputs, dtype and attribute names."""
    h = hashlib.sha256()
    for n in graph.nodes:
        h.update(repr((n.op, n.inputs, n.dtype, tuple(k for k, _ in n.attrs))).encode())
    h.update(repr((graph.inputs, graph.outputs)).encode())
    return h.hexdigest()[:24]


def partition_of(plan: Plan) -> tuple[tuple[frozenset[int], ...], tuple[Any, ...]]:
    """The groups and choices ``planner.assemble`` makes ``plan`` from (a library step's call kept:
    its arguments are nodes, the same at every shape of the bucket)."""
    library = tuple(frozenset(s.nodes) for s in plan.library)
    configs = tuple(k.config if bucket_config_fits(k.info) else None for k in plan.kernels)
    configs += tuple(s.call for s in plan.library)
    return plan.groups + library, configs


class BucketPlans:
    """(bucket, structure, anything else the caller keys on) -> the partition of a plan."""

    def __init__(self) -> None:
        self._parts: dict[tuple, tuple] = {}
        self._lock = threading.Lock()

    def partition(self, key: tuple) -> tuple | None:
        """The bucket's partition (for ``Planner.rebuilt``), None where it has none yet."""
        with self._lock:
            return self._parts.get(key)

    def remember(self, key: tuple, plan: Plan) -> None:
        with self._lock:
            self._parts.setdefault(key, partition_of(plan))


def bucket_key(bucket: Any, graph: Graph, extra: Sequence[Any]) -> tuple:
    return (bucket, structure_key(graph), *extra)
