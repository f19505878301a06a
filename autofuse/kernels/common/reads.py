"""What a loop kernel reads in each of its loops, found from its group's IR and its config
(no code rendered): the cost model's load passes (how many times each loaded buffer is read)
and dots (``tl.dot`` calls per column tile).

A persistent kernel (the whole row in one block) reads each load once. A looped one walks the
row in RBLOCK chunks: one loop per reduction phase (the reductions of one dependency level,
``phase_levels``; a sum of ``exp(x - max)`` or a moment mean's shifted sum rides its max's
loop, ``online_pairs``), then the row outputs outside any loop, then one loop over the
elementwise outputs; each loop recomputes the values it needs from its loads, and a value
computed outside the loops is reused inside them. :class:`Reads` walks the group's values in that order as the emitter
(``common/emitter.py``) evaluates them, recording the loads each loop reaches; a kind whose
kernel has other loops (the row GEMM, the attention backward) drives it its own way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autofuse.ir.graph import Graph, numel
from autofuse.ir.ops import op_def
from autofuse.kernels.common.base import INLINE_OPS, GroupInfo
from autofuse.kernels.common.online import online_partner

CONSTANT = -1  # ``Reads.replaced``: the value is a constant here (it reads nothing)


def phase_levels(graph: Graph, info: GroupInfo) -> dict[int, int]:
    """Each member's reduction depth: a reduction is one more than the deepest reduction it
    reads (softmax: max 1, sum 2); a pointwise node that of its inputs."""
    members = frozenset(info.nodes)
    lv: dict[int, int] = {}
    for i in info.nodes:
        node = graph[i]
        deps = [graph.base_of(j) for j in node.inputs]
        base = max((lv.get(j, 0) for j in deps if j in members), default=0)
        lv[i] = base + 1 if node.kind == "reduction" else base
    return lv


def online_pairs(graph: Graph, info: GroupInfo) -> dict[int, int]:
    """Sums -> the ``amax`` whose loop they ride in a looped kernel (``common/online.py``: the
    softmax's ``sum(exp(f - amax(f)))``, the moment mean's shifted sum), one sum per max."""
    members, out = frozenset(info.nodes), {}
    keep_shape = tuple(1 if i in info.reduce_dims else d for i, d in enumerate(info.domain))
    for s in info.nodes:
        m = online_partner(graph, s, members, info.domain, keep_shape)
        if m is not None and m not in out.values():
            out[s] = m
    return out


def row_stored(graph: Graph, info: GroupInfo, s: int) -> bool:
    """Whether stored node ``s`` of a reduction group is one value per row (stored outside the
    loops), not one per domain element."""
    shape, dom, rd = graph[s].shape, info.domain, info.reduce_dims
    if shape == dom:
        return False
    kept = tuple(1 if j in rd else d for j, d in enumerate(dom))
    return shape in (kept, tuple(d for j, d in enumerate(dom) if j not in rd))


class Reads:
    """The walk of a kernel's values: which loaded buffers each loop reads (``regions[0]``:
    outside every loop) and how many ``tl.dot`` calls it emits. A value computed in a loop is
    known in that loop alone; one computed outside, everywhere after."""

    def __init__(self, graph: Graph, info: GroupInfo, looped: bool) -> None:
        self.g, self.info, self.looped = graph, info, looped
        self.members = frozenset(info.nodes)
        self.regions: list[set[int]] = [set()]
        self.region = 0
        self.scopes: list[set[int]] = [set()]
        self.dots = 0

    def loop(self, body: Callable[[], Any]) -> None:
        """``body`` walked in a new loop (its values known inside it alone)."""
        self.regions.append(set())
        outer, self.region = self.region, len(self.regions) - 1
        self.scoped(body)
        self.region = outer

    def scoped(self, body: Callable[[], Any]) -> None:
        self.scopes.append(set())
        body()
        self.scopes.pop()

    def read(self, i: int) -> None:
        self.regions[self.region].add(i)

    def value(self, i: int) -> None:
        node = self.g[i]
        if node.kind == "view":
            return self.value(node.inputs[0])
        if node.op in INLINE_OPS or any(i in s for s in self.scopes):
            return
        instead = self.replaced(i)
        if instead is not None:  # a constant here, or another node's value
            return None if instead == CONSTANT else self.value(instead)
        if i not in self.members:
            if numel(node.shape):  # an empty buffer is never read
                self.read(i)
        elif node.kind in ("reduction", "matmul"):
            self.reduced(i)
        else:
            for j in node.inputs:
                self.value(j)
        self.scopes[-1].add(i)

    def replaced(self, i: int) -> int | None:
        """What node ``i``'s value is where the kernel knows it otherwise: another node's
        (its node), a constant (:data:`CONSTANT`), or None (its own)."""
        return None

    def reduced(self, i: int) -> None:
        """A reduction's value: its row's result (computed by its phase), or a scan of a
        looped kernel, computed in the loop that reads it from its input."""
        if self.looped and op_def(self.g[i].op).scan:
            self.value(self.g[i].inputs[0])

    def passes(self) -> tuple[int, ...]:
        """How many times each loaded buffer is read: once per loop that reads it (once if
        read outside the loops alone)."""
        return tuple(max(1, sum(i in r for r in self.regions)) for i in self.info.loads)


def walk_loop_kernel(reads: Reads, in_loop: Callable[[Callable[[], Any]], None]) -> None:
    """A looped reduction kernel's walk: the phases' loops, the row outputs outside them, the
    loop over the elementwise outputs; ``in_loop(body)`` walks one column loop."""
    g, info = reads.g, reads.info
    lv = phase_levels(g, info)
    reds = [i for i in info.nodes if g[i].kind == "reduction"]
    online = online_pairs(g, info)
    for level in sorted({lv[r] for r in reds}):
        phase = [r for r in reds if lv[r] == level and r not in online and not op_def(g[r].op).scan]
        if phase:
            in_loop(lambda phase=phase: [reads.value(g[r].inputs[0]) for r in phase])
    rows = [s for s in info.stored if row_stored(g, info, s)]
    fulls = [s for s in info.stored if not row_stored(g, info, s)]
    for s in rows:
        reads.value(s)
    if fulls:
        in_loop(lambda: [reads.value(s) for s in fulls])


def looped_reads(graph: Graph, info: GroupInfo) -> Reads:
    """The walk of a looped pointwise, reduction, scan or scatter kernel (the row in chunks)."""
    reads = Reads(graph, info, True)
    walk_loop_kernel(reads, reads.loop)
    return reads


def loop_reads(graph: Graph, info: GroupInfo, rblock: int) -> tuple[tuple[int, ...], int]:
    """(load passes, dots) of a pointwise, reduction, scan or scatter kernel of ``rblock``
    columns a step: every load read once unless the row is looped."""
    if not info.reduces or rblock >= info.rnumel:
        return (1,) * len(info.loads), 0
    reads = looped_reads(graph, info)
    return reads.passes(), reads.dots


def streamed_loads(graph: Graph, info: GroupInfo) -> frozenset[int]:
    """The loaded nodes a looped kernel reads inside exactly one column loop and nowhere else
    (streamed through the cache: what later loops re-read stays in L2)."""
    regions = looped_reads(graph, info).regions
    return frozenset(
        i for i in info.loads if i not in regions[0] and sum(i in r for r in regions[1:]) == 1
    )
