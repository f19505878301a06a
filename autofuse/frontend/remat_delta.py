"""The softmax backward's row term as flash attention computes it: ``rowsum(dO * O)``.

The decomposed softmax backward of ``P = softmax(x)`` reads ``delta = sum(dP * P, -1)`` with
``dP = dO @ V^T``: a row sum over every key, which a kernel tiled over the keys cannot finish
before it needs it. Since ``O = P @ V``, ``sum_j P_ij dP_ij = sum_d dO_id O_id``: the same row
term from the attention's output and its gradient, two (batch x heads x T x head dim) tensors.

:func:`rewrite_deltas` replaces, in a joint graph, each such ``sum(dP * P)`` of an attention
chain (``remat.AttentionChain``) by ``sum(float(dO) * float(O))`` (reshaped to the old sum's
shape); the attention's output is then saved for the backward (``MUST_SAVE``: it exists anyway)
and its float copy recomputed there. The backward graph then computes delta with one small
reduction and the ``attention_bwd`` kernel (``kernels/attention_bwd/emit.py``) reads it as a tensor.
A ``dP`` that is not exactly ``dO @ V^T`` (P read elsewhere too: its gradient is a sum) is left
alone.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

_aten = torch.ops.aten
_CASTS = ("convert_element_type", "_to_copy")
_VIEWS = ("view", "_unsafe_view", "reshape", "expand", "alias", "clone")


def _name(node: Any) -> str:
    target = getattr(node, "target", None)
    return getattr(target, "__name__", str(target)).split(".")[0]


def _through(node: Any, names: tuple[str, ...]) -> Any:
    """``node`` followed back through ops named ``names`` (their first argument)."""
    while isinstance(node, fx.Node) and _name(node) in names:
        node = node.args[0]
    return node


def _dp_matmul(node: Any, mm2: fx.Node) -> fx.Node | None:
    """The ``bmm(dO, V^T)`` that ``node`` is (through casts and views), V being mm2's right
    operand, or None."""
    node = _through(node, _CASTS + _VIEWS)
    if not isinstance(node, fx.Node) or node.target not in (_aten.bmm.default, _aten.mm.default):
        return None
    vt = node.args[1]
    if not (isinstance(vt, fx.Node) and _name(vt) in ("permute", "transpose", "t")):
        return None
    return node if vt.args[0] is mm2.args[1] else None


def _is_row_sum(node: fx.Node) -> bool:
    if node.target is not _aten.sum.dim_IntList or len(node.args) < 3 or not node.args[2]:
        return False
    dims = node.args[1]
    rank = node.args[0].meta["val"].dim()
    return list(dims) in ([-1], [rank - 1])


def _delta_sum(chain: Any) -> tuple[fx.Node, fx.Node] | None:
    """The ``sum(dP * P, -1, keepdim)`` of the chain's softmax backward and its dP matmul."""
    views, todo = {chain.probs}, [chain.probs]
    while todo:  # probs, its aliases and casts (a bf16 softmax's output, upcast again)
        for u in todo.pop().users:
            if _name(u) in _VIEWS + _CASTS and u not in views:
                views.add(u)
                todo.append(u)
    for p in views:
        for mul in p.users:
            if mul.target is not _aten.mul.Tensor or len(mul.args) != 2:
                continue
            a, b = mul.args
            other = b if a in views else a if b in views else None
            mm = _dp_matmul(other, chain.mm2) if other is not None else None
            if mm is None:
                continue
            for s in mul.users:
                if _is_row_sum(s) and s.args[0] is mul:
                    return s, mm
    return None


def _fake(fn, *args: Any, **kw: Any) -> Any:
    vals = [a.meta["val"] if isinstance(a, fx.Node) else a for a in args]
    return fn(*vals, **kw)


def _cast(graph: fx.Graph, x: fx.Node, dtype: torch.dtype) -> fx.Node:
    if x.meta["val"].dtype == dtype:
        return x
    y = graph.call_function(_aten._to_copy.default, (x,), {"dtype": dtype})
    y.meta["val"] = _fake(_aten._to_copy.default, x, dtype=dtype)
    return y


def rewrite_deltas(graph: fx.Graph, chains: list[Any]) -> list[fx.Node]:
    """Rewrite each chain's ``sum(dP * P)`` as ``sum(dO * O)`` (see the module docstring);
    returns the float copies of ``O`` made (to be recomputed in the backward)."""
    from torch.utils.checkpoint import CheckpointPolicy

    made: list[fx.Node] = []
    for c in chains:
        found = _delta_sum(c)
        if found is None:
            continue
        old, dp_mm = found
        d_out, out = dp_mm.args[0], c.mm2
        dtype = old.meta["val"].dtype
        if d_out.meta["val"].shape != out.meta["val"].shape:
            continue
        with graph.inserting_before(old):
            a, b = (_cast(graph, x, dtype) for x in (d_out, out))
            if b is not out:
                made.append(b)
            mul = graph.call_function(_aten.mul.Tensor, (a, b))
            mul.meta["val"] = _fake(_aten.mul.Tensor, a, b)
            s = graph.call_function(_aten.sum.dim_IntList, (mul, [-1], True))
            s.meta["val"] = _fake(_aten.sum.dim_IntList, mul, [-1], True)
            shape = list(old.meta["val"].shape)
            new = graph.call_function(_aten.view.default, (s, shape))
            new.meta["val"] = _fake(_aten.view.default, s, shape)
        old.replace_all_uses_with(new)
        graph.erase_node(old)
        out.meta["recompute"] = CheckpointPolicy.MUST_SAVE
        for n in made:
            n.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
    return made
