"""Split variances: one pass over ``x`` for a split ``sum((x - mean(x))^2)`` (an IR -> IR step of
``ir/split.py``).

A variance is captured as two reductions over the same ``x``: ``m = mean(x)`` (the moment mean
of ``capture/decompositions.py``: ``where(|s| == inf, m', clamp(m'))``, ``m' = (h0 + s / n) *
2^k``, ``s = sum(x * 2^-k - h0)``, ``h0`` a value of the row (its maximum) times 2^-k; or a plain
``mean``), then ``s2 = sum((x - m)^2)`` (``mul(d, d)`` or ``pow_scalar(d, 2)``). Split as two independent reductions, the second needs the *global* mean,
so each stage reads all of ``x``: on an H200, ``column_stats`` of a bf16 (65536, 1024) matrix
took two passes over x (58 + 49 us) where one read is 31.6 us. This step splits the pair as
chunk statistics combined by the parallel-variance formula (Chan et al.)::

    per chunk j (n_c = R / k elements):  mean_j = mean(x_j)        M2_j = sum((x_j - mean_j)^2)
    combined:  mean = mean(mean_j)  (equal chunks)
               M2   = sum(M2_j + n_c * (mean_j - mean)^2)

Both chunk reductions read the same chunk, the second after the first (one kernel, as the
unsplit variance is one kernel: its second loop re-reads a chunk small enough to stay in cache);
the combine reads only the ``k`` partials. ``s2`` is replaced by ``M2`` and every node holding
the mean of the same ``x`` over the same dims (the moment mean, a ``mean`` op such as
``column_stats``'s own ``x.mean(0)``) by the combined mean, so what follows (the division by n
or n - 1, sqrt, a normalization) is unchanged. Chan's combine has no cancellation: a large mean
(``1000 + randn``) costs it nothing, unlike ``E[x^2] - E[x]^2``.

Means are moment means at both levels (finite wherever the true mean is). Everything is
computed in float32 (float64 for float64 values) from ``x`` with widening casts stripped, and
cast once to each replaced node's dtype: a 16-bit variance is rounded once, as eager's.

A sum of ``((x - m) * c)^2`` for a constant ``c`` (the var decomposition's overflow rescue,
``c = 2^-k``) is the same statistic scaled: it takes one more chunk M2, of ``(x_j - mean_j) *
c``, in the same pass, combined with ``n_c * ((mean_j - mean) * c)^2`` (unsplit it was a second
pass over x: on the H100's KernelBench L2_52 that pass was the longest kernel, 6.1 of 16 ms).

The chunks are read in the decision's order (``SplitDecision.order``, ``ir/split_layout.py``:
memory's order where x is kept in another layout, a channels-last convolution's result read
along its channels) and the chunk statistics are permuted back before the combine.

Only exact matches are rewritten (``x`` the sub's full-shaped operand, the mean over the same
dims of the same ``x`` up to widening casts, broadcast through views that only add or drop unit
dims, and a sum the policy splits); anything else is split as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from autofuse.ir.graph import FLOAT_DTYPES, Graph, Node, numel, scalar_const
from autofuse.ir.split_chunks import SplitDecision, chunk_view
from autofuse.ir.split_chunks import new_node as _node

__all__ = ["VarianceGroup", "VarianceStats", "annotate", "find_variances", "prune"]

_UNIT_VIEWS = frozenset({"reshape", "squeeze", "unsqueeze"})
_RANK = {"bfloat16": 0, "float16": 0, "float32": 1, "float64": 2}


@dataclass(frozen=True)
class VarianceGroup:
    """Variances of one ``x`` over one set of dims, computed from one set of chunk statistics.

    ``source``: ``x`` with widening float casts stripped (the chunks read it); ``sums``: the
    ``sum(((x - mean) * c)^2)`` nodes (replaced by M2 of that scale), ``scales`` their ``c``
    (1.0 for ``sum((x - mean)^2)``; ``2^-k`` for the overflow rescue of the var decomposition,
    computed from the same chunks rather than by a second pass over x); ``means``: the nodes
    that hold the mean of ``x`` over ``dims`` (replaced by the combined mean); ``dtype``: the
    statistics' dtype."""

    source: int
    dims: tuple[int, ...]
    sums: tuple[int, ...]
    means: tuple[int, ...]
    dtype: str
    scales: tuple[float, ...] = ()


