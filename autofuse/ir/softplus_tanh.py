"""``tanh(softplus(x))`` written out (Mish as ``x * tanh(F.softplus(x))``, as models wrote it
before ``F.mish``) by one ``exp`` (an IR -> IR pass).

``softplus`` reaches the IR as ``where(x > 20, x, log1p(exp(x)))``, then ``tanh``: an ``exp``,
a ``log1p`` and the ``tanh`` per element, in every loop that computes it (KernelBench L2_52
normalizes the result by BatchNorm: its statistics' loops and the normalized output each
compute it). With ``u = exp(-|x|)`` the value is the one ``capture/activations.py`` gives
``F.mish``::

    tanh(softplus(x)) = (1 + 2u) / (1 + 2u + 2u^2)      for x >= 0
                      = u (u + 2) / (u (u + 2) + 2)     for x < 0

an identity (``tanh(log(1 + e^x)) = ((1 + e^x)^2 - 1) / ((1 + e^x)^2 + 1)``; past the
threshold, ``tanh(x)`` and the fraction are both 1 in float32), the same values to rounding;
``+inf`` gives 1, ``-inf`` 0, NaN NaN, as eager. Only float32 / float64 graphs and softplus at
its defaults (beta 1, threshold 20) are rewritten; the ``where`` stays where anything else
reads it.
"""

from __future__ import annotations

from dataclasses import replace

from autofuse.ir.graph import Graph, Node, scalar_const
from autofuse.ir.split_variance import prune

__all__ = ["tanh_of_softplus"]

_DTYPES = frozenset({"float32", "float64"})


def _softplus_input(graph: Graph, w: int) -> int | None:
    """``x`` where node ``w`` is ``where(x > 20, x, log1p(exp(x)))``, else None."""
    node = graph[w]
    if node.op != "where" or node.dtype not in _DTYPES:
        return None
    gt, x, lp = node.inputs
    g, l_ = graph[gt], graph[lp]
    if g.op != "gt" or g.inputs[0] != x or scalar_const(graph[g.inputs[1]]) != 20.0:
        return None
    if l_.op != "log1p" or graph[l_.inputs[0]].op != "exp" or graph[l_.inputs[0]].inputs != (x,):
        return None
    return x if graph[x].shape == node.shape and graph[x].dtype == node.dtype else None


def _emit(graph: Graph, t: int, x: int, remap: dict[int, int], nodes: list[Node]) -> int:
    """Append the one-exp form of node ``t`` (``tanh`` of the softplus of ``x``); its index."""
    like = graph[t]

    def add(op: str, *ins: int, dtype: str | None = None) -> int:
        nodes.append(replace(like, op=op, inputs=ins, dtype=dtype or like.dtype, attrs=(),
                             name=f"{like.name}.{op}"))  # fmt: skip
        return len(nodes) - 1

    def const(v: float) -> int:
        nodes.append(Node("const", (), (), like.dtype, (), (("value", v),), f"{like.name}.c"))
        return len(nodes) - 1

    xv, two = remap[x], const(2.0)
    u = add("exp", add("neg", add("abs", xv)))
    pos = add("ge", xv, const(0.0), dtype="bool")
    two_u = add("mul", u, two)
    n = add("where", pos, add("add", two_u, const(1.0)), add("mul", u, add("add", u, two)))
    d = add("where", pos, add("add", n, add("mul", two_u, u)), add("add", n, two))
    return add("div", n, d)


def tanh_of_softplus(graph: Graph) -> Graph:
    """``graph`` with every ``tanh(softplus(x))`` computed by one ``exp`` (the module
    docstring says where); ``graph`` where none."""
    found = {
        t: x
        for t, node in enumerate(graph.nodes)
        if node.op == "tanh" and (x := _softplus_input(graph, node.inputs[0])) is not None
    }
    if not found:
        return graph
    nodes: list[Node] = []
    remap: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        if i in found:
            remap[i] = _emit(graph, i, found[i], remap, nodes)
            continue
        nodes.append(replace(node, inputs=tuple(remap[j] for j in node.inputs)))
        remap[i] = len(nodes) - 1
    out = Graph(tuple(nodes), tuple(remap[i] for i in graph.inputs),
                tuple(remap[o] for o in graph.outputs))  # fmt: skip
    return prune(out)
