"""Plans shared by the shapes of one graph structure: a graph compiled for a new shape of a
traced graph whose structure (ops and edges) already has a plan gets that plan's partition,
made once for every shape and bucket, instantiated at the exact shape (``Planner.rebuilt``):
no new partition, no new search. The launch configs are the bucket's: the default ones at the
bucket's sizes (``kernels/common/sizes.py``), or where a search chose them, the loop kernels'
configs of the nearest bucket searched (other kinds choose theirs at the exact shape). A loop
kernel's text is then the same at every shape of a bucket (runtime sizes), so those kernels
are not built again."""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from autofuse.ir.graph import Graph
from autofuse.kernels import EAGER, bucket_config_fits, fusible
from autofuse.plan.steps import Plan

__all__ = ["BucketPlans", "ShapeBucket", "partition_of", "structure_key"]


@dataclass(frozen=True)
class ShapeBucket:
    """What ``kernels.common.sizes.runtime_sizes`` is given while a shape of a traced graph
    compiles: ``scope`` names the traced graph (its shapes share one partition per structure),
    ``sizes`` the bucket of each dynamic size (its shapes share launch configs and kernels)."""

    scope: Hashable
    sizes: Hashable


def structure_key(graph: Graph) -> str:
    """The graph without its sizes: each node's op, inputs, dtype and attribute names."""
    h = hashlib.sha256()
    for n in graph.nodes:
        h.update(repr((n.op, n.inputs, n.dtype, tuple(k for k, _ in n.attrs))).encode())
    h.update(repr((graph.inputs, graph.outputs)).encode())
    return h.hexdigest()[:24]


def partition_of(plan: Plan, configs: bool = True) -> tuple[tuple[frozenset[int], ...], tuple]:
    """The groups and choices ``assemble`` makes ``plan`` from: a library step's call kept (its
    arguments are nodes, the same at every shape), an op the plan runs in eager where it
    could fuse kept in eager, a loop kernel's config where ``configs`` (else None: the default
    config at each shape's bucket)."""
    library = tuple(frozenset(s.nodes) for s in plan.library)
    eager = tuple(frozenset(s.nodes) for s in plan.fallbacks if fusible(plan.graph, s.node))
    choices = tuple(
        k.config if configs and bucket_config_fits(k.info) else None for k in plan.kernels
    )
    choices += tuple(s.call for s in plan.library) + (EAGER,) * len(eager)
    return plan.groups + library + eager, choices


class BucketPlans:
    """(graph structure, anything else the caller keys on) -> the partition of its first plan,
    and per bucket of it, the launch configs a search chose there."""

    def __init__(self) -> None:
        self._parts: dict[Hashable, tuple] = {}
        self._configs: dict[Hashable, dict[Hashable, tuple]] = {}
        self._lock = threading.Lock()

    def partition(self, structure: Hashable, bucket: Hashable) -> tuple | None:
        """The structure's partition at ``bucket``'s configs (see the module), for
        ``Planner.rebuilt``; None where the structure has none yet."""
        with self._lock:
            part = self._parts.get((structure, bucket), self._parts.get(structure))
            searched = self._configs.get(structure, {})
            near = min(searched, key=lambda b: bucket_distance(b, bucket), default=None)
        if part is None:
            return None
        groups, choices = part
        if near is not None and len(searched[near]) == len(choices):
            choices = tuple(c if c is not None else p for c, p in zip(searched[near], choices))
        return groups, choices

    def remember(self, structure: Hashable, bucket: Hashable, plan: Plan, searched: bool) -> None:
        """Keep ``plan``'s partition for the structure (the first one stays; a later one, made
        where it did not fit, for ``bucket`` alone) and, where a search chose its configs
        (``searched``), its loop kernels' configs for ``bucket``."""
        part = partition_of(plan, configs=False)
        with self._lock:
            if self._parts.setdefault(structure, part)[0] != part[0]:
                self._parts[(structure, bucket)] = part
            elif searched:
                self._configs.setdefault(structure, {})[bucket] = partition_of(plan)[1]

    def partitions(self) -> int:
        """How many structures hold a partition."""
        with self._lock:
            return len(self._parts)


def bucket_distance(a: Any, b: Any) -> float:
    """How far apart two buckets are: the sum over their sizes of |log2 a - log2 b| (inf where
    they differ in anything else than a size)."""
    if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool):
        return abs(math.log2(max(a, 1)) - math.log2(max(b, 1)))
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return sum(bucket_distance(x, y) for x, y in zip(a, b))
    return 0.0 if a == b else math.inf
