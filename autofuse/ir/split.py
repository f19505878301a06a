"""Split reductions: a long reduction with few outputs becomes two reductions (an IR -> IR pass).

A reduction kernel launches one program per block of outputs and loops each program over the
reduced extent ``R``. With few outputs (``x.sum()``, ``x.mean(dim=0)`` of a tall matrix, the
global average pool of a small batch) most of the GPU idles while a handful of programs walk
millions of elements. Inductor splits such a reduction (``Reduction.num_splits``); this pass
does the same in the IR, before partitioning, so the partitioner, the kernel kinds, the search
and the cache all see two ordinary reductions::

    r = op(x, dims=D, keepdim)                      # R = prod(x.shape[d] for d in D)
    ->
    v  = reshape(x, ... (k, R / k) ...)             # the reduced dims, merged, cut in k chunks
    p  = op(v, dims=(chunk dim, ...), keepdim=False)  # k partials per output (k x more programs)
    q  = reshape(p, x.shape with k at D[0], 1 at the other reduced dims)   (only if |D| > 1)
    r' = op(q, dims=D, keepdim)                     # the same dims, now over k: r's shape

Where ``x`` is read in another layout than its logical order (a kept channels-last result),
``v`` is permuted into memory's order (``[N, C, k, L]`` read as ``[N, k, L, C]``) and ``p``
permuted back: the first stage's rows run along the innermost dim, its loads coalesced.
Views are index arithmetic in this IR, so ``v`` costs nothing; the first stage fuses with the
pointwise ops before ``r`` (the ``(x - mean)^2`` of a variance, through the reshape), the second
with the ops after it. A 16-bit float sum / mean / prod reads a float32 cast of its input, so the
``(k, ...)`` partials are float32 (the reduction kind accumulates 16-bit floats in float32 too)
and one cast back rounds the result once, as eager does. ``mean`` stays ``mean`` in both stages:
every chunk holds ``R / k`` elements, so the mean of the chunks' means is the mean.

The reduced dims are merged when they are adjacent (``(H, W)`` of NCHW, every dim of
``x.sum()``); otherwise the first reduced dim is cut or, where it has no divisor near the wanted
``k``, the last run of adjacent reduced dims, merged (BatchNorm's ``(N, [D,] H, W)``: N whole in
every chunk, the spatial run cut). ``k`` must divide the extent it cuts: an extent with no
divisor near the wanted ``k`` (a prime ``R``) is left alone, with its reason.

Few, long rows: BatchNorm's training statistics are one row per channel over N x spatial. On
an H100 (132 SMs), KernelBench level 2's L2_72 (ConvTranspose3d -> BatchNorm: 16 channels of
64 x 63^3 = 16M elements) ran one program per channel (XBLOCK=1, RBLOCK=4096: 16 programs on
132 SMs, ~85 % of the time, 0.23x torch.compile) because N = 64 has no divisor near the ~122
chunks wanted and only N was cut; the spatial run (250047 = 3^6 x 7^3) is cut in 147 now, 2352
programs. L2_52 (Conv2d -> BatchNorm, 128 channels of 64 x 126^2) splits in 8 along N. The rule
for an inner reduction: fewer rows than SMs (below, one program per row leaves SMs idle) and at
least two chunks of ``2 x min_rnumel`` (8192) elements per row. GroupNorm's (N, group) rows in
L2_60 (512 rows of 492156) and L2_92 (2048 rows of 63504) fill the SMs, but a variance's row that
long is walked four times from memory by one kernel: such rows are cut for the cache instead
(``_cached_variances``).
The heuristic follows Inductor's (read, not copied): split only where the outputs are too few to
fill the GPU; an *outer* reduction (its outputs neighbours in memory: a kept dim of size > 1
after the reduced ones, column sums, or a kept channels-last result's global pool: the pass runs
after the layouts are chosen and reads the strides, ``ir/split_layout.py``)
aims at ~8 programs of 128 outputs per SM with 128..2048 rows per chunk, an *inner* one (the
reduced dims are the innermost: ``x.sum()``) at ~4 programs per SM with 8192..131072 elements
per chunk, and only with fewer outputs than SMs: group_norm's 256 groups of 65536 elements
(8 x 512 x 64 x 64) ran at 123 us split (the statistics' passes in separate kernels, their
inputs written out in float32) against 80 us in one kernel on the H200. The pass is deterministic and keeps names readable (``sum_1`` becomes ``sum_1.part``
and ``sum_1``).

A variance, ``sum((x - mean(x))^2)`` with that mean over the same dims, is not split as two
independent reductions (each would read all of x: the second needs the global mean) but as
per-chunk means and M2s in one pass over x, combined by Chan's formula; every mean of that x
over those dims becomes the combined mean (``ir/split_variance.py``; decisions with ``role``
"m2" / "mean" say so).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from autofuse.ir.graph import Graph, Node, numel
from autofuse.ir.split_arg import ARG_BEST, rewrite_arg
from autofuse.ir.split_chunks import SplitDecision, chunk_view
from autofuse.ir.split_chunks import new_node as _node
from autofuse.ir.split_layout import (
    chunk_order,
    layout_label,
    nested,
    outermost,
    physically_inner,
    read_layouts,
    read_strides,
)
from autofuse.ir.split_variance import VarianceStats, annotate, find_variances, prune
from autofuse.logs import log
from autofuse.settings import settings, target

__all__ = [
    "SPLITTABLE",
    "SplitDecision",
    "SplitPolicy",
    "pipeline_policy",
    "plan_splits",
    "split_for_pipeline",
    "split_reductions",
]

# associative reductions whose partial results combine with the same op, and argmax / argmin
# (from per-chunk winners: ir/split_arg.py); cumsum / cumprod are scans, never split
SPLITTABLE = frozenset({"sum", "mean", "amax", "amin", "prod", "any", *ARG_BEST})
_WIDEN = frozenset({"sum", "mean", "prod"})  # 16-bit float partials are kept in float32


@dataclass(frozen=True)
class SplitPolicy:
    """When and how far to split. ``num_sm``: the target's multiprocessors; ``min_rnumel``: the
    shortest reduced extent worth splitting (default 4096; tests lower it to split small
    shapes). The shortest chunk scales with it: ``min_rnumel / 32`` rows of an outer reduction
    (128), ``2 * min_rnumel`` elements of an inner one (8192)."""

    num_sm: int = 132
    min_rnumel: int = 4096

    @property
    def outer_chunk(self) -> tuple[int, int]:  # rows per chunk of an outer reduction
        return max(2, self.min_rnumel // 32), 2048

    @property
    def inner_chunk(self) -> tuple[int, int]:  # elements per chunk of an inner reduction
        return max(2, 2 * self.min_rnumel), 131072

    @property
    def variance_chunk(self) -> tuple[int, int]:  # elements per chunk of a long variance
        return max(2, 2 * self.min_rnumel), max(2, 4 * self.min_rnumel)

    @property
    def long_row(self) -> int:  # a variance row whose unsplit passes re-read it from memory
        return 8 * self.min_rnumel

    def wanted_k(self, rnumel: int, outputs: int, inner: bool) -> tuple[int, str]:
        """The number of chunks to aim at (1: do not split) and why."""
        if rnumel < self.min_rnumel:
            return 1, f"reduced extent {rnumel} < {self.min_rnumel}"
        if outputs < 1:
            return 1, "no outputs"
        if inner:
            if outputs >= self.num_sm:  # a program per SM or more: the split only adds passes
                return 1, f"{outputs} outputs fill {self.num_sm} SMs"
            per_output = -(-4 * self.num_sm // outputs)  # programs per output for ~4 per SM
            lo, hi = self.inner_chunk
        else:
            if outputs >= 64 * self.num_sm:
                return 1, f"{outputs} outputs fill {self.num_sm} SMs"
            xblocks = -(-outputs // 128)
            per_output = -(-8 * self.num_sm // xblocks)  # ~8 programs of 128 outputs per SM
            lo, hi = self.outer_chunk
        chunk = min(max(-(-rnumel // per_output), lo), hi)
        k = rnumel // chunk
        if k < 2:
            return 1, f"reduced extent {rnumel} is under two chunks of {chunk}"
        return k, f"{outputs} outputs, reduced extent {rnumel}: ~{k} chunks of {chunk}"


def _divisor_near(n: int, k: int) -> int | None:
    """The divisor of ``n`` closest to ``k`` (by ratio) within a factor of two, at least 2."""
    best = None
    for d in range(max(2, k // 2), min(n // 2, 2 * k) + 1):
        if n % d == 0:
            score = max(d / k, k / d)
            if best is None or score < best[0] or (score == best[0] and d > best[1]):
                best = (score, d)
    return None if best is None else best[1]


def _runs(dims: tuple[int, ...]) -> list[tuple[int, int]]:
    """The runs of adjacent dims of sorted ``dims``, as (first, last)."""
    runs: list[tuple[int, int]] = []
    for d in dims:
        if runs and runs[-1][1] == d - 1:
            runs[-1] = (runs[-1][0], d)
        else:
            runs.append((d, d))
    return runs


def _cut(
    shape: tuple[int, ...], dims: tuple[int, ...], k: int, strides: tuple[int, ...] | None = None
) -> tuple[int, int, int] | None:
    """Where to cut a reduction over ``dims`` in about ``k`` chunks: (chunks, first, last dim
    of the merged run cut), or None. All the dims when they are adjacent; otherwise the first
    reduced dim, else the last run of adjacent reduced dims (BatchNorm's (N, D, H, W) of
    ConvTranspose3d's (64, 16, 63, 63, 63) result wants ~122 chunks: N = 64 has no divisor
    near 122, D x H x W = 250047 has 147), each with a divisor within a factor two of ``k``.
    Read with ``strides`` (not contiguous), a run not nested in memory comes after the dim
    furthest apart in memory alone (:func:`_memory_options`)."""
    runs = _runs(dims)
    options = runs if len(runs) == 1 else [(dims[0], dims[0]), runs[-1]]
    for first, last in _memory_options(shape, dims, options, strides):
        kk = _divisor_near(numel(shape[first : last + 1]), k)
        if kk is not None:
            return kk, first, last
    return None


def _memory_options(shape, dims, options, strides) -> list[tuple[int, int]]:
    """``options`` (runs of dims to cut) ordered for a reduction read with ``strides``: those
    nested in memory first, then the reduced dim furthest apart in memory alone, then the
    rest. A channels-last GroupNorm row (C/G, HxW) read as (1, C) strides is no nested run:
    cut as one, a chunk holds some channels' planes and reads one element of every pixel's
    channels; cut along the pixels, each chunk reads a group's channels whole per pixel."""
    if strides is None:
        return options
    far = outermost(shape, strides, dims)
    good = [o for o in options if nested(shape, strides, *o)]
    return list(dict.fromkeys([*good, (far, far), *options]))  # in that order, each once


