"""Capture rules for the ops real models use around their arithmetic: concatenation and its
inverses (cat / stack, split / chunk / unbind as slice views), indexing by an index tensor
(gather, advanced indexing, embedding, index_select), constants shaped like a tensor
(full_like / zeros_like / ones_like) and the bool reduction any (``all`` decomposes to it).

Each rule takes the capture builder (``trace._Builder``) and one ATen call and returns the IR
node (or, for a multi-output op, the tuple of nodes its ``getitem`` users pick from), or None
where the call is not one it lowers (it then runs as an opaque eager op).
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from autofuse.capture.rules import converted
from autofuse.ir.graph import FLOAT_DTYPES

INDEX_DTYPES = ("int64", "int32")


def _dtype(t: torch.dtype) -> str:
    return str(t).removeprefix("torch.")


def _dims(dims: Any, ndim: int) -> tuple[int, ...]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted({d % max(ndim, 1) for d in dims}))


def convert_structural(b, packet, overload, args, kwargs, val, out_dtype, name):
    """One ATen call with a tensor result -> an IR node, or None."""
    overloads, rule = _RULES.get(packet, ((), None))
    if overload not in overloads:
        return None
    return rule(b, packet, overload, args, kwargs, val, out_dtype, name)


def _cat(b, packet, overload, args, kwargs, val, out_dtype, name):
    env = b.env
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    # legacy: 1-D empty tensors are skipped by torch.cat whatever the other shapes
    parts = [env[a] for a in args[0] if b.nodes[env[a]].shape != (0,)]
    if not parts or any(isinstance(p, tuple) for p in parts):
        return None
    dim = dim % len(val.shape)
    if len(parts) == 1:
        return b.like("cast", parts, val, name, dtype=out_dtype)
    return b.like("cat", parts, val, name, dim=dim)


def _zero_dim(b, *nodes: int) -> bool:
    """Whether a gather's or scatter's tensor is 0-d: its ``dim`` 0 names no dim of the
    tensor (torch takes it as one of size 1), so the op runs as eager's."""
    return any(not b.nodes[i].shape for i in nodes)


def _gather(b, packet, overload, args, kwargs, val, out_dtype, name):
    if kwargs.get("sparse_grad"):
        return None
    src, idx = b.env[args[0]], b.env[args[2]]
    if b.nodes[idx].dtype not in INDEX_DTYPES or _zero_dim(b, src, idx):
        return None
    dim = args[1] % max(len(b.nodes[src].shape), 1)
    return b.like("gather", (src, idx), val, name, dim=dim)


def _index_select(b, packet, overload, args, kwargs, val, out_dtype, name):
    env = b.env
    if packet == "embedding":
        src, idx, dim = env[args[0]], env[args[1]], 0
    else:
        src, idx = env[args[0]], env[args[2]]
        dim = args[1] % max(len(b.nodes[src].shape), 1)
    if b.nodes[idx].dtype not in INDEX_DTYPES or not b.nodes[src].shape:
        return None
    return b.like("take", (src, idx), val, name, dim=dim, wrap=False)


def _index(b, packet, overload, args, kwargs, val, out_dtype, name):
    """Index tensors (after any number of full slices, given as None), broadcast together: an
    indirect read; a bool mask (data-dependent shape) stays opaque."""
    env = b.env
    given = [(d, env[a]) for d, a in enumerate(args[1]) if a is not None]
    if not given or any(b.nodes[i].dtype not in INDEX_DTYPES for _, i in given):
        return None
    src, dims = env[args[0]], tuple(d for d, _ in given)
    idxs = tuple(i for _, i in given)
    if len(given) == 1:
        return b.like("take", (src, *idxs), val, name, dim=dims[0], wrap=True)
    return b.like("take", (src, *idxs), val, name, dim=dims[0], dims=dims, wrap=True)


def _index_put(b, packet, overload, args, kwargs, val, out_dtype, name):
    env = b.env
    given = [(d, env[a]) for d, a in enumerate(args[1]) if a is not None]
    if not given or any(b.nodes[i].dtype not in INDEX_DTYPES for _, i in given):
        return None  # a bool mask: opaque
    accumulate = bool(args[3] if len(args) > 3 else kwargs.get("accumulate", False))
    where = {"dims": tuple(d for d, _ in given), "along": None}
    idxs = tuple(i for _, i in given)
    return _put(b, env[args[0]], env[args[2]], idxs, val, out_dtype, name, accumulate, where)