def _dims(node: Node, rank: int) -> tuple[int, ...]:
    return tuple(sorted(d % max(rank, 1) for d in node.attr("dims") or ()))


def _const(graph: Graph, i: int) -> float | None:
    return scalar_const(graph[i])


def _widened(graph: Graph, i: int) -> int:
    """``i`` with float casts that lose nothing stripped (bf16 -> f32, f32 -> f64, ...)."""
    while graph[i].op == "cast":
        src = graph[graph[i].inputs[0]]
        a, b = _RANK.get(src.dtype), _RANK.get(graph[i].dtype)
        if a is None or b is None or not (b > a or src.dtype == graph[i].dtype):
            return i
        i = graph[i].inputs[0]
    return i


def _moment_sum(graph: Graph, i: int) -> int | None:
    """The ``s = sum(x * 2^-k - h0)`` of the moment mean ``where(|s| == inf, m, clamp(m))``,
    ``m = (h0 + s / n) * 2^k``, that node ``i`` is (None if it is not one). ``h0`` is a value
    per row (``x0 * 2^-k``, a value of the row scaled): ``m`` is the mean of ``x`` for any
    such ``h0``, so only its shape is checked."""
    w = graph[i]
    if w.op != "where":
        return None
    c, a, b = (graph[j] for j in w.inputs)
    if c.op != "eq" or a.op != "mul" or b.op != "clamp" or b.inputs[0] != w.inputs[1]:
        return None
    absn, shifted, c2 = graph[c.inputs[0]], graph[a.inputs[0]], _const(graph, a.inputs[1])
    if absn.op != "abs" or _const(graph, c.inputs[1]) != math.inf or shifted.op != "add":
        return None
    h0, q = shifted.inputs
    s = absn.inputs[0]
    if graph[q].op != "div" or graph[q].inputs[0] != s or graph[s].op != "sum":
        return None
    d = graph[graph[s].inputs[0]]
    if d.op != "sub" or d.inputs[1] != h0 or graph[d.inputs[0]].op != "mul":
        return None
    t = graph[d.inputs[0]]
    c1, n_c = _const(graph, t.inputs[1]), _const(graph, graph[q].inputs[1])
    n = numel(t.shape[j] for j in _dims(graph[s], len(t.shape)))
    if c1 is None or c2 is None or graph[t.inputs[0]].shape != t.shape or n_c != n:
        return None
    if graph[h0].shape != graph[s].shape:  # a value per row (kept dims), as the sum
        return None
    return s if math.isclose(c1 * c2, 1.0, rel_tol=1e-6) else None


def _mean_of(graph: Graph, i: int) -> tuple[int, tuple[int, ...]] | None:
    """(x, dims) when node ``i`` is the mean of x over dims (a mean op or a moment mean)."""
    n = graph[i]
    if n.op == "mean" and n.dtype in FLOAT_DTYPES:
        x = n.inputs[0]
        return x, _dims(n, len(graph[x].shape))
    s = _moment_sum(graph, i)
    if s is None:
        return None
    x = graph[graph[graph[s].inputs[0]].inputs[0]].inputs[0]
    return x, _dims(graph[s], len(graph[x].shape))


