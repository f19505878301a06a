"""A max pool after a non-decreasing pointwise chain pools the chain's input instead (an IR ->
IR pass): ``max(f(x_1), ..., f(x_k)) == f(max(x_1, ..., x_k))`` for every ``f`` that never
decreases, so ``f`` is computed once per output instead of once per window element.

``capture/pooling.py`` writes a max pool as strided slices of its input (one per window
offset) folded by ``where(v > best | isnan(v), v, best)``. Where that input is
``f(u)`` for a chain of ops each non-decreasing in one operand (``tanh``, ``sigmoid``,
``relu``, ``clamp``, ``exp``; ``+`` / ``-`` of a value the window does not vary over: a
per-channel bias; ``*`` / ``/`` by a positive constant; widening float casts), the slices are
taken of ``u`` and ``f`` applied to the pooled result. KernelBench L2_82 (tanh, scale, bias,
4 x 4 max-pool of a [128, 64, 254, 254] convolution): the epilogue computed tanh on 2.1 G
elements, 2070 us, about a third of its bytes' time at the H100's bandwidth.

Exact for the values (a NaN in a window is a NaN of ``u`` there, ``f(NaN)`` NaN); the pool's
indices are another matter (``f`` may tie where ``u`` does not: tanh saturates), so only pools
whose indices nothing reads are rewritten, as is every inference pool; padded windows (the
pad value is ``f``'s) are left alone.
"""

from __future__ import annotations

from dataclasses import replace

from autofuse.ir.graph import FLOAT_DTYPES, Graph, Node, contiguous_strides, scalar_const
from autofuse.ir.split_variance import prune

__all__ = ["pool_before_monotone"]

_RISING = frozenset({"tanh", "sigmoid", "relu", "clamp", "exp"})  # unary, non-decreasing
_SHIFTS = frozenset({"add", "sub"})  # by a value constant over the window
_SCALES = frozenset({"mul", "div"})  # by a positive constant


def _chain_step(graph: Graph, w: int) -> tuple[int, int] | None:
    """(the window view, the running best) where node ``w`` is one fold of a max pool,
    ``where(v > best | isnan(v), v, best)``; None otherwise."""
    node = graph[w]
    if node.op != "where":
        return None
    take, v, best = node.inputs
    t = graph[take]
    if t.op != "bitwise_or":
        return None
    gt, nan = (graph[j] for j in t.inputs)
    if gt.op != "gt" or gt.inputs != (v, best) or nan.op != "isnan" or nan.inputs != (v,):
        return None
    return v, best


def _windows(graph: Graph, folds: list[int]) -> list[int] | None:
    """The window views a max pool of ``folds`` (last first) folds, first to last (None: not
    a pool)."""
    if not folds:
        return None
    first = graph[folds[-1]].inputs[2]  # the running best the first fold starts from
    if graph[first].kind != "view":
        return None
    return [first, *(graph[f].inputs[1] for f in reversed(folds))]  # where(take, v, best)


def _slices_of(graph: Graph, v: int) -> tuple[int, list[int]] | None:
    """(base, the slice views from it to ``v``, outermost first) where ``v`` is strided
    slices of one value."""
    chain = []
    while graph[v].op == "slice":
        chain.append(v)
        v = graph[v].inputs[0]
    return (v, chain[::-1]) if chain else None


def _steady(graph: Graph, j: int, rank: int, window_dims: set[int]) -> bool:
    """Whether operand ``j`` (broadcast to ``rank`` dims) is constant over the window dims: a
    scalar, or of size 1 there (a per-channel bias)."""
    shape = graph[j].shape
    pad = rank - len(shape)
    return all(d < pad or shape[d - pad] == 1 for d in window_dims)


def _positive_const(graph: Graph, j: int) -> bool:
    c = scalar_const(graph[j])
    return c is not None and c > 0


def _main_operand(graph: Graph, i: int, dims: set[int]) -> int | None:
    """The operand op ``i`` never decreases in while the others stay constant over the
    window (``dims``); None where it is not such an op."""
    n, rank = graph[i], len(graph[i].shape)
    ins = n.inputs
    if n.op in _RISING and len(ins) == 1:
        return ins[0]
    if n.op == "cast" and n.dtype in FLOAT_DTYPES and graph[ins[0]].dtype in FLOAT_DTYPES:
        return ins[0]
    if n.op in _SHIFTS and len(ins) == 2:
        if _steady(graph, ins[1], rank, dims):
            return ins[0]
        if n.op == "add" and _steady(graph, ins[0], rank, dims):
            return ins[1]
    if n.op in _SCALES and len(ins) == 2:
        if _positive_const(graph, ins[1]):
            return ins[0]
        if n.op == "mul" and _positive_const(graph, ins[0]):
            return ins[1]
    return None


