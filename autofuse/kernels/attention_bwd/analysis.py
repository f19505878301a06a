"""The roles of an attention backward group's nodes, read from the IR.

The group (the backward graph of eager attention, see ``frontend/remat.py``) holds *tile*
matmuls, whose products are (T, Tk) tiles of loaded operands (the recomputed scores ``Q K^T``
and ``dP = dO V^T``), pointwise ops on the tiles (the mask, ``P = exp(x - max) / sum``, the
softmax backward with its row term ``delta`` loaded, the mask's and the scale's backward) and
*gradient* matmuls, each reading one tile value (through views: a transpose) and one loaded
operand, contracting over the query rows (a key-side gradient: dK, dV) or over the keys (the
query-side one: dQ). A refusal names what does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from autofuse.ir.graph import Graph
from autofuse.ir.indexing import Expr
from autofuse.kernels.attention.facts import AttentionGroup, group_facts, read_through_copies
from autofuse.kernels.common.base import FusionRefused, describe
from autofuse.kernels.common.views import domain_index, view_source_index


@dataclass(frozen=True)
class GradMatmul:
    """``node = A @ B`` with operand ``tile_pos`` (0: A, 1: B) a tile value read through views
    from ``tile`` (a member of the domain's last two dims (T, Tk)) and the other operand loaded.
    ``over_rows``: the contraction runs over the query rows (its output is indexed by key);
    ``transposed``: the operand is the tile transposed (its rows are keys or its columns rows).
    """

    node: int
    tile: int
    tile_pos: int
    over_rows: bool
    transposed: bool

    def loaded(self, graph: Graph) -> int:
        return graph[self.node].inputs[1 - self.tile_pos]

    def free_extent(self, graph: Graph) -> int:
        """The output dim that is neither rows nor keys (a head dim)."""
        shape = graph[self.node].shape
        return shape[-1] if self.tile_pos == 0 else shape[-2]


@dataclass(frozen=True)
class BwdParts(AttentionGroup):
    """The roles of the group's matmuls, beside the facts both attention kinds share (the
    domain: the tiles' shape with its batch dims as the pointwise ops see it)."""

    tiles: tuple[int, ...]  # matmuls whose product is a (T, Tk) tile of loaded operands
    grads: tuple[GradMatmul, ...]


def backward_facts(graph: Graph, members: frozenset[int]) -> BwdParts:
    """``bwd_parts`` of the group, found once."""
    return group_facts(graph, "attention_bwd", members, lambda: bwd_parts(graph, members))


def bwd_parts(graph: Graph, members: frozenset[int]) -> BwdParts:
    """The roles of ``members`` as an attention backward group, or a refusal."""
    mms = [m for m in sorted(members) if graph[m].kind == "matmul"]
    if len(mms) < 3:
        raise FusionRefused(
            f"an attention backward takes 3 or more matmuls, the group has {len(mms)}"
        )
    copies: set[int] = set()
    tiles, grads_raw = [], []
    for m in mms:
        ins = [read_through_copies(graph, members, j, copies) for j in graph[m].inputs]
        inside = [k for k, i in enumerate(ins) if i in members]
        if not inside:
            tiles.append(m)
        elif len(inside) == 1:
            grads_raw.append((m, inside[0]))
        else:
            raise FusionRefused(
                f"{describe(graph, m)} multiplies two values the group computes: the attention "
                "backward's matmuls read one tile and one loaded operand"
            )
    if not tiles or not grads_raw:
        raise FusionRefused("an attention backward needs tile matmuls and gradient matmuls")
    shape = graph[tiles[0]].shape
    if len(shape) not in (2, 3) or any(graph[t].shape != shape for t in tiles):
        raise FusionRefused(
            f"the tile matmuls {[describe(graph, t) for t in tiles]} differ in shape"
        )
    heads = shape[0] if len(shape) == 3 else 1
    t, tk = shape[-2], shape[-1]
    if not any(recomputed_softmax(graph, members, e) for e in members):
        raise FusionRefused(
            "no softmax recomputed from its saved row max (exp(x - max), the max loaded) among "
            "the ops between the matmuls: not an attention backward"
        )
    domain = _domain(graph, members, shape, tiles)
    grads = tuple(_grad(graph, members, m, pos, domain, heads, t, tk) for m, pos in grads_raw)
    _check_members(graph, members, set(tiles), grads, copies, domain)
    return BwdParts(heads, t, tk, domain, frozenset(copies), tuple(tiles), grads)


def recomputed_softmax(graph: Graph, members, e: int) -> bool:
    """``e`` is ``exp(x - m)`` with ``x`` computed in the group and ``m`` a loaded row value."""
    if graph[e].op != "exp":
        return False
    s = graph.base_of(graph[e].inputs[0])
    if s not in members or graph[s].op != "sub":
        return False
    x, m = (graph.base_of(j) for j in graph[s].inputs)
    return x in members and m not in members and graph[m].shape[-1:] == (1,)


def _downstream(graph: Graph, members, tiles) -> set[int]:
    """The members that read a tile matmul's product (directly or through other members)."""
    out, stack = set(), list(tiles)
    while stack:
        for u in graph.compute_users[stack.pop()]:
            if u in members and u not in out:
                out.add(u)
                stack.append(u)
    return out


def _domain(graph: Graph, members, shape, tiles=()) -> tuple[int, ...]:
    """The shape of the tile's pointwise ops: the highest-rank shape, among the members that
    compute on the tiles, with the tiles' element count and last two dims (the 4-D (batch,
    heads, T, Tk) of eager code; not an operand's copy that happens to match)."""
    n = 1
    for s in shape:
        n *= s
    best = tuple(shape)
    if tiles:
        members = _downstream(graph, members, tiles)
    for m in members:
        s = graph[m].shape
        size = 1
        for x in s:
            size *= x
        if graph[m].kind == "pointwise" and size == n and s[-2:] == shape[-2:]:
            if len(s) > len(best):
                best = s
    return best


def tile_index(domain, heads: int, rank: int, row: Expr, col: Expr) -> tuple[Expr, ...]:
    """The index of the element (row, col) of the program's batch entry ``bh`` in a tensor of
    the domain's rank (batch dims from ``bh``) or of the matmuls' (``bh`` itself)."""
    if rank == len(domain):
        return (*domain_index(domain[:-2], "bh"), row, col)
    return ((Expr.dim("bh", 1, heads, True),) if rank == 3 else ()) + (row, col)


def _grad(graph: Graph, members, m: int, pos: int, domain, heads, t, tk) -> GradMatmul:
    """Which tile the gradient matmul ``m`` reads at operand ``pos`` and in which orientation:
    its operand index pushed back through the views to a member of the domain."""
    node = graph[m]
    op = graph[node.inputs[pos]]
    u = Expr.dim("gu", 1, op.shape[-2], True)
    v = Expr.dim("gv", 1, op.shape[-1], True)
    batch = (Expr.dim("bh", 1, heads, True),) if len(op.shape) == 3 else ()
    j, index = node.inputs[pos], (*batch, u, v)
    while graph[j].kind == "view":
        index = view_source_index(graph, j, index)
        j = graph[j].inputs[0]
    base = graph[j]
    if base.shape[-2:] != (t, tk) or len(base.shape) not in (len(domain), len(batch) + 2):
        raise FusionRefused(
            f"{describe(graph, m)} reads {describe(graph, j)}, not a (T, Tk) tile of the scores"
        )
    rank = len(base.shape)
    orient = [tr for tr, (row, col) in ((False, (u, v)), (True, (v, u)))
              if tuple(index) == tile_index(domain, heads, rank, row, col)]  # fmt: skip
    if not orient:
        raise FusionRefused(
            f"{describe(graph, m)} reads {describe(graph, j)} at ({', '.join(map(str, index))}): "
            "not one (batch, head)'s tile, or its transpose"
        )
    transposed = orient[0]
    # A[i, c] (pos 0) or B[c, j] (pos 1): the contraction index c is v for A, u for B
    contracted_is_row = (pos == 0) == transposed
    return GradMatmul(m, j, pos, contracted_is_row, transposed)


def _check_members(graph: Graph, members, tiles, grads, copies, domain) -> None:
    """Every other member is a pointwise op on the tiles' elements (or on a mask) reaching a
    gradient matmul; no reduction (the softmax backward's row term must be a loaded tensor,
    see ``frontend/remat_delta.py``)."""
    gm = {g.node for g in grads}
    for m in sorted(members - tiles - gm - copies):
        node = graph[m]
        if node.kind != "pointwise":
            raise FusionRefused(
                f"{describe(graph, m)} is a {node.kind} inside the attention backward: the "
                "kernel walks tiles of keys and rows and reduces nothing but its matmuls"
            )
        off = len(domain) - len(node.shape)
        if off < 0 or any(s not in (1, domain[off + k]) for k, s in enumerate(node.shape)):
            raise FusionRefused(
                f"{describe(graph, m)} is not an op on the (T, Tk) tiles of the scores"
            )