def _non_unit(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(s for s in shape if s != 1)


def _mean_core(graph: Graph, b: int, shape: tuple[int, ...], dims: tuple[int, ...]) -> int | None:
    """The node whose value the sub's operand ``b`` broadcasts over ``shape`` as a mean over
    ``dims`` (through views that add or drop unit dims, an expand and float casts)."""
    keep = tuple(1 if j in dims else s for j, s in enumerate(shape))

    def aligned(sh: tuple[int, ...]) -> bool:
        return len(sh) <= len(shape) and (1,) * (len(shape) - len(sh)) + sh == keep

    if not aligned(graph[b].shape):
        if graph[b].op != "expand" or not aligned(graph[graph[b].inputs[0]].shape):
            return None
        b = graph[b].inputs[0]
    while True:
        n = graph[b]
        src = graph[n.inputs[0]] if n.inputs else None
        if n.op in _UNIT_VIEWS and _non_unit(src.shape) == _non_unit(n.shape):
            b = n.inputs[0]
        elif n.op == "cast" and src.dtype in FLOAT_DTYPES and n.dtype in FLOAT_DTYPES:
            b = n.inputs[0]
        else:
            return b


def _square_of(graph: Graph, f: Node) -> tuple[int, float] | None:
    """(d, c) when ``f`` is ``(d * c)^2`` for a scalar constant ``c`` (1.0: ``d^2``)."""
    if f.op == "mul" and f.inputs[0] == f.inputs[1]:
        d = f.inputs[0]
    elif f.op == "pow_scalar" and f.attr("exponent") == 2:
        d = f.inputs[0]
    else:
        return None
    m = graph[d]
    c = _const(graph, m.inputs[1]) if m.op == "mul" else None
    if c is not None and math.isfinite(c) and c != 0.0 and m.dtype in FLOAT_DTYPES:
        return m.inputs[0], c
    return d, 1.0


def find_variances(graph: Graph, decisions: dict[int, SplitDecision]) -> tuple[VarianceGroup, ...]:
    """The variance patterns of ``graph`` whose sum ``decisions`` split, grouped by (x, dims)."""
    found: dict[tuple[int, tuple[int, ...]], tuple[list[int], set[int], set[str]]] = {}
    for i, n in enumerate(graph.nodes):
        dec = decisions.get(i)
        if n.op != "sum" or dec is None or dec.k < 2:
            continue
        sq = _square_of(graph, graph[n.inputs[0]])
        d, scale = sq if sq is not None else (None, 1.0)
        if d is None or graph[d].op != "sub" or graph[d].shape != graph[n.inputs[0]].shape:
            continue
        a, b = graph[d].inputs
        shape = graph[a].shape
        if shape != graph[d].shape or graph[a].dtype not in FLOAT_DTYPES:
            continue
        dims = _dims(n, len(shape))
        core = _mean_core(graph, b, shape, dims)
        mean = None if core is None else _mean_of(graph, core)
        if mean is None or mean[1] != dims or graph[mean[0]].shape != shape:
            continue
        source = _widened(graph, a)
        if _widened(graph, mean[0]) != source or graph[source].dtype not in FLOAT_DTYPES:
            continue
        sums, cores, dtypes = found.setdefault((source, dims), ([], set(), set()))
        sums.append((i, scale))
        cores.add(core)
        dtypes.update((graph[a].dtype, graph[source].dtype))
    if not found:
        return ()
    for j in range(len(graph)):  # every other mean of the same x over the same dims
        mean = _mean_of(graph, j)
        if mean is not None and (_widened(graph, mean[0]), mean[1]) in found:
            found[(_widened(graph, mean[0]), mean[1])][1].add(j)
    return tuple(
        VarianceGroup(
            source,
            dims,
            tuple(i for i, _ in sums),
            tuple(sorted(cores)),
            "float64" if "float64" in dtypes else "float32",
            tuple(c for _, c in sums),
        )
        for (source, dims), (sums, cores, dtypes) in sorted(found.items())
    )


def annotate(
    graph: Graph, decisions: dict[int, SplitDecision], groups: tuple[VarianceGroup, ...]
) -> dict[int, SplitDecision]:
    """``decisions`` with the variance rewrite's reasons: each replaced sum (role "m2"), each
    replaced mean reduction and each moment mean's sum (role "mean": dead after the rewrite
    unless something else reads it)."""
    out = dict(decisions)
    for g in groups:
        dec = decisions[g.sums[0]]
        first = graph[g.sums[0]].name or f"%{g.sums[0]}"
        for s in g.sums:
            out[s] = replace(
                dec,
                node=s,
                role="m2",
                reason=f"{dec.reason}; variance of %{g.source} over {g.dims}: per-chunk mean "
                f"and M2 in one pass over x, combined by Chan's formula",
            )
        for m in g.means:
            s = _moment_sum(graph, m)
            i = m if s is None else s
            if i in decisions:
                out[i] = replace(
                    decisions[i],
                    role="mean",
                    reason=f"{decisions[i].reason}; the mean of %{g.source} over {g.dims} "
                    f"is the combined mean of variance {first}'s chunks",
                )
    return out


class VarianceStats:
    """Appends a group's chunk statistics and their combine (once, on first use) and the nodes
    that replace the group's sums and means. ``add`` appends a node and returns its index;
    ``remap`` maps the old graph's nodes to the new one's."""

    def __init__(self, graph: Graph, group: VarianceGroup, dec: SplitDecision, add) -> None:
        self.graph, self.group, self.dec, self.add = graph, group, dec, add
        self.stats: tuple[int, dict[float, int]] | None = None

    def _c(self, value: float, name: str) -> int:
        return self.add(_node("const", (), (), self.group.dtype, name, value=value))

    def _moment(self, x: int, shape, dims, n: int, name: str) -> int:
        """The moment mean of ``x`` (shaped ``shape``) over ``dims`` (kept), as captured: the
        row's first element plus the mean of the differences, exact on a constant row."""
        dt, add = self.group.dtype, self.add
        keep = tuple(1 if j in dims else s for j, s in enumerate(shape))
        k = math.ceil(math.log2(n)) + 1
        x0, cut = x, list(shape)
        for d in dims:
            cut[d] = 1
            x0 = add(_node("slice", (x0,), cut, dt, f"{name}.first", dim=d, start=0, step=1))
        inf = add(_node("const", (), (), "float32", f"{name}.inf", value=math.inf))
        a0 = add(_node("abs", (x0,), keep, dt, f"{name}.abs0"))
        big = add(_node("eq", (a0, inf), keep, "bool", f"{name}.inf0"))
        x0 = add(_node("where", (big, self._c(0.0, f"{name}.zero"), x0), keep, dt, f"{name}.x0"))
        h0 = add(_node("mul", (x0, self._c(2.0**-k, f"{name}.c0")), keep, dt, f"{name}.h0"))
        t = add(_node("mul", (x, self._c(2.0**-k, f"{name}.c1")), shape, dt, f"{name}.scaled"))
        t = add(_node("sub", (t, h0), shape, dt, f"{name}.shifted"))
        s = add(_node("sum", (t,), keep, dt, f"{name}.sum", dims=tuple(dims), keepdim=True))
        q = add(_node("div", (s, self._c(float(n), f"{name}.n")), keep, dt, f"{name}.div"))
        m = add(_node("add", (h0, q), keep, dt, f"{name}.add"))
        m = add(_node("mul", (m, self._c(2.0**k, f"{name}.c2")), keep, dt, f"{name}.mul"))
        a = add(_node("abs", (s,), keep, dt, f"{name}.abs"))
        e = add(_node("eq", (a, inf), keep, "bool", f"{name}.eq"))
        fi = torch.finfo(getattr(torch, dt))
        c = add(_node("clamp", (m,), keep, dt, f"{name}.clamp", lo=fi.min, hi=fi.max))
        return add(_node("where", (e, m, c), keep, dt, name))

    def _m2(self, v: int, mj: int, mq: int, mean: int, scale: float, tag: str) -> int:
        """M2 of ``(x - mean) * scale`` over the group's dims: the chunks' own (one more sum
        in the chunk moments' pass over ``v``) combined with ``n_c * ((mean_j - mean) *
        scale)^2`` by Chan's formula."""
        g, dec, add, dt = self.group, self.dec, self.add, self.group.dtype
        shape = self.graph[g.source].shape
        chunks = chunk_view(shape, g.dims, dec)
        cut, part_dims, q_shape = chunks.shape, chunks.dims, chunks.q_shape
        n_c = numel(cut[j] for j in part_dims)
        cut_keep = tuple(1 if j in part_dims else s for j, s in enumerate(cut))
        dj = add(_node("sub", (v, mj), cut, dt, f"{tag}.chunk_dev"))
        dm = add(_node("sub", (mq, mean), q_shape, dt, f"{tag}.mean_dev"))
        if scale != 1.0:
            dj = add(_node("mul", (dj, self._c(scale, f"{tag}.c")), cut, dt, f"{tag}.chunk_scaled"))
            dm = add(
                _node("mul", (dm, self._c(scale, f"{tag}.cm")), q_shape, dt, f"{tag}.mean_scaled")
            )
        sq = add(_node("mul", (dj, dj), cut, dt, f"{tag}.chunk_sq"))
        m2j = add(
            _node("sum", (sq,), cut_keep, dt, f"{tag}.chunk_m2", dims=part_dims, keepdim=True)
        )
        m2q = chunks.back(add, m2j, dt, f"{tag}.chunk_m2s", keepdim=True)
        dm2 = add(_node("mul", (dm, dm), q_shape, dt, f"{tag}.mean_sq"))
        w = add(_node("mul", (dm2, self._c(float(n_c), f"{tag}.n_c")), q_shape, dt, f"{tag}.w"))
        t = add(_node("add", (m2q, w), q_shape, dt, f"{tag}.chan"))
        keep = tuple(1 if j in g.dims else s for j, s in enumerate(shape))
        return add(_node("sum", (t,), keep, dt, f"{tag}.m2", dims=g.dims, keepdim=True))

    def _emit(self, remap: dict[int, int]) -> tuple[int, dict[float, int]]:
        """The combined mean and, per scale of the group's sums, the combined M2."""
        g, dec, add, dt = self.group, self.dec, self.add, self.group.dtype
        name = self.graph[g.sums[0]].name or "var"
        x = remap[g.source]
        shape = self.graph[g.source].shape
        if add.nodes[x].dtype != dt:
            x = add(_node("cast", (x,), shape, dt, f"{name}.{dt}", dtype=dt))
        chunks = chunk_view(shape, g.dims, dec)
        n_c = numel(chunks.shape[j] for j in chunks.dims)
        v = chunks.view(add, x, dt, name)
        mj = self._moment(v, chunks.shape, chunks.dims, n_c, f"{name}.chunk_mean")
        mq = chunks.back(add, mj, dt, f"{name}.chunk_means", keepdim=True)
        mean = self._moment(mq, chunks.q_shape, g.dims, dec.k, f"{name}.mean")
        m2s: dict[float, int] = {}
        for c in sorted(set(g.scales or (1.0,)), key=lambda c: (c != 1.0, c)):
            tag = name if c == 1.0 else f"{name}.scaled{len(m2s)}"
            m2s[c] = self._m2(v, mj, mq, mean, c, tag)
        return mean, m2s

    def replace(self, i: int, remap: dict[int, int]) -> int:
        """The node that replaces node ``i`` (one of the group's sums or means)."""
        if self.stats is None:
            self.stats = self._emit(remap)
        node = self.graph[i]
        g = self.group
        if i in g.sums:
            v = self.stats[1][g.scales[g.sums.index(i)] if g.scales else 1.0]
        else:
            v = self.stats[0]
        if node.dtype != self.group.dtype:
            shape = self.add.nodes[v].shape
            v = self.add(
                _node("cast", (v,), shape, node.dtype, f"{node.name}.cast", dtype=node.dtype)
            )
        if self.add.nodes[v].shape != node.shape:
            v = self.add(
                _node(
                    "reshape", (v,), node.shape, node.dtype, f"{node.name}.view", shape=node.shape
                )
            )
        return v


def prune(graph: Graph) -> Graph:
    """``graph`` without the nodes no output depends on (its inputs are kept)."""
    live = set(graph.outputs) | set(graph.inputs)
    for i in range(len(graph) - 1, -1, -1):
        if i in live:
            live.update(graph[i].inputs)
    if len(live) == len(graph):
        return graph
    remap: dict[int, int] = {}
    nodes: list[Node] = []
    for i, node in enumerate(graph.nodes):
        if i in live:
            remap[i] = len(nodes)
            nodes.append(replace(node, inputs=tuple(remap[j] for j in node.inputs)))
    return Graph(
        tuple(nodes), tuple(remap[i] for i in graph.inputs), tuple(remap[o] for o in graph.outputs)
    )