def _scatter(b, packet, overload, args, kwargs, val, out_dtype, name):
    if kwargs.get("reduce") is not None or len(args) < 4:
        return None
    idx = b.env[args[2]]
    if b.nodes[idx].dtype not in INDEX_DTYPES or _zero_dim(b, b.env[args[0]], idx):
        return None
    values = b.operand(args[3], out_dtype, name + "_value")
    where = {"dims": None, "along": args[1] % max(len(val.shape), 1)}
    accumulate = packet == "scatter_add"
    return _put(b, b.env[args[0]], values, (idx,), val, out_dtype, name, accumulate, where)


def _full_like(b, packet, overload, args, kwargs, val, out_dtype, name):
    value = {"zeros_like": 0, "ones_like": 1}.get(packet, args[1] if len(args) > 1 else None)
    if not isinstance(value, numbers.Number):
        return None
    v = converted(value, out_dtype)  # as eager stores it: wrapped, rounded
    v = float(v) if out_dtype in FLOAT_DTYPES else v
    v = bool(v) if out_dtype == "bool" else v
    return b.shaped("const", (), tuple(val.shape), out_dtype, name, value=v)


def _any(b, packet, overload, args, kwargs, val, out_dtype, name):
    x = b.env[args[0]]
    ndim = len(b.nodes[x].shape)
    dims = _dims(args[1] if len(args) > 1 else kwargs.get("dim"), ndim)
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    if overload == "default" or not ndim:
        dims, keepdim = tuple(range(ndim)), False
    if not dims:  # a 0-d tensor: any / all is its truth value
        return b.like("ne", (x, b.const(0, b.nodes[x].dtype, name + "_zero")), val, name)
    return b.like(packet, (x,), val, name, dims=dims, keepdim=bool(keepdim))


def _put(b, base, values, idxs, val, out_dtype, name, accumulate, where) -> int | None:
    """``base`` with ``values`` put (``accumulate``: added) at the indexed places: a scatter
    node (a zero tensor written at those places, kernels/scatter/kind.py) and, unless ``base`` is a
    zero constant, ``base + scatter`` or ``where(written, scatter, base)`` (``written``: a
    bool scatter of True). Float sums accumulate in fp32 (a 16-bit result is a cast of it)."""
    if out_dtype == "bool" and accumulate:
        return None
    shape = tuple(val.shape)
    bn = b.nodes[base]
    zero = bn.op == "const" and bn.attr("value") == 0
    low = out_dtype in ("float16", "bfloat16")
    if accumulate:
        acc_dt = "float32" if low else out_dtype
        acc = b.shaped("scatter", (values, *idxs), shape, acc_dt, name + "_acc", accumulate=True,
                       **where)  # fmt: skip
        if not zero:
            acc = b.shaped("add", (base, acc), shape, acc_dt, name + "_add")
        return b.shaped("cast", (acc,), shape, out_dtype, name, dtype=out_dtype) if low else acc
    put = b.shaped("scatter", (values, *idxs), shape, out_dtype, name + "_put", accumulate=False,
                   **where)  # fmt: skip
    if zero:
        return put
    one = b.const(True, "bool", name + "_true")
    written = b.shaped("scatter", (one, *idxs), shape, "bool", name + "_written",
                       accumulate=False, **where)  # fmt: skip
    return b.shaped("where", (written, put, base), shape, out_dtype, name)


def convert_multi(
    b, packet, overload, args, kwargs, val, name, used=frozenset()
) -> tuple[int | None, ...] | None:
    """A multi-output view op (split, split_with_sizes, unbind) -> one view node per output,
    for ``getitem`` to pick; ``max.dim`` / ``min.dim`` -> (amax, argmax) / (amin, argmin);
    None for anything else. ``used``: the outputs the graph reads (only those are built for
    ``max.dim``: the values of ``_, i = x.max(-1)`` are never computed)."""
    if packet in ("max", "min") and overload == "dim":
        return _max_min_dim(b, packet, args, kwargs, val, name, used)
    if packet not in ("split", "split_with_sizes", "unbind") or not isinstance(val, (list, tuple)):
        return None
    src = b.env[args[0]]
    if isinstance(src, tuple):
        return None
    shape = b.nodes[src].shape
    if packet == "unbind":
        dim = (args[1] if len(args) > 1 else kwargs.get("dim", 0)) % len(shape)
        out = []
        for k, v in enumerate(val):
            kept = shape[:dim] + (1,) + shape[dim + 1 :]
            s = b.view("slice", src, kept, f"{name}_{k}_s", dim=dim, start=k, step=1)
            out.append(b.view("reshape", s, v.shape, f"{name}_{k}", shape=tuple(v.shape)))
        return tuple(out)
    dim = (args[2] if len(args) > 2 else kwargs.get("dim", 0)) % len(shape)
    out, start = [], 0
    for k, v in enumerate(val):
        out.append(b.view("slice", src, v.shape, f"{name}_{k}", dim=dim, start=start, step=1))
        start += v.shape[dim]
    return tuple(out)