def _variance_cut(
    shape: tuple[int, ...],
    dims: tuple[int, ...],
    chunk: tuple[int, int],
    strides: tuple[int, ...] | None = None,
) -> tuple[int, int, int] | None:
    """Where to cut a long variance over ``dims`` in chunks of about ``chunk`` elements: the
    outermost run of reduced dims (merged; where read with ``strides`` and not nested in
    memory, the dim furthest apart in memory) where a divisor of it gives chunks within
    (lo, 4 hi) (BatchNorm's N: each chunk whole planes, contiguous), else as :func:`_cut`."""
    lo, hi = chunk
    rnumel = numel(shape[d] for d in dims)
    target = (lo + hi) // 2
    first, last = _runs(dims)[0]
    if not nested(shape, strides, first, last):
        first = last = outermost(shape, strides, dims)
    n0 = numel(shape[first : last + 1])
    ks = [k for k in range(2, n0 + 1) if n0 % k == 0 and lo <= rnumel // k <= 4 * hi]
    if ks:
        best = min(ks, key=lambda k: max(rnumel / k / target, target * k / rnumel))
        return best, first, last
    return _cut(shape, dims, -(-rnumel // target), strides)


def decide(
    graph: Graph, i: int, policy: SplitPolicy, reads: Sequence[tuple[int, ...] | None] = ()
) -> SplitDecision:
    """What the pass does with reduction ``i``: inner or outer by the strides its kernel reads
    the input with (``ir/split_layout.py``: a kept channels-last convolution's global pool is
    an outer reduction; ``reads``: ``read_layouts(graph)`` where the caller has it), by the
    logical shape where those are contiguous."""
    node = graph[i]
    if node.op not in SPLITTABLE:
        return SplitDecision(i, 1, f"{node.op} is not split (a scan or not a reduction)")
    shape = graph[node.inputs[0]].shape
    if not shape or not node.attr("dims"):
        return SplitDecision(i, 1, "not split: nothing is reduced")
    dims = tuple(sorted(d % max(len(shape), 1) for d in node.attr("dims")))
    rnumel = numel(shape[d] for d in dims)
    outputs = numel(shape) // max(rnumel, 1)
    # the strides the kernel reads x with (not looked for where nothing could split)
    strides = None
    if rnumel >= policy.min_rnumel:
        strides = read_strides(graph, node.inputs[0], reads or None)
    if strides is None:
        inner = all(shape[j] == 1 for j in range(dims[-1] + 1, len(shape)))
        kind = "inner" if inner else "outer"
    else:
        inner = physically_inner(shape, strides, dims)
        kind = f"{'inner' if inner else 'outer'} ({layout_label(shape, strides)})"
    k, why = policy.wanted_k(rnumel, outputs, inner)
    if k == 1:
        return SplitDecision(i, 1, f"not split: {why}" + (f", {kind}" if strides else ""))
    cut = _cut(shape, dims, k, strides)
    if cut is None:
        return SplitDecision(i, 1, f"not split: {why}, but no divisor near {k} cuts it")
    kk, first, last = cut
    return _ordered(SplitDecision(i, kk, f"split in {kk} ({kind}): {why}", first, last),
                    shape, dims, strides)  # fmt: skip


def _ordered(dec: SplitDecision, shape, dims, strides) -> SplitDecision:
    """``dec`` reading its chunks in memory's order where ``strides`` (the layout its input is
    read in, None: contiguous) differ from the logical order."""
    if strides is None:
        return dec
    return replace(dec, order=chunk_order(shape, strides, dims, dec))


def _plain_splits(graph: Graph, policy: SplitPolicy | None) -> dict[int, SplitDecision]:
    policy = policy or SplitPolicy()
    reductions = [i for i, n in enumerate(graph.nodes) if n.kind == "reduction"]
    reads = read_layouts(graph) if reductions else ()
    plain = {i: decide(graph, i, policy, reads) for i in reductions}
    return _cached_variances(graph, plain, policy, reads)


def _cached_variances(
    graph: Graph, decisions: dict[int, SplitDecision], policy: SplitPolicy, reads: Sequence = ()
) -> dict[int, SplitDecision]:
    """``decisions`` with each long variance cut in chunks its two passes re-read from cache.

    An unsplit variance is one kernel of three passes over each row (the moment mean's maximum
    with its shifted sum riding the same loop, ``kernels/common/online.py``; the sum of
    squares; the normalized output: four before the sum rode the maximum's loop); a split one
    reads each chunk twice (mean, then M2). Where a row (or chunk) is longer than the cache holds for every program
    in flight, each pass reads it from memory again: GroupNorm over a ConvTranspose3d result
    (KernelBench L2_60: 512 rows of 492156 elements) took 2.37 ms in that one kernel on an
    H100, against 1.31 ms for torch.compile's one-pass statistics and normalization. A
    variance whose row is at least ``policy.long_row`` elements, or whose chunks are longer
    than ``policy.variance_chunk`` allows, is cut in chunks of that size: the chunk's second
    pass hits the cache, and the normalization is one more read of x."""
    lo, hi = policy.variance_chunk
    wanted: dict[int, SplitDecision] = {}
    for i, dec in decisions.items():
        node = graph[i]
        if node.op != "sum" or not node.attr("dims"):
            continue
        shape = graph[node.inputs[0]].shape
        dims = tuple(sorted(d % len(shape) for d in node.attr("dims")))
        rnumel = numel(shape[d] for d in dims)
        chunk = rnumel // dec.k if dec.k > 1 else rnumel
        if (dec.k == 1 and rnumel < policy.long_row) or chunk <= hi:
            continue
        strides = read_strides(graph, node.inputs[0], reads or None)
        cut = _variance_cut(shape, dims, (lo, hi), strides)
        if cut is not None and rnumel // cut[0] < chunk:
            kk, first, last = cut
            why = f"a variance row of {rnumel}: ~{kk} chunks of {rnumel // kk}, re-read from cache"
            dec = SplitDecision(i, kk, f"split in {kk}: {why}", first, last)
            wanted[i] = _ordered(dec, shape, dims, strides)
    if not wanted:
        return decisions
    out = dict(decisions)
    for group in find_variances(graph, {**decisions, **wanted}):
        first = wanted.get(group.sums[0])
        if first is not None:  # every sum of the group reads the same chunks
            out.update((s, replace(first, node=s)) for s in group.sums)
    return out


def plan_splits(graph: Graph, policy: SplitPolicy | None = None) -> dict[int, SplitDecision]:
    """The decision for every reduction of ``graph`` (by node index), with the variance
    rewrite's roles and reasons (``ir/split_variance.py``)."""
    decisions = _plain_splits(graph, policy)
    return annotate(graph, decisions, find_variances(graph, decisions))


def _rewrite(node: Node, src: Node, x: int, dec: SplitDecision, add) -> int:
    """Append the split form of ``node`` (reading node ``x``, shaped like ``src``); the index of
    the node that replaces it."""
    shape = src.shape
    dims = tuple(sorted(j % len(shape) for j in node.attr("dims")))
    name = node.name or node.op
    part_dtype = node.dtype
    if node.op in _WIDEN and node.dtype in ("float16", "bfloat16"):
        x = add(_node("cast", (x,), shape, "float32", f"{name}.f32", dtype="float32"))
        part_dtype = "float32"
    chunks = chunk_view(shape, dims, dec)
    v = chunks.view(add, x, add.nodes[x].dtype, name)
    kept = tuple(s for j, s in enumerate(chunks.shape) if j not in chunks.dims)
    p = add(_node(node.op, (v,), kept, part_dtype, f"{name}.part", dims=chunks.dims, keepdim=False))
    p = chunks.back(add, p, part_dtype, f"{name}.parts", keepdim=False)
    if part_dtype == node.dtype:
        return add(replace(node, inputs=(p,)))
    t = add(replace(node, inputs=(p,), dtype=part_dtype, name=f"{name}.total"))
    return add(_node("cast", (t,), node.shape, node.dtype, name, dtype=node.dtype))


class _Appender:
    def __init__(self) -> None:
        self.nodes: list[Node] = []

    def __call__(self, node: Node) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1


def split_reductions(graph: Graph, policy: SplitPolicy | None = None) -> Graph:
    """``graph`` with every reduction the policy splits cut in two stages (``plan_splits`` says
    why each one is or is not). A graph with nothing to split is returned as is."""
    decisions = _plain_splits(graph, policy)
    if not any(dec.k > 1 for dec in decisions.values()):
        return graph
    add, remap = _Appender(), {}
    replaced: dict[int, VarianceStats] = {}
    for group in find_variances(graph, decisions):
        stats = VarianceStats(graph, group, decisions[group.sums[0]], add)
        replaced.update((i, stats) for i in group.sums + group.means)
    for i, node in enumerate(graph.nodes):
        node = replace(node, inputs=tuple(remap[j] for j in node.inputs))
        dec = decisions.get(i)
        if i in replaced:
            remap[i] = replaced[i].replace(i, remap)
        elif dec is None or dec.k == 1:
            remap[i] = add(node)
        elif node.op in ARG_BEST:
            remap[i] = rewrite_arg(node, add.nodes[node.inputs[0]].shape, node.inputs[0], dec, add)
        else:
            remap[i] = _rewrite(node, add.nodes[node.inputs[0]], node.inputs[0], dec, add)
    out = Graph(
        tuple(add.nodes),
        tuple(remap[i] for i in graph.inputs),
        tuple(remap[o] for o in graph.outputs),
    )
    return prune(out) if replaced else out


def pipeline_policy(cuda: bool) -> SplitPolicy | None:
    """The policy the pipeline splits with after capture (None: no split), from the settings
    (``AUTOFUSE_SPLIT_REDUCTIONS``: by default on for CUDA inputs) and the target's SMs."""
    s = settings()
    if s.split_reductions == "off" or (s.split_reductions == "auto" and not cuda):
        return None
    return SplitPolicy(num_sm=target().sm_count, min_rnumel=s.split_min_rnumel)


def split_for_pipeline(graph: Graph, cuda: bool) -> Graph:
    """``split_reductions`` under :func:`pipeline_policy` (``graph`` itself when it is off)."""
    policy = pipeline_policy(cuda)
    if policy is None:
        return graph

    for i, dec in plan_splits(graph, policy).items():
        log.debug("split reductions: %s %%%d (%s): %s", graph[i].op, i, graph[i].name, dec.reason)
    return split_reductions(graph, policy)
