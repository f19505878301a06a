"""What AOTAutograd saves for eager-written attention: the row statistics, not the T x T matrix.

Left to itself, the min-cut partitioner saves softmax's output P (batch x heads x T x T) for
the backward (``dV = P^T dO`` and the softmax backward read it), and often the T x T boolean
mask too. That is what flash attention avoids: its forward keeps only the per-row statistics
and its backward recomputes P tile by tile from Q, K and them.

:func:`attention_partition` is the backend's ``partition_fn``: before the min-cut partitioner
runs, it finds each ``softmax(f(q @ k^T)) @ v`` in the joint graph (the decomposed softmax:
``amax``, ``sub``, ``exp``, ``sum``, ``div``, read by a second matmul through casts and views)
and tags the nodes with activation checkpointing's policies: the softmax's max and sum (shape
``(..., T, 1)``) ``MUST_SAVE``; the first matmul, every op between it and the probabilities,
the casts and views on the way to the second matmul, the mask ops computed from constants
alone (aranges, ``full``, comparisons) and the clones repeating grouped-query K / V heads in
front of the matmuls ``MUST_RECOMPUTE``. The forward graph then outputs the
max and sum beside the attention's result (the ``attention`` kernel stores its running max and
sum: no T x T buffer in the forward plan), and the backward graph starts by recomputing
``P = exp(mask(q @ k^T) - max) / sum`` before the softmax backward and the two gradient
matmuls. The softmax backward's row term ``sum(dP * P)`` is rewritten as ``sum(dO * O)``
(``remat_delta.py``: the attention's output is saved, it exists anyway), so that the backward's
``attention_bwd`` kernel reads it as a tensor.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

__all__ = ["AttentionChain", "attention_partition", "find_attention_chains", "tag_chains"]

_aten = torch.ops.aten
_MATMULS = (_aten.bmm.default, _aten.mm.default)
_CASTS = ("convert_element_type", "_to_copy")
_VIEWS = ("view", "_unsafe_view", "reshape", "expand", "unsqueeze", "squeeze", "alias", "clone")


@dataclass(frozen=True)
class AttentionChain:
    """One attention in a joint graph: ``mm2(probs, v)`` with ``probs`` the softmax (``amax``,
    ``total``) of ops on ``mm1``'s output; ``recompute``: the nodes the backward recomputes."""

    mm1: fx.Node
    mm2: fx.Node
    amax: fx.Node
    total: fx.Node
    probs: fx.Node
    recompute: frozenset[fx.Node]


def _name(node: fx.Node) -> str:
    target = node.target
    return getattr(target, "__name__", str(target)).split(".")[0]


def _only_user(node: fx.Node, name: str, first_arg: fx.Node | None = None) -> fx.Node | None:
    for user in node.users:
        if _name(user) == name and (first_arg is None or user.args[0] is first_arg):
            return user
    return None


def _softmax_from_amax(amax: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node] | None:
    """``(exp, total, probs)`` of the decomposed softmax whose max is ``amax``, or None."""
    x = amax.args[0]
    sub = next(
        (u for u in amax.users if _name(u) == "sub" and u.args[0] is x and u.args[1] is amax),
        None,
    )
    exp = _only_user(sub, "exp") if sub is not None else None
    total = _only_user(exp, "sum", exp) if exp is not None else None
    if total is None:
        return None
    probs = next(
        (u for u in exp.users if _name(u) == "div" and u.args[0] is exp and u.args[1] is total),
        None,
    )
    return None if probs is None else (exp, total, probs)


def _second_matmul(probs: fx.Node) -> tuple[fx.Node, list[fx.Node]] | None:
    """The matmul reading ``probs`` as its left operand through casts and views (no
    transpose: the backward's ``P^T dO`` is not it), and the nodes on the way."""
    stack: list[tuple[fx.Node, list[fx.Node]]] = [(probs, [])]
    while stack:
        node, path = stack.pop()
        for user in node.users:
            if user.target in _MATMULS and user.args[0] is node:
                return user, path
            if _name(user) in _CASTS + _VIEWS:
                stack.append((user, [*path, user]))
    return None