def _max_min_dim(b, packet, args, kwargs, val, name, used) -> tuple[int | None, ...] | None:
    """``torch.max(x, dim)``: the row's max (NaN if the row has one) and the index of its first
    max (of its first NaN), as eager."""
    src = b.env[args[0]]
    if isinstance(src, tuple) or len(val) != 2 or not b.nodes[src].shape:
        return None
    if b.nodes[src].dtype == "bool":
        return None
    dim = (args[1] if len(args) > 1 else kwargs["dim"]) % len(b.nodes[src].shape)
    keepdim = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    values, indices = val
    red, arg = ("amax", "argmax") if packet == "max" else ("amin", "argmin")
    attrs = {"dims": (dim,), "keepdim": keepdim}
    return (
        b.like(red, (src,), values, f"{name}_values", **attrs) if 0 in used else None,
        b.like(arg, (src,), indices, f"{name}_indices", **attrs) if 1 in used else None,
    )


def mutates(gm: torch.fx.GraphModule) -> bool:
    """The traced graph holds an in-place ATen op (``add_``, ``copy_`` into a view...)."""
    for n in gm.graph.nodes:
        schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
        if schema is not None and schema.is_mutable:
            return True
    return False


def _slice_scatter(b, packet, overload, args, kwargs, val, out_dtype, name):
    """``slice_scatter(base, src, dim, start, end, 1)`` (a slice's backward: ``base`` is zeros;
    RoPE's ``rotate_half``) as ``cat`` of base's slice before, ``src``, base's slice after:
    views and one concatenation, fused like any cat. Other steps stay eager."""
    base, src = b.env[args[0]], b.env[args[1]]
    rest = list(args[2:]) + [None] * 4
    dim = kwargs.get("dim", rest[0] if rest[0] is not None else 0)
    start, end = kwargs.get("start", rest[1]), kwargs.get("end", rest[2])
    step = kwargs.get("step", rest[3] if rest[3] is not None else 1)
    shape = b.nodes[base].shape
    if step != 1 or not shape:
        return None
    dim %= len(shape)
    size = shape[dim]
    lo = 0 if start is None else (start + size if start < 0 else start)
    hi = size if end is None else (end + size if end < 0 else end)
    lo = max(0, min(lo, size))
    hi = max(lo, min(hi, size))  # an end before the start: an empty slice at ``lo``
    if b.nodes[src].shape[dim] != max(hi - lo, 0):
        return None
    parts = []
    for a, z in ((0, lo), (hi, size)):
        if z > a:
            piece = tuple(z - a if d == dim else n for d, n in enumerate(shape))
            parts.append(b.view("slice", base, piece, f"{name}_{a}", dim=dim, start=a, step=1))
    if hi > lo:
        parts.insert(1 if lo > 0 else 0, src)
    if not parts:  # an empty ``base`` (nothing before, in or after the slice): the result is it
        parts = [base]
    if len(parts) == 1:
        return b.like("cast", parts, val, name, dtype=_dtype(val.dtype))
    return b.like("cat", parts, val, name, dim=dim)


# packet -> (the overloads a rule lowers, the rule)
_RULES = {
    "cat": (("default",), _cat),
    "slice_scatter": (("default",), _slice_scatter),
    "gather": (("default",), _gather),
    "index_select": (("default",), _index_select),
    "embedding": (("default",), _index_select),
    "index": (("Tensor",), _index),
    "index_put": (("default",), _index_put),
    "_unsafe_index_put": (("default",), _index_put),
    "scatter": (("default", "src", "value"), _scatter),
    "scatter_add": (("default", "src", "value"), _scatter),
    "full_like": (("default",), _full_like),
    "zeros_like": (("default",), _full_like),
    "ones_like": (("default",), _full_like),
    "any": (("default", "dim", "dims"), _any),
}
