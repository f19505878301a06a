"""Pointwise values computed again where they are read, not written and read back (an IR -> IR
pass).

A split reduction's first stage reads its input through a chunked view, so it is a kernel of
its own; the pointwise ops that read the same input at full size (the normalization after a
split variance) form another. A pointwise value both read (``mish(conv + bias)`` before a
training BatchNorm, ``swish`` before GroupNorm) is then written by the first kernel and read
back by the second: on KernelBench L2_52 / L2_60 that write is a whole activation (0.5 / 1 GB
in fp32), where the second kernel could read the value's own inputs instead, as torch.compile's
do. This pass gives the full-size pointwise readers a copy of the value's pointwise cone (the
ops from the materialized buffers it reads up to it), so the partitioner fuses the copy into
their kernel and the first kernel writes nothing.

Only where it cannot cost a read: the cone reads at most one buffer of the value's size (the
rest small: biases, per-channel scales), is pointwise throughout (views are shared, not
copied), has at most :data:`MAX_CONE` ops, and the value is not a graph output (returned or
saved for backward) and keeps no layout of its own (``eager_strides``).
"""

from __future__ import annotations

from dataclasses import replace

from autofuse.ir.graph import Graph, Node, make_attrs, numel

__all__ = ["MAX_CONE", "recompute_for_chunk_readers"]

MAX_CONE = 40  # pointwise ops copied at most, per value


def _reads(graph: Graph, i: int, path: tuple[int, ...] = ()):
    """(views, reader) for each op reading value ``i`` directly or through views of all its
    elements (``views`` the chain from ``i``, in order). A cast of the whole value counts as a
    view here: a 16-bit split sum's chunks read a float32 cast of it (``ir/split.py``), so a
    bf16 ``mish`` before BatchNorm is read by the chunks through that cast and by the
    normalization as it is."""
    for u in graph.users[i]:
        node = graph[u]
        if _passes(node, graph[i]):
            yield from _reads(graph, u, (*path, u))
        elif node.kind != "view":
            yield path, u


def _passes(node: Node, src: Node) -> bool:
    """Whether ``node`` reading ``src`` is followed to its readers: a view of all its elements
    or a cast of the whole value."""
    if node.kind == "view":
        return numel(node.shape) == numel(src.shape)
    return node.op == "cast" and node.shape == src.shape


def _cone(graph: Graph, i: int) -> list[int] | None:
    """The pointwise ops value ``i`` is computed from (itself included, in graph order), or
    None where they read more than one buffer of its size or are too many."""
    size, seen, big, stack = numel(graph[i].shape), set(), set(), [i]
    while stack:
        j = stack.pop()
        if j in seen:
            continue
        seen.add(j)
        for k in graph[j].inputs:
            if graph[k].kind == "pointwise":
                stack.append(k)
            elif graph[k].op not in ("const", "iota") and 2 * numel(graph[k].shape) >= size:
                big.add(graph.base_of(k))
        if len(seen) > MAX_CONE or len(big) > 1:
            return None
    return sorted(seen)


def _candidates(graph: Graph) -> dict[int, tuple[list[int], dict]]:
    """Value -> (its cone, {(pointwise reader, the input it reads): the views between}) for
    the readers that would read it back: those of every domain (the shape read: a split reduction's chunks,
    GroupNorm's groups, the value's own) but the first in graph order, which computes it."""
    outs = {graph.base_of(o) for o in graph.outputs}
    found: dict[int, tuple[list[int], dict]] = {}
    for i, node in enumerate(graph.nodes):
        if node.kind != "pointwise" or i in outs or node.attr("eager_strides") is not None:
            continue
        if node.op in ("const", "iota"):  # rendered where read: never written
            continue
        by_domain: dict[tuple[int, ...], list[tuple[tuple[int, ...], int]]] = {}
        for path, u in sorted(_reads(graph, i), key=lambda r: r[1]):
            if graph[u].kind in ("pointwise", "reduction"):
                by_domain.setdefault(_domain(graph, i, path), []).append((path, u))
        domains = list(by_domain.items())
        if len(domains) < 2 or not _chunked(graph, i, *domains[0]):
            continue
        later = [r for _, reads in domains[1:] for r in reads]
        full = {(u, p[-1] if p else i): p for p, u in later if graph[u].kind == "pointwise"}
        cone = _cone(graph, i) if full else None
        if cone is not None:
            found[i] = (cone, full)
    return found


