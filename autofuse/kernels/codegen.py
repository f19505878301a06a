"""Codegen: one fusion group + one launch config -> the source of one Triton kernel.

``analyze_group`` decides whether a set of nodes can share one kernel (and raises
:class:`FusionRefused` with the reason when it cannot); ``generate`` renders the kernel.

Every node of a group is a function of an index. A kernel iterates over its domain (the output
shape of a pointwise group; rows x reduced elements for a reduction group) and evaluates each
stored node at the domain index: a node read from memory is a ``tl.load`` whose offset is the index
pushed back through any view ops, a pointwise node applies its op to its inputs' values, and a
reduction node is the result of an earlier phase of the kernel. Reductions run in phases by
dependency level (softmax: max, then sum); a *persistent* kernel holds a whole row in one block,
a *looped* one walks the row in RBLOCK chunks and recomputes what each phase needs from its loads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from autofuse.ir.graph import FLOAT_DTYPES, Graph, contiguous_strides, numel
from autofuse.ir.indexing import Expr, linearize


class FusionRefused(Exception):
    """A group that cannot be one kernel; ``reason`` says why (the report shows it)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# ---------------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class KernelConfig:
    """Launch parameters: XBLOCK elements (or rows) per program, RBLOCK reduced elements per
    step (0 for pointwise kernels), num_warps."""

    XBLOCK: int
    RBLOCK: int = 0
    num_warps: int = 4
    # persistent reductions: issue every load at the top of the kernel, so the loads used only
    # after a reduction (a norm's weight and bias) are in flight while it runs
    HOIST: bool = False

    def label(self) -> str:
        r = f" RBLOCK={self.RBLOCK}" if self.RBLOCK else ""
        return f"XBLOCK={self.XBLOCK}{r} num_warps={self.num_warps}" + (
            " HOIST" if self.HOIST else ""
        )


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


# ---------------------------------------------------------------------------------------------
# Group analysis
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupInfo:
    nodes: tuple[int, ...]
    kind: str  # "pointwise" | "reduction"
    domain: tuple[int, ...]  # full iteration shape
    reduce_dims: tuple[int, ...]  # reduced positions of ``domain`` (empty for pointwise)
    stored: tuple[int, ...]  # members written to memory
    loads: tuple[int, ...]  # base nodes read from memory
    matmuls: tuple[int, ...] = ()  # GEMM groups: the mm/bmm nodes (two for a horizontal pair)

    @property
    def xnumel(self) -> int:
        return numel(s for i, s in enumerate(self.domain) if i not in self.reduce_dims)

    @property
    def rnumel(self) -> int:
        return numel(self.domain[i] for i in self.reduce_dims) if self.reduce_dims else 1


def stored_nodes(graph: Graph, members: frozenset[int]) -> tuple[int, ...]:
    outputs = {graph.base_of(o) for o in graph.outputs}
    stored = []
    for m in sorted(members):
        users = graph.compute_users[m]
        if m in outputs or any(u not in members for u in users):
            stored.append(m)
    return tuple(stored)


INLINE_OPS = ("const", "iota")  # computed where they are read; never loaded, never a group


def loaded_nodes(graph: Graph, members: frozenset[int]) -> tuple[int, ...]:
    loads: dict[int, None] = {}
    for m in sorted(members):
        for j in graph.compute_inputs(m):
            if j not in members and graph[j].op not in INLINE_OPS:
                loads[j] = None
    return tuple(loads)


def _describe(graph: Graph, i: int) -> str:
    n = graph[i]
    return f"{n.op} %{i} ({n.name or n.op}, {list(n.shape)})"


def analyze_group(graph: Graph, group: frozenset[int] | set[int]) -> GroupInfo:
    """Check that ``group`` can be one kernel; raise FusionRefused naming the reason if not."""
    members = frozenset(group)
    for m in sorted(members):
        if graph[m].kind not in ("pointwise", "reduction", "matmul"):
            target = graph[m].attr("target", graph[m].op)
            raise FusionRefused(
                f"{_describe(graph, m)} is an unsupported op ({target}) and runs in eager"
            )
    if any(graph[m].kind == "matmul" for m in members):
        from autofuse.kernels.gemm import analyze_gemm_group, analyze_gemm_row_group

        if any(graph[m].kind == "reduction" for m in members):
            return analyze_gemm_row_group(graph, members)
        return analyze_gemm_group(graph, members)
    stored = stored_nodes(graph, members)
    if not stored:
        raise FusionRefused("group has no output")
    reductions = [m for m in sorted(members) if graph[m].kind == "reduction"]
    if not reductions:
        shapes = {graph[s].shape for s in stored}
        if len(shapes) > 1:
            a, b = sorted(shapes)[:2]
            raise FusionRefused(
                f"outputs of different shapes {list(a)} and {list(b)} cannot share one loop"
            )
        domain, rdims = graph[stored[0]].shape, ()
    else:
        domain, rdims = _reduction_domain(graph, reductions)
        _check_stored_shapes(graph, stored, domain, rdims)
    info = GroupInfo(
        nodes=tuple(sorted(members)),
        kind="reduction" if reductions else "pointwise",
        domain=tuple(domain),
        reduce_dims=tuple(rdims),
        stored=stored,
        loads=loaded_nodes(graph, members),
    )
    _Emitter(graph, info, KernelConfig(16, 16 if reductions else 0)).emit()  # index checks
    return info


