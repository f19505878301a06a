"""Inference BatchNorm folded into the convolution before it (an IR -> IR pass).

Capture writes BatchNorm in eval mode as ``y * scale + shift`` per channel, ``scale`` and
``shift`` [C] vectors computed in float32 from the parameters and running statistics
(``capture/convolution.py``: ``scale = weight * rsqrt(running_var + eps)``). Where ``y`` is a
convolution (its peeled bias added or not) read by nothing else, the scale goes into the
convolution's weight and the shift into its bias::

    c = conv(x, w);  a = c + b;  y = a * scale + shift
    ->
    w' = (w * scale per output channel) in w's dtype   # weight-sized: one small kernel
    b' = b * scale + shift                              # [C]
    c' = conv(x, w');  y' = c' + b'                     # the add joins the epilogue kernel

The folded weight and bias are computed in the graph from the parameters on every call (never
stored), so the plan stays right when the module's weights or statistics change; training
graphs hold batch statistics (reductions of the convolution's own output), not this pattern,
and keep BatchNorm's semantics. A transposed convolution's weight is [C_in, C_out / groups,
...]: the scale is applied per group on its second dim. With ``AUTOFUSE_CONV_BIAS=library``
the folded bias goes into the library call instead. The new convolution node carries
``folded="batchnorm"`` (what ``explain`` reports).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from autofuse.ir.graph import Graph, Node, contiguous_strides, make_attrs, numel
from autofuse.settings import settings

__all__ = [
    "CONVOLUTION",
    "Fold",
    "bias_add_of",
    "bias_adds_of",
    "find_folds",
    "fold_batchnorm",
    "is_convolution",
]

CONVOLUTION = "aten.convolution.default"


@dataclass(frozen=True)
class Fold:
    """One convolution -> per-channel scale and shift: the nodes the pass replaces."""

    conv: int
    bias: int | None  # the [C] bias vector: of the peeled add, or the library call's input
    bias_add: int | None  # the peeled bias add (None: none, or the bias is in the call)
    mul: int
    add: int  # the pattern's result, replaced by the folded one
    scale: int  # [C] vectors (bases of the broadcast views)
    shift: int


def _only_user(graph: Graph, i: int, outputs: frozenset[int]) -> int | None:
    users = graph.users[i]
    return users[0] if len(users) == 1 and i not in outputs else None


def _channel_vector(graph: Graph, i: int, ndim: int, c: int) -> int | None:
    """The base of ``i`` when ``i`` is a view of a float vector of ``c`` elements broadcast
    over dim 1 of a ``ndim``-D tensor ([C] -> [1, C, 1, ...] or [C, 1, ...])."""
    shape = (1,) * (ndim - len(graph[i].shape)) + tuple(graph[i].shape)
    if len(shape) != ndim or shape != (1, c) + (1,) * (ndim - 2):
        return None
    base = graph.base_of(i)
    node = graph[base]
    if node.dtype not in ("float32", "float64", "float16", "bfloat16") or numel(node.shape) != c:
        return None
    return base if sum(s > 1 for s in node.shape) <= 1 else None


def _other(graph: Graph, i: int, known: int) -> int | None:
    ins = graph[i].inputs
    if len(ins) != 2 or known not in ins:
        return None
    return ins[1] if ins[0] == known else ins[0]


def is_convolution(node: Node) -> bool:
    """An ``aten.convolution`` the plan runs as a library call."""
    return node.op == "opaque" and node.attr("target") == CONVOLUTION and not node.attr("multi")


def bias_add_of(graph: Graph, conv: int) -> int | None:
    """The add of a per-channel bias vector that is the only reader of convolution ``conv``'s
    output (its peeled or folded bias), if there is one."""
    node = graph[conv]
    add = _only_user(graph, conv, frozenset(graph.outputs))
    if add is None or graph[add].op != "add" or len(node.shape) < 3:
        return None
    other = _other(graph, add, conv)
    if other is None or graph[add].shape != node.shape:
        return None
    vector = _channel_vector(graph, other, len(node.shape), node.shape[1])
    return add if vector is not None else None


def bias_adds_of(graph: Graph, conv: int) -> tuple[int, ...]:
    """The adds of convolution ``conv``'s peeled bias: its only reader's, or, where the add was
    copied for readers that compute it again (``ir/recompute.py``), every copy's; () where a
    reader is anything else."""
    add = bias_add_of(graph, conv)
    if add is not None:
        return (add,)
    adds = tuple(graph.users[conv])
    if len(adds) < 2 or conv in graph.outputs:
        return ()
    first = graph[adds[0]]
    for u in adds:
        node = graph[u]
        same = node.op == "add" and node.inputs == first.inputs and node.shape == graph[conv].shape
        if not same:
            return ()
    other = _other(graph, adds[0], conv)
    ok = other is not None and _channel_vector(graph, other, len(graph[conv].shape),
                                               graph[conv].shape[1]) is not None  # fmt: skip
    return adds if ok else ()


def _has_rsqrt(graph: Graph, i: int, depth: int = 4) -> bool:
    """Whether the scale is an inverse standard deviation (BatchNorm's): an ``rsqrt`` within a
    few pointwise steps."""
    node = graph[i]
    if node.op == "rsqrt":
        return True
    if depth == 0 or node.kind not in ("pointwise", "view"):
        return False
    return any(_has_rsqrt(graph, j, depth - 1) for j in node.inputs)


def _match(graph: Graph, y: int, outputs: frozenset[int]) -> Fold | None:
    node = graph[y]
    if node.op != "add" or len(node.inputs) != 2 or len(node.shape) < 3:
        return None
    ndim, c = len(node.shape), node.shape[1]
    for p, tv in (node.inputs, node.inputs[::-1]):
        if graph[p].op != "mul" or _only_user(graph, p, outputs) != y:
            continue
        if graph[p].shape != node.shape:
            continue
        shift = _channel_vector(graph, tv, ndim, c)
        for x, sv in (graph[p].inputs, graph[p].inputs[::-1]):
            scale = _channel_vector(graph, sv, ndim, c)
            if shift is None or scale is None or not _has_rsqrt(graph, scale):
                continue
            fold = _conv_of(graph, x, p, outputs, c)
            if fold is not None:
                return replace(fold, mul=p, add=y, scale=scale, shift=shift)
    return None


def _conv_of(graph: Graph, x: int, p: int, outputs, c: int) -> Fold | None:
    """The convolution ``x`` is (or whose peeled bias add ``x`` is), read only on the way to
    the mul ``p``."""
    if _only_user(graph, x, outputs) != p or graph[x].shape != graph[p].shape:
        return None
    if is_convolution(graph[x]):
        if not _encoded_ok(graph, graph[x], c):
            return None
        bias = graph[x].inputs[2] if graph[x].attr("args")[2][2] is not None else None
        return Fold(x, bias, None, p, p, -1, -1)
    if graph[x].op != "add":
        return None
    for conv in graph[x].inputs:
        if not is_convolution(graph[conv]) or bias_add_of(graph, conv) != x:
            continue
        if _encoded_ok(graph, graph[conv], c) and graph[conv].attr("args")[2][2] is None:
            bias = graph.base_of(_other(graph, x, conv))
            return Fold(conv, bias, x, p, p, -1, -1)
    return None


def _encoded_ok(graph: Graph, conv: Node, c: int) -> bool:
    """The convolution's arguments as capture encodes them (x and w its first two inputs, the
    bias if any its third, transposed and groups plain values) and ``c`` output channels."""
    args = conv.attr("args")
    if not (isinstance(args, tuple) and args[0] == "__seq__" and len(args[2]) == 9):
        return False
    items = args[2]
    bias_ok = items[2] is None or items[2] == ("__node__", 2)
    if not (
        items[0] == ("__node__", 0)
        and items[1] == ("__node__", 1)
        and bias_ok
        and isinstance(items[6], bool)
        and isinstance(items[8], int)
        and items[8] > 0
    ):
        return False
    wshape = graph[conv.inputs[1]].shape if len(conv.inputs) >= 2 else ()
    if len(wshape) < 3:
        return False
    return (wshape[1] * items[8] if items[6] else wshape[0]) == c


def find_folds(graph: Graph) -> list[Fold]:
    """Every convolution followed by an inference BatchNorm's scale and shift."""
    outputs = frozenset(graph.outputs)
    folds = []
    for i, node in enumerate(graph.nodes):
        if node.op == "add":
            fold = _match(graph, i, outputs)
            if fold is not None:
                folds.append(fold)
    return folds