def _domain(graph: Graph, i: int, path: tuple[int, ...]) -> tuple:
    """The domain a reader of value ``i`` through views ``path`` reads it in: the shape read,
    and whether through a split's chunked view (``ir/split_chunks.py``: its own kernel even
    where its shape is one the value is read in elsewhere)."""
    shape = graph[path[-1] if path else i].shape
    return shape, any(graph[p].attr("chunks") for p in path)


def _chunked(graph: Graph, i: int, domain: tuple, reads: list) -> bool:
    """Whether the readers of value ``i`` in ``domain`` (the first) read it reshaped (another
    shape than its own, or through a split's chunked view) and feed a reduction within a few
    pointwise ops: a split reduction's chunks, a kernel of their own."""
    shape, chunks = domain
    if shape == graph[i].shape and not chunks:
        return False
    frontier, seen = [u for _, u in reads], set()
    for _ in range(MAX_CONE):
        nxt = []
        for u in frontier:
            if graph[u].kind == "reduction":
                return True
            if u not in seen and graph[u].kind in ("pointwise", "view"):
                seen.add(u)
                nxt.extend(graph.users[u])
        frontier = nxt
    return False


def recompute_for_chunk_readers(graph: Graph) -> Graph:
    """``graph`` with each pointwise value that a split reduction's chunks and full-size
    pointwise ops both read computed again for the latter (the module docstring says where);
    ``graph`` itself where there is none."""
    found = _candidates(graph)
    if not found:
        return graph
    # a reader two values would fix (a cast that is itself a candidate, read through: GroupNorm's
    # bf16 input) takes the earlier value's copy, whose cone holds the later one
    fixes: dict[tuple[int, int], tuple[int, tuple[int, ...]]] = {}
    for value in sorted(found):
        for key, views in found[value][1].items():
            fixes.setdefault(key, (value, views))
    used = {value for value, _ in fixes.values()}
    found = {value: found[value] for value in used}
    nodes: list[Node] = []
    remap: dict[int, int] = {}
    again: dict[int, int] = {}  # value -> its copy, read by the full-size readers
    for i, node in enumerate(graph.nodes):
        ins = []
        for j in node.inputs:
            fix = fixes.get((i, j))
            ins.append(
                remap[j] if fix is None else _copy_views(graph, again[fix[0]], fix[1], nodes)
            )
        nodes.append(replace(node, inputs=tuple(ins)))
        remap[i] = len(nodes) - 1
        if i in found:
            again[i] = _copy_cone(graph, found[i][0], i, remap, nodes)
    return Graph(tuple(nodes), tuple(remap[i] for i in graph.inputs),
                 tuple(remap[o] for o in graph.outputs))  # fmt: skip


def _copied(node: Node, inputs: tuple[int, ...]) -> Node:
    attrs = make_attrs(**dict(node.attrs), recomputed=True)  # never deduplicated back
    return replace(node, inputs=inputs, attrs=attrs, name=f"{node.name}.again")


def _copy_views(graph: Graph, base: int, views: tuple[int, ...], nodes: list[Node]) -> int:
    """Append copies of ``views`` applied to ``base``; the index of the last (``base`` itself
    where there are none)."""
    for v in views:
        nodes.append(_copied(graph[v], (base, *graph[v].inputs[1:])))
        base = len(nodes) - 1
    return base


def _copy_cone(
    graph: Graph, cone: list[int], i: int, remap: dict[int, int], nodes: list[Node]
) -> int:
    """Append a copy of value ``i``'s pointwise ``cone`` (reading the originals'
    non-pointwise inputs); the index of the copy of ``i``."""
    copied: dict[int, int] = {}
    for j in cone:
        src = graph[j]
        ins = tuple(copied.get(k, remap[k]) for k in src.inputs)
        nodes.append(_copied(src, ins))
        copied[j] = len(nodes) - 1
    return copied[i]