def _reduction_domain(
    graph: Graph, reductions: list[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    first = reductions[0]
    src = graph[graph[first].inputs[0]].shape
    dims = graph[first].attr("dims")
    for r in reductions[1:]:
        s, d = graph[graph[r].inputs[0]].shape, graph[r].attr("dims")
        if (s, d) != (src, dims):
            raise FusionRefused(
                f"{_describe(graph, r)} reduces {list(s)} over dims {list(d)} but "
                f"{_describe(graph, first)} reduces {list(src)} over dims {list(dims)}: "
                "one kernel has one reduction domain"
            )
    return tuple(src), tuple(dims)


def _row_shapes(domain: tuple[int, ...], rdims: tuple[int, ...]) -> set[tuple[int, ...]]:
    keep = tuple(1 if i in rdims else s for i, s in enumerate(domain))
    squeezed = tuple(s for i, s in enumerate(domain) if i not in rdims)
    return {keep, squeezed}


def _check_stored_shapes(graph, stored, domain, rdims) -> None:
    rows = _row_shapes(domain, rdims)
    for s in stored:
        shape = graph[s].shape
        if shape != domain and shape not in rows:
            raise FusionRefused(
                f"{_describe(graph, s)} must be stored but its shape is neither the reduction "
                f"input {list(domain)} nor a row shape {sorted(list(r) for r in rows)}"
            )


# ---------------------------------------------------------------------------------------------
# Index propagation through views and broadcasting
# ---------------------------------------------------------------------------------------------


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
        flat = linearize(index, contiguous_strides(node.shape), node.shape)
        strides = contiguous_strides(src)
        return tuple(
            Expr.constant(0)
            if size == 1
            else flat.floordiv_mod(strides[j], None if j == _outer(src) else size)
            for j, size in enumerate(src)
        )
    raise ValueError(f"not a view op: {op}")


def _outer(shape: tuple[int, ...]) -> int:
    """Position of the outermost dimension of size > 1."""
    for j, s in enumerate(shape):
        if s != 1:
            return j
    return 0


def broadcast_index(src: tuple[int, ...], dst: tuple[int, ...], index: tuple[Expr, ...]):
    """Index into ``src`` for an element of ``dst`` that ``src`` broadcasts to."""
    off = len(dst) - len(src)
    return tuple(Expr.constant(0) if src[j] == 1 else index[j + off] for j in range(len(src)))


def domain_index(shape: tuple[int, ...], var: str) -> tuple[Expr, ...]:
    strides = contiguous_strides(shape)
    outer = _outer(shape)
    return tuple(Expr.dim(var, st, s, j == outer) for j, (st, s) in enumerate(zip(strides, shape)))


# ---------------------------------------------------------------------------------------------
# Op rendering
# ---------------------------------------------------------------------------------------------

TL_DTYPE = {
    "float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16",
    "float64": "tl.float64", "int64": "tl.int64", "int32": "tl.int32", "int16": "tl.int16",
    "int8": "tl.int8", "uint8": "tl.uint8", "bool": "tl.int1",
}  # fmt: skip


def compute_dtype(dtype: str) -> str:
    if dtype in ("float16", "bfloat16"):
        return "float32"
    return dtype


def _is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


@dataclass
class _Val:
    code: str  # a variable name or a literal
    cls: int  # 0 scalar, 1 row, 2 full
    dtype: str  # compute dtype
    literal: bool = False


def _literal(value, dtype: str) -> str:
    if isinstance(value, bool) or dtype == "bool":
        return "1" if value else "0"
    if _is_float(dtype):
        v = float(value)
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        if math.isnan(v):
            return 'float("nan")'
        return repr(v)
    return str(int(value))


def _cast(v: _Val, dtype: str) -> str:
    if v.dtype == dtype:
        return v.code
    if v.literal:
        if _is_float(dtype):
            return v.code if "." in v.code or "float" in v.code else f"{v.code}.0"
        return v.code
    if dtype == "bool":
        return f"({v.code} != 0)"
    return f"{v.code}.to({TL_DTYPE[dtype]})"


LOG2E = 1.4426950408889634


def exp_minus(x: str, m: str) -> str:
    """``exp(x - m)`` for a per-row ``m``: one fused multiply-add per element and an exp2."""
    return f"tl.exp2(tl.fma({x}, {LOG2E!r}, -({m} * {LOG2E!r})))"


_UNARY_FMT = {
    "neg": "-{a}", "abs": "tl.abs({a})", "exp": "tl.exp({a})", "exp2": "tl.exp2({a})",
    "log": "tl.log({a})", "log2": "tl.log2({a})", "log1p": "_af_log1p({a})",
    "expm1": "_af_expm1({a})", "sqrt": "tl.sqrt({a})", "rsqrt": "tl.rsqrt({a})",
    "reciprocal": "(1.0 / {a})", "sigmoid": "tl.sigmoid({a})", "tanh": "_af_tanh({a})",
    "erf": "tl.erf({a})", "sin": "tl.sin({a})", "cos": "tl.cos({a})",
    "floor": "tl.floor({a})", "ceil": "tl.ceil({a})", "round": "_af_round({a})",
    "trunc": "tl.where({a} < 0, tl.ceil({a}), tl.floor({a}))", "copy": "{a}",
    "bitwise_not": "~{a}",
}  # fmt: skip
_BINARY_FMT = {
    "add": "{a} + {b}", "sub": "{a} - {b}", "mul": "{a} * {b}", "div": "{a} / {b}",
    "bitwise_and": "{a} & {b}", "bitwise_or": "{a} | {b}", "bitwise_xor": "{a} ^ {b}",
}  # fmt: skip
_COMPARE_FMT = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_LOGICAL_FMT = {"logical_and": "&", "logical_or": "|", "logical_xor": "^"}

HELPERS = {
    "_af_tanh": """@triton.jit
def _af_tanh(x):
    # tanh from exp of a non-positive argument: no overflow, full relative precision
    t = tl.exp(-2.0 * tl.abs(x))
    y = (1.0 - t) / (1.0 + t)
    return tl.where(x < 0, -y, y)
""",
    "_af_round": """@triton.jit
def _af_round(x):
    # round half to even, as torch.round
    r = tl.floor(x + 0.5)
    r = tl.where((r - x == 0.5) & (r - 2.0 * tl.floor(r * 0.5) != 0.0), r - 1.0, r)
    return tl.where(tl.abs(x) >= 8388608.0, x, r)  # from 2**23 on every float is an integer
""",
    "_af_log1p": """@triton.jit
def _af_log1p(x):
    # log(1 + x) without cancellation for small x: log(u) * x / (u - 1), u = 1 + x
    u = 1.0 + x
    small = tl.where(u == 1.0, x, tl.log(u) * (x / (u - 1.0)))
    return tl.where(tl.abs(x) < 0.5, small, tl.log(u))
""",
    "_af_expm1": """@triton.jit
def _af_expm1(x):
    # exp(x) - 1 without cancellation for small x: (u - 1) * x / log(u), u = exp(x)
    u = tl.exp(x)
    small = tl.where(u == 1.0, x, (u - 1.0) * (x / tl.log(u)))
    return tl.where(tl.abs(x) < 0.5, small, u - 1.0)
""",
    "_af_prod": """@triton.jit
def _af_prod(a, b):
    return a * b
""",
    "_af_max": """@triton.jit
def _af_max(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
""",
    "_af_min": """@triton.jit
def _af_min(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
""",
}


def _pow_code(a: str, e: float) -> str:
    if e == 0.5:
        return f"tl.sqrt({a})"
    if e == -0.5:
        return f"tl.rsqrt({a})"
    if e == int(e) and abs(e) <= 8:
        n = int(abs(e))
        if n == 0:
            return f"({a} * 0.0 + 1.0)"
        prod = " * ".join([a] * n)
        return f"({prod})" if e > 0 else f"(1.0 / ({prod}))"
    if e == int(e):
        mag = f"tl.exp2({e!r} * tl.log2(tl.abs({a})))"
        return f"tl.where(({a} < 0) & ({int(e) % 2} == 1), -{mag}, {mag})"
    return f"tl.exp2({e!r} * tl.log2({a}))"


def _minmax(op: str, a: str, b: str, dtype: str) -> str:
    """tl.maximum / tl.minimum; for floats a NaN wins, as in torch."""
    nan = ", propagate_nan=tl.PropagateNan.ALL" if _is_float(dtype) else ""
    return f"tl.{op}({a}, {b}{nan})"


def _common_dtype(args: list[_Val]) -> str:
    """The dtype two operands are compared in: torch's promotion, a literal never widening."""
    import torch

    tensors = [a.dtype for a in args if not a.literal] or [a.dtype for a in args]
    out = getattr(torch, tensors[0])
    for d in tensors[1:]:
        out = torch.promote_types(out, getattr(torch, d))
    if any(a.literal and "." in a.code for a in args) and not out.is_floating_point:
        out = torch.float32
    return compute_dtype(str(out).removeprefix("torch."))


def render_op(op: str, node, args: list[_Val], helpers: set[str]) -> str:  # noqa: C901
    cd = compute_dtype(node.dtype)
    if op in _COMPARE_FMT:
        ad = _common_dtype(args)
        return f"{_cast(args[0], ad)} {_COMPARE_FMT[op]} {_cast(args[1], ad)}"
    if op in _LOGICAL_FMT:
        return f"{_cast(args[0], 'bool')} {_LOGICAL_FMT[op]} {_cast(args[1], 'bool')}"
    if op == "logical_not":
        return f"{_cast(args[0], 'bool')} == 0"
    if op == "isnan":
        return f"{args[0].code} != {args[0].code}"
    if op == "where":
        c = _cast(args[0], "bool")
        return f"tl.where({c}, {_cast(args[1], cd)}, {_cast(args[2], cd)})"
    a = _cast(args[0], cd)
    if op in _BINARY_FMT:
        return _BINARY_FMT[op].format(a=a, b=_cast(args[1], cd))
    if op in ("maximum", "minimum"):
        return _minmax(op, a, _cast(args[1], cd), cd)
    if op == "relu":
        return _minmax("maximum", a, "0.0" if _is_float(cd) else "0", cd)
    if op == "sign":
        return f"({a} > 0).to({TL_DTYPE[cd]}) - ({a} < 0).to({TL_DTYPE[cd]})"
    if op in ("floor", "ceil", "trunc", "round") and not _is_float(cd):
        return a  # integers are already integral: torch returns a copy
    if op in _UNARY_FMT:
        for h in ("_af_tanh", "_af_round", "_af_log1p", "_af_expm1"):
            if h in _UNARY_FMT[op]:
                helpers.add(h)
        return _UNARY_FMT[op].format(a=a)
    if op == "clamp":
        lo, hi = node.attr("lo"), node.attr("hi")
        out = a
        if lo is not None:
            out = _minmax("maximum", out, _literal(lo, cd), cd)
        if hi is not None:
            out = _minmax("minimum", out, _literal(hi, cd), cd)
        return out
    if op == "pow_scalar":
        e = node.attr("exponent")
        if not _is_float(cd) and not (e == int(e) and 0 <= e <= 8):
            raise FusionRefused(f"pow of an integer tensor by {e}: no Triton lowering")
        return _pow_code(a, e)
    if op == "cast":
        target = node.attr("dtype")
        if target in ("float16", "bfloat16"):  # round through the storage type, as eager does
            return f"{_cast(args[0], 'float32')}.to({TL_DTYPE[target]}).to(tl.float32)"
        return _cast(args[0], cd)
    raise FusionRefused(f"no Triton lowering for op {op!r}")


_IDENTITY = {"sum": "0", "mean": "0", "prod": "1", "amax": "-inf", "amin": "inf"}


_INT_RANGE = {
    "int64": (-(2**63), 2**63 - 1), "int32": (-(2**31), 2**31 - 1),
    "int16": (-(2**15), 2**15 - 1), "int8": (-128, 127), "uint8": (0, 255), "bool": (0, 1),
}  # fmt: skip


def _identity(op: str, dtype: str) -> str:
    v = _IDENTITY[op]
    if v in ("inf", "-inf"):
        if _is_float(dtype):
            return f'float("{v}")'
        lo, hi = _INT_RANGE[dtype]
        return str(lo if v == "-inf" else hi)
    return v + (".0" if _is_float(dtype) else "")


# ---------------------------------------------------------------------------------------------
# The emitter
# ---------------------------------------------------------------------------------------------


@dataclass
class _Scope:
    cache: dict = field(default_factory=dict)


class _Emitter:
    def __init__(self, graph: Graph, info: GroupInfo, config: KernelConfig) -> None:
        self.g, self.info, self.cfg = graph, info, config
        self.members = frozenset(info.nodes)
        self.red = info.kind in ("reduction", "gemm_row")
        self.persistent = self.red and config.RBLOCK >= info.rnumel
        self.lines: list[str] = []
        self.depth = 1
        self.scopes = [_Scope()]
        self.n_tmp = 0
        self.ptr: dict[int, str] = {i: f"in_ptr{k}" for k, i in enumerate(info.loads)}
        self.out_ptr: dict[int, str] = {i: f"out_ptr{k}" for k, i in enumerate(info.stored)}
        self.red_val: dict[int, _Val] = {}
        self.helpers: set[str] = set()
        self.int64 = self._needs_int64()
        dom, rd = info.domain, info.reduce_dims
        if self.red:
            kept = tuple(s for i, s in enumerate(dom) if i not in rd)
            reduced = tuple(dom[i] for i in rd)
            xi, ri = iter(domain_index(kept, "xindex")), iter(domain_index(reduced, "rindex"))
            self.full = tuple(next(ri) if i in rd else next(xi) for i in range(len(dom)))
        else:
            self.full = domain_index(dom, "xindex")

    # -- output helpers ----------------------------------------------------------------------
    def line(self, s: str) -> None:
        self.lines.append("    " * self.depth + s)

    def tmp(self, expr: str, cls: int, dtype: str, comment: str = "") -> _Val:
        name = f"tmp{self.n_tmp}"
        self.n_tmp += 1
        self.line(f"{name} = {expr}" + (f"  # {comment}" if comment else ""))
        return _Val(name, cls, dtype)

    def _needs_int64(self) -> bool:
        sizes = [numel(self.info.domain)]
        sizes += [self._extent(i) for i in self.info.loads]
        return max(sizes) >= 2**31 - 1

    def _extent(self, i: int) -> int:
        n = self.g[i]
        return 1 + sum((s - 1) * abs(st) for s, st in zip(n.shape, n.strides))

    def lookup(self, key):
        for sc in reversed(self.scopes):
            if key in sc.cache:
                return sc.cache[key]
        return None

    # -- values ------------------------------------------------------------------------------
    def cls_of(self, e: Expr) -> int:
        vs = e.vars
        if not vs:
            return 0
        if not self.red or "rindex" in vs:
            return 2
        return 1

    def mask_for(self, cls: int) -> str | None:
        if cls == 0:
            return None
        if cls == 2 and self.red:
            return "xmask & rmask"
        return "xmask"

    def value(self, i: int, index: tuple[Expr, ...]) -> _Val:
        node = self.g[i]
        if node.kind == "view":
            return self.value(node.inputs[0], view_source_index(self.g, i, index))
        if node.op == "const":
            return _Val(
                _literal(node.attr("value"), node.dtype), 0, compute_dtype(node.dtype), True
            )
        if node.op == "iota":  # arange: its value is the index itself, computed in the kernel
            e = index[0].scale(node.attr("step")).shift(node.attr("start"))
            cd = compute_dtype(node.dtype)
            if not e.vars:
                return _Val(str(e.const), 0, cd, True)
            return self.tmp(f"({e.render()}).to({TL_DTYPE[cd]})", self.cls_of(e), cd, node.name)
        key = (i, index)
        hit = self.lookup(key)
        if hit is not None:
            return hit
        if i not in self.members:
            v = self.load(i, index)
        elif node.kind in ("reduction", "matmul"):
            v = self.reduced(i, index)
        elif (shifted := self.shifted_exp(node, index)) is not None:
            v = self.tmp(shifted[0], shifted[1], compute_dtype(node.dtype), node.name)
        else:
            args = [
                self.value(j, broadcast_index(self.g[j].shape, node.shape, index))
                for j in node.inputs
            ]
            expr = self.divide(node, args) or render_op(node.op, node, args, self.helpers)
            cls = max((a.cls for a in args), default=0)
            v = self.tmp(expr, cls, compute_dtype(node.dtype), node.name)
        self.scopes[-1].cache[key] = v
        return v

    def shifted_exp(self, node, index: tuple[Expr, ...]) -> tuple[str, int] | None:
        """``exp(a - b)`` with ``b`` one value per row (softmax's max) as
        ``exp2(fma(a, log2 e, -b log2 e))``: the subtraction and tl.exp's own multiply by
        log2 e become one fused multiply-add per element."""
        j = node.inputs[0] if node.op == "exp" else None
        if j is None or j not in self.members or self.g[j].op != "sub":
            return None
        cd = compute_dtype(node.dtype)
        if (
            not _is_float(cd)
            or self.g[j].shape != node.shape
            or compute_dtype(self.g[j].dtype) != cd
        ):
            return None
        a, b = (
            self.value(k, broadcast_index(self.g[k].shape, node.shape, index))
            for k in self.g[j].inputs
        )
        if b.cls >= a.cls:
            return None
        return exp_minus(_cast(a, cd), _cast(b, cd)), a.cls

    def divide(self, node, args: list[_Val]) -> str | None:
        """A float division by a constant or by a row value, as a multiply by its reciprocal
        (one division per row instead of per element; within an ulp of the quotient)."""
        cd = compute_dtype(node.dtype)
        if node.op != "div" or not _is_float(cd):
            return None
        a, b = args
        if b.literal:
            try:
                c = float(b.code)
            except ValueError:
                return None
            if c == 0 or not math.isfinite(c) or not math.isfinite(1.0 / c):
                return None
            return f"{_cast(a, cd)} * {1.0 / c!r}"
        if b.cls >= a.cls:
            return None
        key = ("reciprocal", b.code)
        r = self.lookup(key)
        if r is None:
            r = self.tmp(f"1.0 / {_cast(b, cd)}", b.cls, cd, "reciprocal")
            self.scopes[-1].cache[key] = r
        return f"{_cast(a, cd)} * {r.code}"

    def load(self, i: int, index: tuple[Expr, ...]) -> _Val:
        node = self.g[i]
        strides = node.strides if node.kind == "input" else contiguous_strides(node.shape)
        off = linearize(index, strides, node.shape)
        cls = self.cls_of(off)
        mask = self.mask_for(cls)
        cd = compute_dtype(node.dtype)
        ptr = f"{self.ptr[i]} + ({off.render()})"
        if mask is None:
            code = f"tl.load({ptr})"
        else:
            code = f"tl.load({ptr}, {mask}, other=0)"
        if cd != node.dtype:
            code += f".to({TL_DTYPE[cd]})"
        return self.tmp(code, cls, cd, f"load {node.name}")

    def row_key(self, i: int, index: tuple[Expr, ...]) -> tuple[Expr, ...]:
        rd = self.info.reduce_dims
        if len(self.g[i].shape) == len(self.info.domain):
            return tuple(e for j, e in enumerate(index) if j not in rd)
        return index

    def reduced(self, i: int, index: tuple[Expr, ...]) -> _Val:
        want = tuple(e for j, e in enumerate(self.full) if j not in self.info.reduce_dims)
        got = self.row_key(i, index)
        if got != want:
            raise FusionRefused(
                f"{_describe(self.g, i)} is read at index ({', '.join(map(str, got))}) which is not "
                f"its own row ({', '.join(map(str, want))}): the reduced value would come from "
                "another program"
            )
        if i not in self.red_val:
            raise FusionRefused(f"{_describe(self.g, i)} is read before it is computed")
        return self.red_val[i]

    # -- kernel structure --------------------------------------------------------------------
    def levels(self) -> dict[int, int]:
        lv: dict[int, int] = {}
        for i in self.info.nodes:
            node = self.g[i]
            deps = [self.g.base_of(j) for j in node.inputs]
            base = max((lv.get(j, 0) for j in deps if j in self.members), default=0)
            lv[i] = base + 1 if node.kind == "reduction" else base
        return lv

    def acc_dtype(self, r: int) -> str:
        """Accumulator dtype of reduction ``r``: fp32 for floats, int64 for integer sums."""
        node = self.g[r]
        acc = compute_dtype(self.g[node.inputs[0]].dtype)
        if node.op in ("sum", "mean", "prod") and not _is_float(acc):
            acc = compute_dtype(node.dtype) if _is_float(node.dtype) else "int64"
        return acc

    def reduction_phase(self, reds: list[int]) -> dict:
        """Persistent kernels: the whole row is in the block; reduce it in one step."""
        accs = {}
        for r in reds:
            _, val = self.masked_input(r)
            accs[r] = (
                self.tmp(val, 2, self.acc_dtype(r), f"{self.g[r].name} input"),
                self.acc_dtype(r),
            )
        return accs

    def masked_input(self, r: int) -> tuple[_Val, str]:
        """The reduction's input at the domain index, and that value with masked lanes set to
        the reduction's identity."""
        node = self.g[r]
        src = self.value(node.inputs[0], self.full)
        acc = self.acc_dtype(r)
        return src, f"tl.where(xmask & rmask, {_cast(src, acc)}, {_identity(node.op, acc)})"

    def _combine(self, op: str, acc: str, val: str, dtype: str) -> str:
        if op in ("sum", "mean"):
            return f"{acc} + {val}"
        if op == "prod":
            return f"{acc} * {val}"
        return _minmax("maximum" if op == "amax" else "minimum", acc, val, dtype)

    def row_reduce(self, op: str, code: str, acc_dtype: str) -> str:
        """``code`` ([XBLOCK, RBLOCK]) reduced along the row to [XBLOCK, 1]."""
        combine = {"prod": "_af_prod"}
        if _is_float(acc_dtype):  # a NaN in the row makes the max (min) NaN, as in torch
            combine.update(amax="_af_max", amin="_af_min")
        fn = {"sum": "tl.sum", "mean": "tl.sum", "amax": "tl.max", "amin": "tl.min"}
        if op in combine:
            self.helpers.add(combine[op])
            return f"tl.reduce({code}, 1, {combine[op]})[:, None]"
        return f"{fn[op]}({code}, 1)[:, None]"

    def finish_reduction(self, r: int, acc: _Val, acc_dtype: str) -> None:
        node = self.g[r]
        self.set_reduced(r, self.row_reduce(node.op, acc.code, acc_dtype), acc_dtype)

    def set_reduced(self, r: int, expr: str, acc_dtype: str) -> None:
        """Bind reduction ``r``'s row value from ``expr`` (its row sum/max/... in acc_dtype)."""
        node = self.g[r]
        cd = compute_dtype(node.dtype)
        if node.op == "mean":
            v = self.tmp(expr, 1, acc_dtype, node.name + " (sum)")
            expr = f"{_cast(v, cd)} / {self.info.rnumel}.0"
        elif acc_dtype != cd:
            expr = f"({expr}).to({TL_DTYPE[cd]})"
        self.red_val[r] = self.tmp(expr, 1, cd, node.name)

    def store(self, i: int, v: _Val, index: tuple[Expr, ...], cls: int) -> None:
        node = self.g[i]
        off = linearize(index, contiguous_strides(node.shape), node.shape)
        code = v.code
        if v.cls < cls:
            shape = (
                "[XBLOCK, RBLOCK]"
                if cls == 2 and self.red
                else "[XBLOCK, 1]"
                if self.red
                else "[XBLOCK]"
            )
            if v.literal:
                code = f"tl.full({shape}, {v.code}, {TL_DTYPE[v.dtype]})"
            else:
                code = f"tl.broadcast_to({v.code}, {shape})"
        if compute_dtype(node.dtype) != node.dtype or v.dtype != node.dtype:
            code = f"{code}.to({TL_DTYPE[node.dtype]})"
        mask = self.mask_for(cls) or "xmask"
        where = off.render() if off.vars else f"{off.render()} + 0 * xindex"  # a block pointer
        self.line(f"tl.store({self.out_ptr[i]} + ({where}), {code}, {mask})")

    def stored_index(self, i: int) -> tuple[tuple[Expr, ...], int]:
        shape = self.g[i].shape
        if not self.red or shape == self.info.domain:
            return self.full, 2
        rd = self.info.reduce_dims
        if len(shape) == len(self.info.domain):
            idx = tuple(Expr.constant(0) if j in rd else e for j, e in enumerate(self.full))
        else:
            idx = tuple(e for j, e in enumerate(self.full) if j not in rd)
        return idx, 1

    def emit(self) -> list[str]:
        idx_t = ".to(tl.int64)" if self.int64 else ""
        if not self.red:
            self.line(f"xoffset = tl.program_id(0){idx_t} * XBLOCK")
            self.line("xindex = xoffset + tl.arange(0, XBLOCK)")
            self.line(self.mask_line("x", "[XBLOCK]"))
            for s in self.info.stored:
                self.store(s, self.value(s, self.full), self.full, 2)
            return self.lines
        self.line(f"xoffset = tl.program_id(0){idx_t} * XBLOCK")
        self.line("xindex = xoffset + tl.arange(0, XBLOCK)[:, None]")
        self.line(self.mask_line("x", "[XBLOCK, 1]"))
        self.preamble()
        if self.persistent:
            self.line("rindex = tl.arange(0, RBLOCK)[None, :]")
            self.line(self.mask_line("r", "[1, RBLOCK]"))
            if getattr(self.cfg, "HOIST", False):
                self.hoist_loads()
        else:
            self.line("rbase = tl.arange(0, RBLOCK)[None, :]")
        lv = self.levels()
        reds = [i for i in self.info.nodes if self.g[i].kind == "reduction"]
        self.online = {} if self.persistent else self.find_online()
        for level in sorted({lv[r] for r in reds}):
            phase = [r for r in reds if lv[r] == level and r not in self.online]
            if not phase:
                continue
            self.lines.append("")
            self.line(
                f"# phase {level}: {', '.join(self.g[r].name or self.g[r].op for r in phase)}"
            )
            if self.persistent:
                accs = self.reduction_phase(phase)
            else:
                accs = self._looped_phase(phase)
            for r in phase:
                self.finish_reduction(r, *accs[r])
            for s_, m_ in self.online.items():
                if m_ in phase:
                    self.finish_online(s_, m_, accs[s_][0], accs[m_][0])
        rows = [s for s in self.info.stored if self.stored_index(s)[1] == 1]
        fulls = [s for s in self.info.stored if self.stored_index(s)[1] == 2]
        if rows:
            self.lines.append("")
            self.line("# row outputs")
            for s in rows:
                idx, cls = self.stored_index(s)
                self.store(s, self.value(s, idx), idx, cls)
        if fulls:
            self.lines.append("")
            self.line("# elementwise outputs")
            self._in_loop(
                lambda: [self.store(s, self.value(s, self.full), self.full, 2) for s in fulls]
            )
        return self.lines

    def hoist_loads(self) -> None:
        """Emit, before the first reduction, every load that ops over the whole domain read
        directly (the cache then serves their later uses)."""
        g, dom = self.g, self.info.domain
        self.line("# loads hoisted above the reductions")
        for i in self.info.loads:
            users = [u for u in g.compute_users[i] if u in self.members]
            if users and all(g[u].kind != "view" and g[u].shape == dom for u in users):
                self.value(i, broadcast_index(g[i].shape, dom, self.full))

    def mask_line(self, axis: str, shape: str) -> str:
        """``xmask``/``rmask``: all-true constants when the block divides the extent (the
        compiler then drops them from every load and store), else the bounds check."""
        numel = self.info.xnumel if axis == "x" else self.info.rnumel
        block = self.cfg.XBLOCK if axis == "x" else self.cfg.RBLOCK
        if numel % block == 0:
            return f"{axis}mask = tl.full({shape}, True, tl.int1)"
        return f"{axis}mask = {axis}index < {axis}numel"

    def preamble(self) -> None:
        """Lines run once per program before the first phase (subclasses hoist loads here)."""

    def _looped_phase(self, phase: list[int]) -> dict:
        accs = {}
        for r in phase:
            acc_dtype = self.acc_dtype(r)
            ident = _identity(self.g[r].op, acc_dtype)
            acc = self.tmp(
                f"tl.full([XBLOCK, RBLOCK], {ident}, {TL_DTYPE[acc_dtype]})", 2, acc_dtype
            )
            accs[r] = (acc, acc_dtype)
        online = {s: m for s, m in self.online.items() if m in phase}
        for s in online:
            accs[s] = (
                self.tmp("tl.full([XBLOCK, RBLOCK], 0.0, tl.float32)", 2, "float32"),
                "float32",
            )
        self._in_loop(lambda: self._accumulate(phase, accs, online))
        return accs

    def _accumulate(self, phase, accs, online) -> None:
        partner = {m: s for s, m in online.items()}
        for r in phase:
            node = self.g[r]
            acc, acc_dtype = accs[r]
            src, val = self.masked_input(r)
            if r not in partner:
                self.line(f"{acc.code} = {self._combine(node.op, acc.code, val, acc_dtype)}")
                continue
            # online softmax: keep the running max and rescale the running sum of exp(x - max)
            s_acc = accs[partner[r]][0].code
            m_new = self.tmp(
                _minmax("maximum", acc.code, val, acc_dtype), 2, acc_dtype, "running max"
            )
            self.line(
                f'{s_acc} = tl.where({m_new.code} == float("-inf"), 0.0, '
                f"{s_acc} * tl.exp({acc.code} - {m_new.code}) + "
                f"tl.where(xmask & rmask, tl.exp({_cast(src, acc_dtype)} - {m_new.code}), 0.0))"
            )
            self.line(f"{acc.code} = {m_new.code}")

    def finish_online(self, s: int, m: int, s_acc: _Val, m_acc: _Val) -> None:
        """sum(exp(x - max)) from the per-lane running sums, rescaled to the row's max."""
        mx = self.red_val[m].code
        expr = (
            f'tl.sum(tl.where({m_acc.code} == float("-inf"), 0.0, '
            f"{s_acc.code} * tl.exp({m_acc.code} - {mx})), 1)[:, None]"
        )
        self.red_val[s] = self.tmp(expr, 1, "float32", self.g[s].name + " (online)")

    def find_online(self) -> dict[int, int]:
        """Pairs sum(exp(f - amax(f))) -> amax(f) that one looped pass can compute together."""
        g, members, out = self.g, self.members, {}
        keep_shape = tuple(
            1 if i in self.info.reduce_dims else d for i, d in enumerate(self.info.domain)
        )
        for s in self.info.nodes:
            if g[s].op != "sum" or g[s].dtype not in FLOAT_DTYPES:
                continue
            # direct inputs only: a view between them (exp(...).t().sum) reads other rows
            e = g[s].inputs[0]
            if e not in members or g[e].op != "exp" or g[e].shape != self.info.domain:
                continue
            d = g[e].inputs[0]
            if d not in members or g[d].op != "sub" or g[d].shape != self.info.domain:
                continue
            f, mv = g[d].inputs
            m = g.base_of(mv)
            if (
                m in members
                and m not in out.values()  # one running sum per running max
                and g[m].op == "amax"
                and g[m].inputs[0] == f
                and g[mv].shape == keep_shape
            ):
                out[s] = m
        return out

    def loop_iter(self, start: str, end: str) -> str:
        """The iterable of a column loop (subclasses ask Triton to pipeline it)."""
        return f"range({start}, {end}, RBLOCK)"

    def _in_loop(self, body, start: str = "0", end: str = "rnumel", note: str = "") -> None:
        if self.persistent:
            body()
            return
        self.line(f"for roffset in {self.loop_iter(start, end)}:" + (f"  # {note}" if note else ""))
        self.depth += 1
        self.scopes.append(_Scope())
        self.line("rindex = roffset + rbase")
        self.line(self.mask_line("r", "[1, RBLOCK]"))
        body()
        self.scopes.pop()
        self.depth -= 1


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------

_NAME_OP = {"pow_scalar": "pow", "copy": "clone", "cast": "to"}


def kernel_name(graph: Graph, info: GroupInfo, config: KernelConfig, index: int) -> str:
    if info.kind == "pointwise":
        prefix = "poi"
    elif info.kind == "gemm":
        prefix = "mm"
    else:
        prefix = "per" if config.RBLOCK >= info.rnumel else "red"
        if info.kind == "gemm_row":
            prefix = "mm" + prefix
    ops = sorted(
        {
            _NAME_OP.get(graph[i].op, graph[i].op)
            for i in info.nodes
            if graph[i].op not in INLINE_OPS
        }
    )
    if len(ops) > 8:
        ops = ops[:8] + ["etc"]
    return f"autofuse_{prefix}_fused_{'_'.join(ops)}_{index}"


@dataclass(frozen=True)
class Kernel:
    """A generated kernel: what it computes, its source and how to launch it.

    ``layout`` gives the kernel's positional arguments: ``("in", k)`` is the k-th loaded buffer
    (``info.loads[k]``), ``("out", k)`` the k-th stored one, ``("int", v)`` a constant;
    ``launch_kw`` holds the constexprs and num_warps / num_stages.
    """

    name: str
    source: str
    config: Any  # KernelConfig, or gemm_template.GemmConfig for GEMM kernels
    info: GroupInfo
    layout: tuple[tuple[str, int], ...] = ()
    grid: tuple[int, ...] = (1,)
    launch_kw: tuple[tuple[str, int], ...] = ()


def generate(graph: Graph, info: GroupInfo, config: KernelConfig, index: int = 0) -> Kernel:
    """Render the Triton source of ``info``'s group under ``config``."""
    if info.kind == "gemm":
        from autofuse.kernels.gemm import generate_gemm

        return generate_gemm(graph, info, config, index)
    check_config(info, config)
    if info.kind == "gemm_row":
        from autofuse.kernels.gemm import RowGemmEmitter

        em: _Emitter = RowGemmEmitter(graph, info, config)
    else:
        em = _Emitter(graph, info, config)
    body = em.emit()
    name = kernel_name(graph, info, config, index)
    params = [em.ptr[i] for i in info.loads] + [em.out_ptr[i] for i in info.stored] + ["xnumel"]
    consts = ["XBLOCK: tl.constexpr"]
    if em.red:
        params.append("rnumel")
        consts.append("RBLOCK: tl.constexpr")
    if info.kind == "gemm_row":
        consts.append("BLOCK_K: tl.constexpr")
    header = [
        f"# {name}: {len(info.nodes)} ops -> 1 kernel ({info.kind}, domain {list(info.domain)}"
        + (f", reducing dims {list(info.reduce_dims)}" if em.red else "")
        + ")",
        "#   reads:  "
        + ", ".join(f"{em.ptr[i]}={graph[i].name}{list(graph[i].shape)}" for i in info.loads),
        "#   writes: "
        + ", ".join(f"{em.out_ptr[i]}={graph[i].name}{list(graph[i].shape)}" for i in info.stored),
        f"#   config: {config.label()}",
        "@triton.jit",
        f"def {name}({', '.join(params + consts)}):",
    ]
    helpers = [HELPERS[h] for h in sorted(em.helpers)]
    src = "\n".join(
        ["import triton", "import triton.language as tl", "", ""]
        + [h + "\n" for h in helpers]
        + header
        + body
    )
    layout = [("in", k) for k in range(len(info.loads))]
    layout += [("out", k) for k in range(len(info.stored))] + [("int", info.xnumel)]
    kw = [("XBLOCK", config.XBLOCK), ("num_warps", config.num_warps)]
    if em.red:
        layout.append(("int", info.rnumel))
        kw.insert(1, ("RBLOCK", config.RBLOCK))
    if info.kind == "gemm_row":
        kw += [("BLOCK_K", config.BLOCK_K), ("num_stages", config.num_stages)]
    return Kernel(
        name=name,
        source=src + "\n",
        config=config,
        info=info,
        layout=tuple(layout),
        grid=(-(-info.xnumel // config.XBLOCK),),
        launch_kw=tuple(kw),
    )


def check_config(info: GroupInfo, config: Any) -> None:
    for label, v in (("XBLOCK", config.XBLOCK), ("num_warps", config.num_warps)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"{label} must be a power of two, got {v}")
    if info.kind in ("reduction", "gemm_row"):
        if config.RBLOCK < 1 or config.RBLOCK & (config.RBLOCK - 1):
            raise ValueError(f"RBLOCK must be a power of two for a reduction, got {config.RBLOCK}")
    elif config.RBLOCK:
        raise ValueError(f"a pointwise kernel takes RBLOCK=0, got {config.RBLOCK}")


def config_label(config: Any) -> str:
    return config.label() if hasattr(config, "label") else str(config)


def config_space(info: GroupInfo, graph: Graph | None = None) -> list[Any]:
    """The launch configs worth trying for this group (the search picks among them)."""
    if info.kind in ("gemm", "gemm_row"):
        from autofuse.kernels.gemm import gemm_configs, gemm_row_configs

        assert graph is not None, "GEMM configs depend on the operand dtypes: pass the graph"
        return (gemm_configs if info.kind == "gemm" else gemm_row_configs)(graph, info)
    if info.kind == "pointwise":
        top = max(16, next_pow2(info.xnumel))
        xs = [b for b in (128, 256, 512, 1024, 2048, 4096) if b <= top] or [top]
        return [KernelConfig(x, 0, w) for x in xs for w in (2, 4, 8) if x >= 32 * w or x == top]
    r = next_pow2(info.rnumel)
    rows = max(1, next_pow2(info.xnumel))
    out = []
    for x in (1, 2, 4, 8, 16, 32, 64):
        if x > rows:
            break
        if x * r <= 32768:  # persistent: a whole row per block, loads in place or hoisted
            out += [
                KernelConfig(x, r, w, hoist)
                for hoist in (False, True)
                for w in (1, 2, 4, 8, 16)
                if 32 * w <= max(32, x * r)
            ]
        for rb in (4, 16, 64, 256, 1024, 2048, 4096):
            if rb < r and x * rb <= 16384 and x * rb >= 32:
                out += [KernelConfig(x, rb, w) for w in (1, 2, 4, 8) if 32 * w <= x * rb]
    return out or [KernelConfig(1, r, 4)]


def default_config(info: GroupInfo, graph: Graph | None = None) -> Any:
    """A heuristic config, used by the greedy plan before any tuning."""
    if info.kind == "gemm":
        return config_space(info, graph)[0]
    if info.kind == "gemm_row":
        from autofuse.kernels.gemm import gemm_row_default

        assert graph is not None, "GEMM configs depend on the operand dtypes: pass the graph"
        return gemm_row_default(graph, info)
    if info.kind == "pointwise":
        x = min(1024, max(16, next_pow2(info.xnumel)))
        return KernelConfig(x, 0, 4 if x >= 128 else 1)
    r = next_pow2(info.rnumel)
    if r <= 4096:
        x = max(1, min(8, 4096 // r, next_pow2(info.xnumel)))
        w = min(16, max(1, x * r // 256))
        return KernelConfig(x, r, w)
    return KernelConfig(1, 4096, 8)
