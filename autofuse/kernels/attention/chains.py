"""The groups the attention kinds propose to the partitioner: two chained matmuls with every
member between them (attention: ``softmax(mask(q @ k^T)) @ v``), and the chains whose cores
share a node joined (the backward: recomputed scores and dP feeding dQ, dK and dV).

Pairwise merging reaches such a group only through groups no kind takes (a matmul and half a
softmax), so the partitioner's repair tries these first. ``reach[n]``: the bitset of the
nodes reachable from node ``n``.
"""

from __future__ import annotations

from autofuse.ir.graph import Graph


def chain_groups(
    graph: Graph, members: frozenset[int], reach: dict[int, int]
) -> list[frozenset[int]]:
    """Candidate groups of two chained matmuls with every member between them, the pointwise
    members read only by that path or by each other (a mask, see :func:`mask_feeders`) and
    clones in front of their operands; the joined chains first."""
    mms = sorted(m for m in members if graph[m].kind == "matmul")
    pairs = []
    for a in mms:
        for b in mms:
            if a == b or not reach[a] >> b & 1:
                continue
            if any(reach[a] >> m & 1 and reach[m] >> b & 1 for m in mms):
                continue  # another matmul between them: not one attention
            core = {n for n in members if reach[a] >> n & 1 and reach[n] >> b & 1}
            pairs.append(({a}, {b}, core))
    out = [chain(graph, members, reach, *p) for p in joined(pairs)]
    return out + [chain(graph, members, reach, *p) for p in pairs]


def joined(pairs: list) -> list:
    """The chains whose cores share a node, joined (matmuls feeding matmuls through common
    ops: an attention's backward, its recomputed scores and dP feeding dQ, dK and dV);
    only joins of more than one chain (the chains themselves are candidates anyway)."""
    groups = [(set(a), set(b), set(core), 1) for a, b, core in pairs if core]
    merged = True
    while merged:
        merged = False
        for x in range(len(groups)):
            for y in range(x + 1, len(groups)):
                if groups[x][2] & groups[y][2]:
                    ax, bx, cx, nx = groups[x]
                    ay, by, cy, ny = groups.pop(y)
                    groups[x] = (ax | ay, bx | by, cx | cy, nx + ny)
                    merged = True
                    break
            if merged:
                break
    return [(a, b, core) for a, b, core, n in groups if n > 1]


def chain(
    graph: Graph,
    members: frozenset[int],
    reach: dict[int, int],
    srcs: set[int],
    sinks: set[int],
    core: set[int],
) -> frozenset[int]:
    """The candidate group of matmuls ``srcs`` feeding ``sinks`` through ``core`` (with their
    operand clones and mask feeders)."""
    g = graph
    inner = 0
    for n in core:
        inner |= 1 << n
    mms = srcs | sinks
    seed = core | mms | operand_clones(graph, members, tuple(mms), core)
    operands = {g.base_of(j) for b in sinks for j in g[b].inputs} - core
    feeders = {
        n
        for n in members - seed
        if g[n].kind == "pointwise"
        and reach[n] & inner
        and not any(reach[n] >> a & 1 for a in srcs)
        and n not in operands
        and not any(reach[n] >> j & 1 for j in operands)
    }
    return frozenset(seed | mask_feeders(graph, seed, feeders))


def mask_feeders(graph: Graph, seed: set[int], feeders: set[int]) -> set[int]:
    """The ``feeders`` (pointwise ops feeding the scores) read only inside the chain: a
    feeder that another node reads (a scan of the padding mask's positions, the next
    layer's attention, an output) stays outside, its value loaded as a tensor, and so do
    the feeders it reads (else a path would leave the group and come back into it)."""
    g = graph
    feeders = feeders - {g.base_of(o) for o in g.outputs}
    while True:
        keep = seed | feeders
        drop = {n for n in feeders if any(u not in keep for u in g.compute_users[n])}
        if not drop:
            return feeders
        feeders -= drop


def operand_clones(
    graph: Graph, members: frozenset[int], mms: tuple[int, ...], core: set[int]
) -> set[int]:
    """Clones (an expand + reshape of shared K / V heads) in front of the matmuls' operands,
    those read inside the chain alone (by the matmuls or the ops of ``core``: a clone of
    dO that the backward's ``rowsum(dO * O)`` also reads stays out, else that path would
    leave the group and come back)."""
    g, out = graph, set()
    for mm in mms:
        for j in g[mm].inputs:
            i = g.base_of(j)
            while i in members and g[i].op == "copy":
                if not set(g.compute_users[i]) <= set(mms) | core | out:
                    break
                out.add(i)
                i = g.base_of(g[i].inputs[0])
    return out
