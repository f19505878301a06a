"""Index propagation: a node's index pushed back through views and broadcasting."""

from __future__ import annotations

from collections.abc import Iterable

from autofuse.ir.graph import Graph, contiguous_strides, numel
from autofuse.ir.indexing import Expr, linearize


def view_source_index(graph: Graph, i: int, index: tuple[Expr, ...]) -> tuple[Expr, ...]:
    """Map the index of view node ``i``'s output to the index of its input."""
    node = graph[i]
    src = graph[node.inputs[0]].shape
    op = node.op
    if op == "permute":
        out: list[Expr] = [Expr.constant(0)] * len(src)
        for pos, d in enumerate(node.attr("dims")):
            out[d] = index[pos]
        return tuple(out)
    if op == "expand":
        off = len(node.shape) - len(src)
        return tuple(Expr.constant(0) if src[j] == 1 else index[j + off] for j in range(len(src)))
    if op == "unsqueeze":
        d = node.attr("dim")
        return index[:d] + index[d + 1 :]
    if op == "slice":
        d = node.attr("dim")
        e = index[d].scale(node.attr("step")).shift(node.attr("start"))
        return index[:d] + (e,) + index[d + 1 :]
    if op == "reshape":
        return domain_of_flat(flat_of(index, node.shape), src)
    raise ValueError(f"not a view op: {op}")


class FlatIndex(tuple):
    """A per-dim index of an element of a tensor of ``shape`` that also holds the element's
    flat offset in that tensor (``flat``), as a reshape computed it. A load of a contiguous
    buffer of that shape takes the flat offset as it is: where a reshape's rows do not align
    with the buffer's dims (a split GroupNorm row of 11718 elements over planes of 63 x 63),
    the per-dim index decodes into divisions and modulos the simplifier cannot join again,
    and the load of a contiguous row becomes scalar loads behind integer divisions."""

    flat: Expr
    shape: tuple[int, ...]


def flat_of(index: tuple[Expr, ...], shape: tuple[int, ...]) -> Expr:
    """The flat offset (contiguous order) of ``index`` into a tensor of ``shape``."""
    if isinstance(index, FlatIndex) and index.shape == tuple(shape):
        return index.flat
    return linearize(index, contiguous_strides(shape), shape)


def domain_of_flat(flat: Expr, shape: tuple[int, ...]) -> tuple[Expr, ...]:
    """The index into a contiguous tensor of ``shape`` of the element at flat offset ``flat``
    (an empty tensor has no element: any index, zeros, never stored or read); it keeps
    ``flat`` (:class:`FlatIndex`)."""
    if numel(shape) == 0:
        return tuple(Expr.constant(0) for _ in shape)
    strides = contiguous_strides(shape)
    out = FlatIndex(
        Expr.constant(0)
        if size == 1
        else flat.floordiv_mod(strides[j], None if j == _outer(shape) else size)
        for j, size in enumerate(shape)
    )
    out.flat, out.shape = flat, tuple(shape)
    return out


def _outer(shape: tuple[int, ...]) -> int:
    """Position of the outermost dimension of size > 1."""
    for j, s in enumerate(shape):
        if s != 1:
            return j
    return 0


def broadcast_index(src: tuple[int, ...], dst: tuple[int, ...], index: tuple[Expr, ...]):
    """Index into ``src`` for an element of ``dst`` that ``src`` broadcasts to (``index``
    itself where the shapes are equal: it may hold its flat offset)."""
    if tuple(src) == tuple(dst):
        return index
    off = len(dst) - len(src)
    return tuple(Expr.constant(0) if src[j] == 1 else index[j + off] for j in range(len(src)))


def domain_index(shape: tuple[int, ...], var: str) -> tuple[Expr, ...]:
    strides = contiguous_strides(shape)
    outer = _outer(shape)
    return tuple(Expr.dim(var, st, s, j == outer) for j, (st, s) in enumerate(zip(strides, shape)))


def loop_index(
    domain: tuple[int, ...], reduce_dims: tuple[int, ...], swap: tuple[int, int] | None = None
) -> tuple[Expr, ...]:
    """A loop kernel's index of its domain element: the kept dims over ``xindex`` (its rows),
    the reduced ones over ``rindex`` (a row's columns). ``swap``: (a, b), a row of a x b
    elements (one reduced dim, or two of a and b) walked with its low digit (b) outermost:
    column ``rindex`` is element ``b * (rindex % a) + rindex // a``, or elements
    (``rindex % a``, ``rindex // a``) of the two dims (``kernels/common/row_order.py``)."""
    if not reduce_dims:
        return domain_index(domain, "xindex")
    kept = tuple(s for i, s in enumerate(domain) if i not in reduce_dims)
    reduced = tuple(domain[i] for i in reduce_dims)
    xi, ri = iter(domain_index(kept, "xindex")), iter(domain_index(reduced, "rindex"))
    if swap is not None:
        a, b = swap
        low, high = Expr.dim("rindex", 1, a, False), Expr.dim("rindex", a, b, True)
        ri = iter((low, high) if len(reduce_dims) == 2 else (low.scale(b) + high,))
    return tuple(next(ri) if i in reduce_dims else next(xi) for i in range(len(domain)))


def narrow_iota(graph: Graph, nodes: Iterable[int], extent: int | None = None) -> bool:
    """Whether a group's aranges (``nodes``: its members) may be computed in int32: every op on
    them adds, subtracts or compares (the values stay within a few times ``extent``, far below
    2**31). Masks built from ``arange`` (causal, sliding windows) then cost 32-bit integer ops
    instead of emulated 64-bit ones. ``extent`` defaults to the aranges' largest value."""
    g = graph
    nodes = tuple(nodes)
    # the aranges: members, or read by members (an arange is rendered inline, not a member)
    ints = {i for i in nodes if g[i].op == "iota"}
    ints |= {g.base_of(j) for i in nodes for j in g[i].inputs if g[g.base_of(j)].op == "iota"}
    if extent is None:
        extent = max(
            (abs(g[i].attr("start")) + abs(g[i].attr("step")) * numel(g[i].shape) for i in ints),
            default=0,
        )
    if extent >= 2**24:
        return False
    ok = {"add", "sub", "neg", "eq", "ne", "lt", "le", "gt", "ge", "abs", "where"}
    ok |= {"logical_and", "logical_or", "logical_not", "bitwise_not", "bitwise_and"}
    for i in nodes:
        node = g[i]
        if node.kind == "view" or not any(g.base_of(j) in ints for j in node.inputs):
            continue
        if node.dtype == "bool" and node.op in ok:
            continue
        small = all(
            g[b].op != "const" or abs(float(g[b].attr("value"))) < 2**24
            for b in (g.base_of(j) for j in node.inputs)
        )
        if node.op not in ok or not small:
            return False
        ints.add(i)
    return True