def _up_to_matmuls(node: fx.Node) -> set[fx.Node]:
    """``node`` and its ancestors, not walking past a matmul (the matmuls included)."""
    out, stack = {node}, [node]
    while stack:
        for a in stack.pop().all_input_nodes:
            if a not in out:
                out.add(a)
                if a.target not in _MATMULS:
                    stack.append(a)
    return out


def _downstream(start: fx.Node, within: set[fx.Node]) -> set[fx.Node]:
    """``start`` and the nodes of ``within`` it reaches through nodes of ``within``."""
    out, stack = {start}, [start]
    while stack:
        for u in stack.pop().users:
            if u in within and u not in out:
                out.add(u)
                stack.append(u)
    return out


def _operand_copies(operands: Iterable[Any]) -> set[fx.Node]:
    """The views and clones in front of the matmuls' operands (grouped-query heads repeated by
    an expand + clone): recomputed, so the backward gets the unrepeated K / V."""
    out: set[fx.Node] = set()
    for node in operands:
        path: list[fx.Node] = []
        while isinstance(node, fx.Node) and _name(node) in _VIEWS + ("permute", "transpose"):
            path.append(node)
            node = node.args[0]
        if any(_name(n) == "clone" for n in path):
            out.update(path)
    return out


def _constants(graph: fx.Graph) -> set[fx.Node]:
    """The nodes computed from no graph input (aranges, ``full``, scalars, comparisons of
    them): free to recompute anywhere."""
    out: set[fx.Node] = set()
    for n in graph.nodes:  # in topological order
        if n.op == "call_function" and all(a in out for a in n.all_input_nodes):
            out.add(n)
    return out


def _chain(amax: fx.Node, constants: set[fx.Node]) -> AttentionChain | None:
    soft = _softmax_from_amax(amax)
    if soft is None:
        return None
    exp, total, probs = soft
    found = _second_matmul(probs)
    if found is None:
        return None
    mm2, to_mm2 = found
    x = amax.args[0]
    up = _up_to_matmuls(x)
    mms = [n for n in up if n.target in _MATMULS]
    if len(mms) != 1:
        return None
    mm1 = mms[0]
    between = _downstream(mm1, up)
    masks = (up - between) & constants
    sub = exp.args[0]
    operands = _operand_copies([*mm1.all_input_nodes, mm2.args[1]])
    nodes = between | masks | operands | {sub, exp, probs, *to_mm2}
    return AttentionChain(mm1, mm2, amax, total, probs, frozenset(nodes))


def find_attention_chains(graph: fx.Graph) -> list[AttentionChain]:
    """Every ``softmax(f(q @ k^T)) @ v`` of ``graph`` (a joint or forward ATen graph)."""
    constants = _constants(graph)
    out = []
    for amax in graph.find_nodes(op="call_function", target=_aten.amax.default):
        chain = _chain(amax, constants)
        if chain is not None:
            out.append(chain)
    return out


def tag_chains(chains: Iterable[AttentionChain]) -> None:
    """Activation checkpointing's policies on the chains' nodes (see the module docstring)."""
    from torch.utils.checkpoint import CheckpointPolicy

    for c in chains:
        for n in c.recompute:
            n.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
        for n in (c.amax, c.total):
            n.meta["recompute"] = CheckpointPolicy.MUST_SAVE


def _forward_outputs(graph: fx.Graph, num_fwd_outputs: int) -> set[fx.Node]:
    (out,) = graph.find_nodes(op="output")
    values = out.args[0][:num_fwd_outputs]
    return {v for v in values if isinstance(v, fx.Node)}


def attention_partition(
    joint_module: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, **kw: Any
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """``min_cut_rematerialization_partition`` with every attention's T x T tensors
    recomputed in the backward from Q, K, the masks and the softmax's row max and sum. An
    attention whose probabilities (or scores) the forward returns keeps the partitioner's
    choice: they exist anyway."""
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    from .remat_delta import rewrite_deltas

    returned = _forward_outputs(joint_module.graph, num_fwd_outputs)
    chains = find_attention_chains(joint_module.graph)
    chains = [c for c in chains if not (c.recompute | {c.amax, c.total}) & returned]
    tag_chains(chains)
    if rewrite_deltas(joint_module.graph, chains):
        joint_module.recompile()
    return min_cut_rematerialization_partition(
        joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kw
    )
