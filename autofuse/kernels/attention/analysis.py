"""The roles of an attention group's nodes, read from the IR: the two chained matmuls, the
softmax between them (its max, sum and division), the pointwise ops on the scores (scale,
masks) and the clones in front of Q / K / V; a refusal names what does not fit."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from autofuse.ir.graph import Graph
from autofuse.kernels.attention.facts import AttentionGroup, group_facts, read_through_copies
from autofuse.kernels.common.base import (
    FusionRefused,
    describe,
    next_pow2,
    stored_nodes,
)
from autofuse.kernels.common.memory import ancestors
from autofuse.kernels.common.render import compute_dtype
from autofuse.kernels.reduction.kind import reduction_domain


@dataclass(frozen=True)
class AttentionParts(AttentionGroup):
    """The roles of a group's nodes: ``scores = mm1(q, k)``; ``x`` (the softmax input) is
    pointwise in the scores; ``amax``, ``total`` and ``probs`` are softmax's max, sum and
    division; ``mm2(probs cast to p_dtype, v)`` is the output; ``d`` and ``dv`` the head dims
    of Q / K and of V; ``fold`` the softmax scale folded into the exp2, where it can be."""

    mm1: int
    mm2: int
    x: int
    amax: int
    total: int
    probs: int
    p_dtype: str
    d: int  # Q / K head dim
    dv: int  # V head dim
    fold: ScaleFold | None = None

    def operand(self, graph: Graph, which: str) -> int:
        return {
            "q": graph[self.mm1].inputs[0],
            "k": graph[self.mm1].inputs[1],
            "v": graph[self.mm2].inputs[1],
        }[which]


def attention_parts(graph: Graph, members: frozenset[int]) -> AttentionParts:
    """The roles of ``members`` as an attention group, or a refusal saying what does not fit."""
    mms = [m for m in sorted(members) if graph[m].kind == "matmul"]
    if len(mms) != 2:
        raise FusionRefused(f"attention takes two matmuls, the group has {len(mms)}")
    mm1, mm2 = mms
    if mm1 not in ancestors(graph, mm2):
        raise FusionRefused(f"{describe(graph, mm1)} does not feed {describe(graph, mm2)}")
    reds = [m for m in sorted(members) if graph[m].kind == "reduction"]
    amax = [r for r in reds if graph[r].op == "amax"]
    if len(reds) != 2 or len(amax) != 1:
        raise FusionRefused(
            "attention takes one softmax (an amax and a sum) between its matmuls, the group "
            f"reduces with {[graph[r].op for r in reds]}"
        )
    amax = amax[0]
    total = next(r for r in reds if r != amax)
    x = graph[amax].inputs[0]
    exp = graph[total].inputs[0]
    sub = graph[exp].inputs[0] if graph[exp].op == "exp" else None
    if (
        graph[total].op != "sum"
        or sub is None
        or graph[sub].op != "sub"
        or graph[sub].inputs[0] != x
        or graph.base_of(graph[sub].inputs[1]) != amax
    ):
        raise FusionRefused(
            f"{describe(graph, total)} is not the sum of exp(x - amax(x)) of a softmax"
        )
    domain, rdims = reduction_domain(graph, [amax, total])
    if rdims != (len(domain) - 1,) or len(domain) < 2 or graph[x].shape != domain:
        raise FusionRefused(f"{describe(graph, amax)} does not reduce the rows of the scores")
    scores = graph[mm1].shape  # (B * H, T, Tk) as the matmul computes it, viewed as domain
    if math.prod(scores) != math.prod(domain) or scores[-2:] != domain[-2:]:
        raise FusionRefused(
            f"the scores {describe(graph, mm1)} of shape {list(graph[mm1].shape)} are "
            f"broadcast to the softmax's {list(domain)}: one program per score row needs them whole"
        )
    probs = _probs(graph, members, exp, total, mm2)
    copies = _operand_copies(graph, members, mm1, mm2)
    _check_roles(graph, members, mm1, mm2, x, copies)
    p_dtype = graph[graph[mm2].inputs[0]].dtype
    heads = scores[0] if len(scores) == 3 else 1
    d, dv = graph[graph[mm1].inputs[0]].shape[-1], graph[mm2].shape[-1]
    parts = AttentionParts(
        heads, scores[-2], scores[-1], domain, copies, mm1, mm2, x, amax, total, probs, p_dtype,
        d, dv,
    )  # fmt: skip
    fold = scale_fold(graph, parts, stored_nodes(graph, members), compute_dtype)
    return replace(parts, fold=fold)


def forward_facts(graph: Graph, members: frozenset[int]) -> AttentionParts:
    """``attention_parts`` of the group, found once."""
    return group_facts(graph, "attention", members, lambda: attention_parts(graph, members))


def _probs(graph: Graph, members, exp: int, total: int, mm2: int) -> int:
    """softmax's ``exp / sum``: the node that reaches mm2's A operand through casts and
    identities (a clone or ``contiguous``: dropout with p = 0; a product with 1)."""
    i = graph.base_of(graph[mm2].inputs[0])
    while i in members and (j := _read_through(graph, i)) is not None:
        i = j
    node = graph[i]
    if not (
        node.op == "div"
        and node.inputs[0] == exp
        and graph.base_of(node.inputs[1]) == total
        and node.shape == graph[exp].shape
    ):
        raise FusionRefused(
            f"{describe(graph, mm2)} does not read the softmax exp(x - max) / sum through "
            f"casts (it reads {describe(graph, i)}): no other op between softmax and P @ V"
        )
    return i


def _read_through(graph: Graph, i: int) -> int | None:
    """What node ``i`` passes on as it is (a cast: rounded), or None: a cast, a copy, ``x * 1``
    or ``x / 1`` of ``x``'s shape and dtype."""
    node = graph[i]
    if node.op in ("cast", "copy"):
        return graph.base_of(node.inputs[0])
    if node.op not in ("mul", "div") or len(node.inputs) != 2:
        return None
    x, c = (graph.base_of(j) for j in node.inputs)
    if node.op == "mul" and graph[x].op == "const":
        x, c = c, x
    one = graph[c].op == "const" and float(graph[c].attr("value")) == 1.0
    same = graph[x].shape == node.shape and graph[x].dtype == node.dtype
    return x if one and same else None