def fold_batchnorm(graph: Graph, bias_in_call: bool | None = None) -> Graph:
    """``graph`` with every :func:`find_folds` pattern replaced by the convolution on folded
    weights and its folded bias (added by a pointwise op, or inside the library call when
    ``bias_in_call``; None: where the settings put a convolution's bias,
    ``AUTOFUSE_CONV_BIAS``); the graph itself when there is none."""
    if bias_in_call is None:
        bias_in_call = settings().conv_bias == "library"
    folds = {f.add: f for f in find_folds(graph)}
    if not folds:
        return graph
    dead = {i for f in folds.values() for i in (f.conv, f.bias_add, f.mul, f.add) if i is not None}
    nodes: list[Node] = []
    remap: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        if i in folds:
            remap[i] = _emit(graph, folds[i], nodes, remap, bias_in_call)
        elif i not in dead:
            nodes.append(replace(node, inputs=tuple(remap[j] for j in node.inputs)))
            remap[i] = len(nodes) - 1
    return _drop_dead_views(
        Graph(tuple(nodes), tuple(remap[i] for i in graph.inputs),
              tuple(remap[o] for o in graph.outputs))
    )  # fmt: skip


def _drop_dead_views(graph: Graph) -> Graph:
    """Views and constants nothing reads (the broadcasts of the folded vectors) removed."""
    keep = [True] * len(graph.nodes)
    outputs = set(graph.outputs)
    for i in range(len(graph.nodes) - 1, -1, -1):
        node = graph[i]
        if node.kind == "view" or node.op == "const":
            used = any(keep[u] for u in graph.users[i])
            keep[i] = used or i in outputs
    remap: dict[int, int] = {}
    nodes: list[Node] = []
    for i, node in enumerate(graph.nodes):
        if keep[i]:
            nodes.append(replace(node, inputs=tuple(remap[j] for j in node.inputs)))
            remap[i] = len(nodes) - 1
    return Graph(
        tuple(nodes), tuple(remap[i] for i in graph.inputs), tuple(remap[o] for o in graph.outputs)
    )