def _rising_cone(graph: Graph, x: int, dims: set[int]) -> tuple[int, list[int]] | None:
    """(u, the ops from u up to ``x``) where ``x`` is a non-decreasing chain of ``u`` of
    ``x``'s shape; None where the first op is none."""
    chain, i = [], x
    while graph[i].kind == "pointwise":
        main = _main_operand(graph, i, dims)
        if main is None or graph[main].shape != graph[x].shape:
            break
        chain.append(i)
        i = main
    return (i, chain[::-1]) if chain else None


def _folds(graph: Graph, w: int) -> list[int]:
    """The folds of the max pool ending at ``w``, last first."""
    out = []
    while (step := _chain_step(graph, w)) is not None:
        out.append(w)
        w = step[1]
    return out


def _plan(graph: Graph, w: int) -> tuple[list[int], list[list[int]], int, list[int]] | None:
    """(the folds, last first; each window's slices from x; u; the cone ops) for a max pool
    ending at ``w`` that may pool u instead of x = f(u); None where it may not."""
    folds = _folds(graph, w)
    wins = _windows(graph, folds)
    if wins is None:
        return None
    found = [_slices_of(graph, v) for v in wins]
    if any(f is None for f in found) or len({f[0] for f in found}) != 1:
        return None
    x = found[0][0]
    dims = {graph[s].attr("dim") for _, chain in found for s in chain}
    cone = _rising_cone(graph, x, dims) if graph[x].kind == "pointwise" else None
    if cone is None:
        return None
    if any(set(graph.users[graph[f].inputs[0]]) != {f} for f in folds):
        return None  # the pool's indices read its comparisons
    return folds, [chain for _, chain in found], cone[0], cone[1]


def _emit(graph: Graph, w: int, plan, remap: dict[int, int], nodes: list[Node]) -> int:
    """Append the pool of u and f applied to it; the index of the result."""
    folds, windows, u, cone = plan
    dtype = graph[u].dtype

    def add(node: Node) -> int:
        nodes.append(node)
        return len(nodes) - 1

    views = []
    for chain in windows:
        cur = remap[u]
        for s in chain:
            cur = add(replace(graph[s], inputs=(cur,), dtype=dtype, name=f"{graph[s].name}.pre"))
        views.append(cur)
    best = views[0]
    for v, fold in zip(views[1:], reversed(folds)):
        take = graph[graph[fold].inputs[0]]
        gt, nan = (graph[k] for k in take.inputs)
        g = add(replace(gt, inputs=(v, best), name=f"{gt.name}.pre"))
        n = add(replace(nan, inputs=(v,), name=f"{nan.name}.pre"))
        t = add(replace(take, inputs=(g, n), name=f"{take.name}.pre"))
        best = add(
            replace(graph[fold], inputs=(t, v, best), dtype=dtype, name=f"{graph[fold].name}.pre")
        )
    shape = graph[w].shape
    prev = u
    for op in cone:
        node = graph[op]
        ins = tuple(best if k == prev else remap[k] for k in node.inputs)
        best = add(replace(node, inputs=ins, shape=shape, strides=contiguous_strides(shape),
                           name=f"{node.name}.pooled"))  # fmt: skip
        prev = op
    return best


def pool_before_monotone(graph: Graph) -> Graph:
    """``graph`` with each max pool of a non-decreasing chain ``f(u)`` taken of ``u``, ``f``
    applied to the pooled values (the module docstring says where); ``graph`` where none."""
    folds = [w for w in range(len(graph)) if _chain_step(graph, w) is not None]
    inner = {graph[w].inputs[2] for w in folds}  # a fold another one continues
    ends = [w for w in folds if w not in inner]
    plans = {w: p for w in ends if (p := _plan(graph, w)) is not None}
    if not plans:
        return graph
    nodes: list[Node] = []
    remap: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        nodes.append(replace(node, inputs=tuple(remap[j] for j in node.inputs)))
        remap[i] = len(nodes) - 1
        if i in plans:
            remap[i] = _emit(graph, i, plans[i], remap, nodes)
    out = Graph(tuple(nodes), tuple(remap[i] for i in graph.inputs),
                tuple(remap[o] for o in graph.outputs))  # fmt: skip
    return prune(out)