def _operand_copies(graph: Graph, members, mm1: int, mm2: int) -> frozenset[int]:
    """Clones in front of Q, K or V (an expand + reshape of shared heads): read through."""
    out: set[int] = set()
    for j in (*graph[mm1].inputs, graph[mm2].inputs[1]):
        i = read_through_copies(graph, members, j, out)
        if i in members:
            raise FusionRefused(
                f"{describe(graph, i)} computes an operand of attention's matmuls: Q, K and V "
                "are loaded as they are (no prologue)"
            )
    return frozenset(out)


def _check_roles(graph: Graph, members, mm1: int, mm2: int, x: int, copies) -> None:
    """Every other member is pointwise and feeds the scores' epilogue; nothing follows mm2."""
    feeds_x = ancestors(graph, x) | {x}
    for m in sorted(members - copies - {mm1, mm2}):
        up = ancestors(graph, m)
        if mm2 in up:
            raise FusionRefused(
                f"{describe(graph, m)} follows the second matmul: attention has no epilogue"
            )
        if mm1 not in up and (graph[m].kind != "pointwise" or m not in feeds_x):
            raise FusionRefused(
                f"{describe(graph, m)} is neither on the path between the matmuls nor a "
                "pointwise input of the scores' epilogue (a mask)"
            )


def head_block(d: int) -> int:
    """A head dim's tile width: a power of two, at least 16 (tl.dot); masked past d."""
    return max(16, next_pow2(d))


_FLT_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class ScaleFold:
    """The scores reach softmax as ``casts(selects(qk * scale))``: a positive scalar scale of
    the first matmul and selects of constants (``consts``: the constant node of each select,
    its value in the log2 domain, ``C * log2 e`` kept finite so a row of constants stays
    uniform). The kernel then tracks the row max of ``qk * qk_scale`` (``qk_scale = scale *
    log2 e``) and takes ``p = exp2(qk * qk_scale - m)``: one FMA and an exp2 per score."""

    scale_node: int
    qk_scale: float
    consts: dict[int, float]
    add: int | None = None  # an added mask (a padding mask): its values times log2 e
    bias: int | None = None  # the add's input that is the mask


def scale_fold(graph: Graph, parts: AttentionParts, stored, fused_dtype) -> ScaleFold | None:
    """The fold of the softmax scale into the exp2, when the ops between the first matmul and
    softmax are exactly a positive scalar scale, selects of a constant and casts (computed in
    float32), and softmax's max and sum are not stored (they are of the unscaled scores);
    also with one added tensor that does not read the scores (an additive mask)."""
    if parts.amax in stored or parts.total in stored:
        return None
    i, consts, add, bias = parts.x, {}, None, None
    while True:
        node = graph[i]
        if fused_dtype(node.dtype) != "float32":
            return None
        if node.op == "cast":
            i = graph.base_of(node.inputs[0])
            continue
        if node.op == "add" and add is None and len(node.inputs) == 2:
            a, b = (graph.base_of(j) for j in node.inputs)
            if parts.mm1 in ancestors(graph, a) | {a}:
                a, b = b, a
            if parts.mm1 in ancestors(graph, a) | {a} or graph[a].op == "const" or a == b:
                return None
            add, bias, i = i, a, b
            continue
        if node.op != "where":
            break
        cond, t, f = (graph.base_of(j) for j in node.inputs)
        if parts.mm1 in ancestors(graph, cond) | {cond}:
            return None  # the condition reads the scores: it compares unscaled values
        for c, other in ((t, f), (f, t)):
            if graph[c].op == "const" and graph[other].op != "const" and _users(graph, c) == 1:
                import torch  # the constant as eager rounds it on the way to the softmax input

                v = torch.tensor(float(graph[c].attr("value")), dtype=getattr(torch, node.dtype))
                v = float(v.to(getattr(torch, graph[parts.x].dtype))) * 1.4426950408889634
                consts[c] = v if math.isinf(v) else min(max(v, -_FLT_MAX), _FLT_MAX)
                i = other
                break
        else:
            return None
    node = graph[i]
    if node.op not in ("mul", "div") or len(node.inputs) != 2:
        return None
    a, b = (graph.base_of(j) for j in node.inputs)
    if node.op == "mul" and graph[a].op == "const":
        a, b = b, a
    if a != parts.mm1 or graph[b].op != "const" or graph[a].dtype != node.dtype:
        return None
    c = float(graph[b].attr("value"))
    scale = 1.0 / c if node.op == "div" else c
    if not (math.isfinite(scale) and scale > 0):
        return None
    clamped = [v for v in consts.values() if abs(v) == _FLT_MAX]
    if clamped and len(set(consts.values())) > 1:
        return None  # two constants beyond finfo.max / log2 e would merge
    if _users(graph, i) != 1:
        return None
    return ScaleFold(i, scale * 1.4426950408889634, consts, add, bias)


def _users(graph: Graph, i: int) -> int:
    return sum(graph.base_of(j) == i for n in graph.nodes for j in n.inputs)