def _promote(*dtypes: str) -> str:
    out = getattr(torch, dtypes[0])
    for d in dtypes[1:]:
        out = torch.promote_types(out, getattr(torch, d))
    return str(out).removeprefix("torch.")


class _Emitter:
    """Appends new nodes (contiguous results) to ``nodes``."""

    def __init__(self, nodes: list[Node], name: str) -> None:
        self.nodes, self.name = nodes, name

    def __call__(self, op: str, inputs: tuple[int, ...], out_shape, dtype: str, tag: str, /,
                 **attrs) -> int:  # fmt: skip
        shape = tuple(int(s) for s in out_shape)
        node = Node(op, inputs, shape, dtype, contiguous_strides(shape), make_attrs(**attrs),
                    f"{self.name}.{tag}")  # fmt: skip
        self.nodes.append(node)
        return len(self.nodes) - 1

    def vector(self, i: int, c: int) -> int:
        """Node ``i`` (``c`` elements) as a [C] vector."""
        if tuple(self.nodes[i].shape) == (c,):
            return i
        return self("reshape", (i,), (c,), self.nodes[i].dtype, "vector", shape=(c,))

    def binary(self, op: str, a: int, b: int, shape, tag: str) -> int:
        return self(op, (a, b), shape, _promote(self.nodes[a].dtype, self.nodes[b].dtype), tag)

    def cast(self, i: int, dtype: str, tag: str) -> int:
        if self.nodes[i].dtype == dtype:
            return i
        return self("cast", (i,), self.nodes[i].shape, dtype, tag, dtype=dtype)


def _folded_weight(emit: _Emitter, conv: Node, w: int, scale: int, c: int) -> int:
    """``w`` scaled per output channel, in ``w``'s dtype."""
    wnode = emit.nodes[w]
    items = conv.attr("args")[2]
    transposed, groups, rest = items[6], items[8], (1,) * (len(wnode.shape) - 2)
    if not transposed:
        sshape = (c, 1, *rest)
        sv = emit("reshape", (scale,), sshape, emit.nodes[scale].dtype, "scale_w", shape=sshape)
        prod = emit.binary("mul", w, sv, wnode.shape, "weight_scaled")
    else:
        cin, kshape = wnode.shape[0], tuple(wnode.shape[2:])
        grouped = (groups, cin // groups, c // groups, *kshape)
        wv = emit("reshape", (w,), grouped, wnode.dtype, "weight_groups", shape=grouped)
        sshape = (groups, 1, c // groups, *(1,) * len(kshape))
        sv = emit("reshape", (scale,), sshape, emit.nodes[scale].dtype, "scale_w", shape=sshape)
        prod = emit.binary("mul", wv, sv, grouped, "weight_scaled")
        prod = emit("reshape", (prod,), wnode.shape, emit.nodes[prod].dtype, "weight_back",
                    shape=tuple(wnode.shape))  # fmt: skip
    return emit.cast(prod, wnode.dtype, "weight_folded")


def _emit(graph: Graph, f: Fold, nodes: list[Node], remap: dict[int, int], in_call: bool) -> int:
    """The folded convolution and its bias for ``f``, appended to ``nodes``: the node that
    takes the place of ``f.add``."""
    conv, y = graph[f.conv], graph[f.add]
    c = y.shape[1]
    emit = _Emitter(nodes, conv.name)
    scale = emit.vector(remap[f.scale], c)
    shift = emit.vector(remap[f.shift], c)
    weight = _folded_weight(emit, conv, remap[conv.inputs[1]], scale, c)
    bias = shift
    if f.bias is not None:
        b = emit.vector(remap[f.bias], c)
        bias = emit.binary("add", emit.binary("mul", b, scale, (c,), "bias_scaled"), shift,
                           (c,), "bias_folded")  # fmt: skip
    items = list(conv.attr("args")[2])
    inputs = [remap[conv.inputs[0]], weight]
    if in_call:
        inputs.append(emit.cast(bias, conv.dtype, "bias_call"))
        items[2] = ("__node__", 2)
    else:
        items[2] = None
    attrs = dict(conv.attrs, args=("__seq__", "tuple", tuple(items)), folded="batchnorm")
    nodes.append(replace(conv, inputs=tuple(inputs), attrs=make_attrs(**attrs)))
    out = len(nodes) - 1
    if not in_call:
        view = (1, c) + (1,) * (len(y.shape) - 2)
        bv = emit("reshape", (bias,), view, nodes[bias].dtype, "bias_view", shape=view)
        out = emit.binary("add", out, bv, y.shape, "bias_add")
    return emit.cast(out, y.dtype, "out")
