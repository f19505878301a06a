"""The loop-kernel emitter: every node of a group is a function of an index.

A kernel iterates over its domain (the output shape of a pointwise group; rows x reduced
elements for a reduction group) and evaluates each stored node at the domain index: a node read
from memory is a ``tl.load`` whose offset is the index pushed back through any view ops, a
pointwise node applies its op (rendered from the op table) to its inputs' values, and a reduction
node is the result of an earlier phase of the kernel. Reductions run in phases by dependency
level (softmax: max, then sum); a *persistent* kernel holds a whole row in one block, a *looped*
one walks the row in RBLOCK chunks and recomputes what each phase needs from its loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autofuse.ir.graph import Graph, Node, buffer_strides, contiguous_strides, numel
from autofuse.ir.indexing import Expr, linearize
from autofuse.ir.op_helpers import Helper
from autofuse.ir.ops import HALF_DTYPES, literal_value, op_def
from autofuse.kernels.common import load_hints, rowops
from autofuse.kernels.common.base import FusionRefused, GroupInfo, describe
from autofuse.kernels.common.indexed import indexed_value
from autofuse.kernels.common.memory import load_offset
from autofuse.kernels.common.online import finished, fold_tile, lanes_keep_max, shift_scale
from autofuse.kernels.common.reads import online_pairs, phase_levels
from autofuse.kernels.common.render import (
    TL_DTYPE,
    Val,
    cast,
    combine,
    compute_dtype,
    identity,
    is_float,
    literal,
    minmax,
    reduction_operand,
    render_op,
    row_reduce,
    tile_address,
)
from autofuse.kernels.common.rewrites import ValueRewrites
from autofuse.kernels.common.row_order import row_swap
from autofuse.kernels.common.sizes import runtime_sizes_on
from autofuse.kernels.common.views import (
    broadcast_index,
    domain_of_flat,
    loop_index,
    narrow_iota,
    view_source_index,
)

_COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})


@dataclass
class Scope:
    cache: dict = field(default_factory=dict)


@dataclass
class Loop:
    """A column loop being emitted: where its ``for`` line is (lines that must run before the
    loop are inserted there), its depth, and the lines that end each iteration (a looped
    scan's carry update)."""

    head: int
    depth: int
    tail: list[str] = field(default_factory=list)

    def before(self, em: Emitter, line: str) -> None:
        em.lines.insert(self.head, "    " * self.depth + line)
        self.head += 1


def _widened(node: Node, args: list[Val], expr: str) -> str:
    """``expr`` cast to the node's 64-bit compute dtype where its values are literals alone
    (``where(c, 0, 1)``: Triton types a Python int as int32 and a float as float32, and an
    int64 identity, -2**63, beside such a value is out of range)."""
    cd = compute_dtype(node.dtype)
    values = args[1:] if node.op == "where" else args
    if cd not in ("int64", "float64") or not values or not all(a.literal for a in values):
        return expr
    if all(a.literal for a in args):  # a Python expression, no tensor to cast
        return expr
    return f"({expr}).to({TL_DTYPE[cd]})"


class Emitter(ValueRewrites):
    """Renders a loop kernel's body: the pointwise kernels', the reductions' and (through its
    subclass) the row-GEMM's. It records, as it emits, what the kernel's metadata says: which
    loop reads each loaded buffer, the dots, the helpers."""

    # a cast converts its 16-bit operand as eager holds it, rounded (``rounded``); a kind whose
    # tiles hold values in another form (scores times log2 e) turns it off
    rounds_casts = True

    def __init__(self, graph: Graph, info: GroupInfo, config: Any) -> None:
        self.g, self.info, self.cfg = graph, info, config
        self.members = frozenset(info.nodes)
        self.red = info.reduces
        self.persistent = self.red and self.block("r") >= info.rnumel
        self.lines: list[str] = []
        self.depth = 1
        self.scopes = [Scope()]
        self.n_tmp = 0
        self.ptr: dict[int, str] = {i: f"in_ptr{k}" for k, i in enumerate(info.loads)}
        self.out_ptr: dict[int, str] = {i: f"out_ptr{k}" for k, i in enumerate(info.stored)}
        self.red_val: dict[int, Val] = {}
        self.arg_index: dict[int, Val] = {}  # looped argmax / argmin: per-lane indices
        self.helpers: set[Helper] = set()
        self.regions: list[set[int]] = [set()]  # loaded nodes read outside / in each loop
        self.region = 0
        self.dots = 0
        self.loops: list[Loop] = []  # the column loops being emitted (rowops' looped scans)
        self.lane_steps: set[int] = set()  # each load's offset step per xindex lane
        self.guards: list[tuple[str, int]] = []  # (condition, class) every load must also meet
        self.checked = False  # the kernel asserts its indirect indices are in range
        self.selective: set[int] = set()  # loaded nodes read only where a `where` selects them
        # loaded nodes a looped kernel reads in one column loop alone: streamed through the
        # cache (evict first), so what later loops re-read stays in L2
        self.streamed: frozenset[int] = frozenset()
        self.int64 = self._needs_int64()
        self.narrow = not self.int64 and narrow_iota(graph, info.nodes)
        self.swap = row_swap(graph, info)  # the row's walk (kernels/common/row_order.py)
        self.full = loop_index(info.domain, info.reduce_dims, self.swap)

    # -- output helpers ----------------------------------------------------------------------
    def line(self, s: str) -> None:
        self.lines.append("    " * self.depth + s)

    def tmp(self, expr: str, cls: int, dtype: str, comment: str = "") -> Val:
        if literal_value(expr) is not None:  # a constant: a tensor of its value's dtype (a
            expr = f"tl.full([], {expr}, {TL_DTYPE[dtype]})"  # Python int would be int32)
        name = f"tmp{self.n_tmp}"
        self.n_tmp += 1
        self.line(f"{name} = {expr}" + (f"  # {comment}" if comment else ""))
        return Val(name, cls, dtype)

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

    def tile_axes(self, cls: int) -> tuple[str, ...]:
        """The variables of a class-``cls`` tile's axes (a masked class-0 access: the rows)."""
        return ("xindex", "rindex") if cls == 2 and self.red else ("xindex",)

    def active_mask(self, cls: int) -> str | None:
        """The lanes of class ``cls`` whose value is used: in range, and selected by every
        enclosing cat branch / in-range indirect index (``guards``) of a class it has."""
        parts = [self.mask_for(cls)] + [g for g, c in self.guards if c <= cls]
        parts = [p for p in parts if p]
        return " & ".join(parts) if parts else None

    def value(self, i: int, index: tuple[Expr, ...]) -> Val:
        node = self.g[i]
        if numel(node.shape) == 0:  # no element: no lane uses it (an empty view's index maps
            return self.nothing(i)  # to constants past its base's end: never read there)
        if node.kind == "view":
            return self.value(node.inputs[0], view_source_index(self.g, i, index))
        if node.op == "const":
            return Val(literal(node.attr("value"), node.dtype), 0, compute_dtype(node.dtype), True)
        if node.op == "iota":  # arange: its value is the index itself, computed in the kernel
            e = index[0].scale(node.attr("step")).shift(node.attr("start"))
            cd = compute_dtype(node.dtype)
            if not e.terms:
                return Val(str(e.const), 0, cd, True)
            if self.narrow:  # int32 arithmetic: the extents fit (views.narrow_iota)
                return Val(f"({e.render()})", self.cls_of(e), cd)
            return self.tmp(f"({e.render()}).to({TL_DTYPE[cd]})", self.cls_of(e), cd, node.name)
        key = (i, index)
        hit = self.lookup(key)
        if hit is not None:
            return hit
        if i not in self.members:
            v = self.load(i, index)
        elif node.kind in ("reduction", "matmul"):
            v = self.reduced(i, index)
        elif op_def(node.op).indexed:
            v = indexed_value(self, i, index)
        elif (shifted := self.shifted_exp(node, index)) is not None:
            v = self.tmp(shifted[0], shifted[1], compute_dtype(node.dtype), node.name)
        elif node.op == "where" and (chosen := self.constant_where(node, index)) is not None:
            v = chosen
        elif (picked := load_hints.select_branch(self, i)) is not None:
            v = load_hints.guarded_where(self, i, index, picked)
        else:
            args = [
                self.value(j, broadcast_index(self.g[j].shape, node.shape, index))
                for j in node.inputs
            ]
            if node.op in _COMPARISONS or (node.op == "cast" and self.rounds_casts):
                args = [self.rounded(j, a, node.dtype) for j, a in zip(node.inputs, args)]
            expr = self.divide(node, args) or render_op(node.op, node, args, self.helpers)
            cls = max((a.cls for a in args), default=0)
            v = self.tmp(_widened(node, args, expr), cls, compute_dtype(node.dtype), node.name)
        self.scopes[-1].cache[key] = v
        return v

    def nothing(self, i: int) -> Val:
        """The value of empty node ``i``: a zero of its dtype (0.0 for a float), never loaded."""
        cd = compute_dtype(self.g[i].dtype)
        return Val(literal(0, cd), 0, cd, True)

    def rounded(self, j: int, v: Val, into: str | None = None) -> Val:
        """``v`` (node ``j`` computed in float32) rounded to ``j``'s 16-bit dtype, as eager holds
        it, where a comparison or a cast (to another dtype, ``into``) reads it: a comparison
        with a saved 16-bit value (amax's backward recomputes ``x == max``) must see the same
        rounding, or no element equals the max; a cast must convert the 16-bit value (a
        bfloat16 ``x * 0 + 0.3`` taken to float32 by layer_norm is 0.30078125, as its saved
        mean, or ``x - mean`` is not 0 and the backward scales it by rsqrt(eps))."""
        dtype, base = self.g[j].dtype, self.g.base_of(j)  # through views to the computed value
        if base not in self.members or dtype not in HALF_DTYPES or v.literal or v.dtype == dtype:
            return v
        if into == dtype:  # a cast to its own dtype rounds it itself
            return v
        return Val(f"{v.code}.to({TL_DTYPE[dtype]}).to({TL_DTYPE[v.dtype]})", v.cls, v.dtype)

    def load_offset(self, i: int, index: tuple[Expr, ...]) -> Expr:
        """The offset of ``index`` in node ``i``'s buffer."""
        return load_offset(self.g, i, index)

    def load(self, i: int, index: tuple[Expr, ...]) -> Val:
        node = self.g[i]  # (never empty: ``value`` answers an empty node itself)
        off = self.load_offset(i, index)
        self.lane_steps.add(off.lane_step("xindex"))
        cls = self.cls_of(off)
        mask = self.active_mask(cls)
        cd = compute_dtype(node.dtype)
        axes = self.tile_axes(cls)
        ptr = f"{self.ptr[i]} + ({tile_address(off, axes) if mask else off.render()})"
        if mask:  # the address takes the tile's axes: what it loads is a block of them (an
            cls = max(cls, self.cls_of(Expr.dim(axes[0], 1, 2, True)))  # address of none too)
        self.note_load(i)
        hint = load_hints.eviction(self, i)
        if mask is None:
            code = f"tl.load({ptr}{hint})"
        else:
            code = f"tl.load({ptr}, {mask}, other=0{hint})"
        if cd != node.dtype:
            code += f".to({TL_DTYPE[cd]})"
        return self.tmp(code, cls, cd, f"load {node.name}")

    def row_key(self, i: int, index: tuple[Expr, ...]) -> tuple[Expr, ...]:
        rd = self.info.reduce_dims
        if len(self.g[i].shape) == len(self.info.domain):
            return tuple(e for j, e in enumerate(index) if j not in rd)
        return index

    def reduced(self, i: int, index: tuple[Expr, ...]) -> Val:
        if rowops.is_scan(self.g[i].op):
            return rowops.scanned(self, i, index)
        want = tuple(e for j, e in enumerate(self.full) if j not in self.info.reduce_dims)
        got = self.row_key(i, index)
        if got != want:
            raise FusionRefused(
                f"{describe(self.g, i)} is read at index ({', '.join(map(str, got))}) which is not "
                f"its own row ({', '.join(map(str, want))}): the reduced value would come from "
                "another program"
            )
        if i not in self.red_val:
            raise FusionRefused(f"{describe(self.g, i)} is read before it is computed")
        return self.red_val[i]

    # -- kernel structure --------------------------------------------------------------------
    def acc_dtype(self, r: int) -> str:
        """Accumulator dtype of reduction ``r``: fp32 for floats, int64 for integer sums."""
        node = self.g[r]
        if rowops.is_row_op(node.op):
            return rowops.acc_dtype(self, r)
        if op_def(node.op).bool_input:
            return "int32"
        acc = compute_dtype(self.g[node.inputs[0]].dtype)
        if node.op in ("sum", "mean", "prod") and not is_float(acc):
            acc = compute_dtype(node.dtype) if is_float(node.dtype) else "int64"
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

    def masked_input(self, r: int) -> tuple[Val, str]:
        """The reduction's input at the domain index, and that value with masked lanes set to
        the reduction's identity."""
        node = self.g[r]
        src = self.value(node.inputs[0], self.full)
        acc = self.acc_dtype(r)
        code = reduction_operand(src, acc, op_def(node.op).bool_input)
        return src, f"tl.where(xmask & rmask, {code}, {identity(node.op, acc)})"

    def _combine(self, op: str, acc: str, val: str, dtype: str) -> str:
        return combine(op, acc, val, dtype)

    def row_reduce(self, op: str, code: str, acc_dtype: str) -> str:
        """``code`` ([XBLOCK, RBLOCK]) reduced along the row to [XBLOCK, 1]."""
        return row_reduce(op, code, acc_dtype, self.helpers)

    def finish_reduction(self, r: int, acc: Val, acc_dtype: str) -> None:
        node = self.g[r]
        if rowops.is_row_op(node.op):
            return rowops.finish(self, r, acc, acc_dtype)
        self.set_reduced(r, self.row_reduce(node.op, acc.code, acc_dtype), acc_dtype)

    def set_reduced(self, r: int, expr: str, acc_dtype: str) -> None:
        """Bind reduction ``r``'s row value from ``expr`` (its row sum/max/... in acc_dtype)."""
        node = self.g[r]
        cd = compute_dtype(node.dtype)
        if node.op == "mean":
            v = self.tmp(expr, 1, acc_dtype, node.name + " (sum)")
            count = "rnumel" if runtime_sizes_on() else f"{self.info.rnumel}.0"  # the argument
            expr = f"{cast(v, cd)} / {count}"
        elif acc_dtype != cd:
            expr = f"({expr}).to({TL_DTYPE[cd]})"
        self.red_val[r] = self.tmp(expr, 1, cd, node.name)

    def store(self, i: int, v: Val, index: tuple[Expr, ...], cls: int) -> None:
        node = self.g[i]
        off = linearize(index, buffer_strides(node), node.shape)  # a kept layout: its own
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
        addr = tile_address(off, self.tile_axes(cls))
        self.line(f"tl.store({self.out_ptr[i]} + ({addr}), {code}, {mask})")

    def stored_index(self, i: int) -> tuple[tuple[Expr, ...], int]:
        """Where stored node ``i``'s element of each domain element goes, and its class: the
        domain itself (2), one value per row in the kept or squeezed row shape (1), else a
        reshape of the domain (2: group_norm's [N, G, C/G * HxW] read back as [N, C, H, W];
        a pointwise output with size-1 dims placed elsewhere, [2, 1, 8] beside a [2, 8, 1]
        domain): each element at the domain's flat index, delinearized into the node's shape.
        Decided by the whole shape, never by its rank alone."""
        shape, dom = self.g[i].shape, self.info.domain
        if shape == dom:
            return self.full, 2
        rd = self.info.reduce_dims
        if self.red:
            if shape == tuple(1 if j in rd else s for j, s in enumerate(dom)):
                return tuple(Expr.constant(0) if j in rd else e for j, e in enumerate(self.full)), 1
            if shape == tuple(s for j, s in enumerate(dom) if j not in rd):
                return tuple(e for j, e in enumerate(self.full) if j not in rd), 1
        if numel(shape) != numel(dom):
            raise FusionRefused(
                f"{describe(self.g, i)} of shape {list(shape)} is neither the domain "
                f"{list(dom)}, a row of it nor a reshape of it"
            )
        flat = linearize(self.full, contiguous_strides(dom), dom)
        return domain_of_flat(flat, shape), 2

    def emit(self) -> list[str]:
        idx_t = ".to(tl.int64)" if self.int64 else ""
        # shape-specialized: the extents as constants (loop trip counts known to the compiler);
        # with runtime sizes both stay the arguments (a reduction over a dynamic dim shares
        # its kernel across the shapes of a bucket too: ``kernels/common/sizes.py``)
        consts = [] if runtime_sizes_on() else [f"xnumel = {self.info.xnumel}"]
        consts += [f"rnumel = {self.info.rnumel}"] if self.red and not runtime_sizes_on() else []
        if consts:
            self.line("; ".join(consts))
        if not self.red:
            self.line(f"xoffset = tl.program_id(0){idx_t} * XBLOCK")
            self.line("xindex = xoffset + tl.arange(0, XBLOCK)")
            self.line(self.mask_line("x", "[XBLOCK]"))
            for s in self.info.stored:
                idx = self.stored_index(s)[0]
                self.store(s, self.value(s, idx), idx, 2)
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
        self.emit_phases()
        self.emit_stores()
        return self.lines

    def emit_phases(self) -> None:
        """The reductions, one phase per level (a level reads the rows of the one before)."""
        lv = phase_levels(self.g, self.info)
        reds = [i for i in self.info.nodes if self.g[i].kind == "reduction"]
        self.online = {} if self.persistent else online_pairs(self.g, self.info)
        for level in sorted({lv[r] for r in reds}):
            # a looped kernel scans inside the loops that read the scan (rowops.scanned)
            phase = [
                r
                for r in reds
                if lv[r] == level
                and r not in self.online
                and (self.persistent or not rowops.is_scan(self.g[r].op))
            ]
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

    def emit_stores(self) -> None:
        """The stored nodes of a reduction kernel: row outputs, then elementwise ones."""
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
            idx = {s: self.stored_index(s)[0] for s in fulls}
            self._in_loop(lambda: [self.store(s, self.value(s, idx[s]), idx[s], 2) for s in fulls])

    def hoist_loads(self) -> None:
        """Emit, before the first reduction, every load that ops over the whole domain read
        directly, not through a view (the cache then serves their later uses; a load read
        through a reshape is at another index, and hoisting it read out of bounds)."""
        g, dom = self.g, self.info.domain
        self.line("# loads hoisted above the reductions")
        for i in self.info.loads:
            users = [u for u in g.compute_users[i] if u in self.members]
            if users and all(
                i in g[u].inputs
                and g[u].shape == dom
                and not op_def(g[u].op).indexed
                and load_hints.select_branch(self, u) is None
                for u in users
            ):
                self.value(i, broadcast_index(g[i].shape, dom, self.full))

    def block(self, axis: str) -> int:
        """The config's block along ``axis``: ``x`` rows per program, ``r`` columns a step."""
        return self.cfg.XBLOCK if axis == "x" else self.cfg.RBLOCK

    def mask_line(self, axis: str, shape: str) -> str:
        """``xmask``/``rmask``: all-true constants when the block divides the extent (the
        compiler then drops them from every load and store), else the bounds check."""
        numel = self.info.xnumel if axis == "x" else self.info.rnumel
        block = self.block(axis)
        runtime = runtime_sizes_on()  # the argument: any size
        if numel % block == 0 and numel > 0 and not runtime:  # an empty row masks every lane
            return f"{axis}mask = tl.full({shape}, True, tl.int1)"
        return f"{axis}mask = {axis}index < {axis}numel"

    def preamble(self) -> None:
        """Lines run once per program before the first phase (subclasses hoist loads here)."""

    def _looped_phase(self, phase: list[int]) -> dict:
        accs = {}
        row_max = set() if lanes_keep_max() else set(self.online.values())  # (online.py)
        for r in phase:
            dt, lanes = self.acc_dtype(r), 1 if r in row_max else "RBLOCK"
            full = f"tl.full([XBLOCK, {lanes}], {identity(self.g[r].op, dt)}, {TL_DTYPE[dt]})"
            accs[r] = (self.tmp(full, 2, dt), dt)
            if rowops.is_row_op(self.g[r].op):
                rowops.start_index(self, r)
        online = {s: m for s, m in self.online.items() if m in phase}
        rows = {}  # an online max's running row max: its accumulator, or one beside its lanes'
        for s, m in online.items():
            dt = self.acc_dtype(s)
            accs[s] = (self.tmp(f"tl.full([XBLOCK, 1], 0.0, {TL_DTYPE[dt]})", 2, dt), dt)
            dt, ident = self.acc_dtype(m), identity(self.g[m].op, self.acc_dtype(m))
            row = f"tl.full([XBLOCK, 1], {ident}, {TL_DTYPE[dt]})"
            rows[m] = accs[m][0] if m in row_max else self.tmp(row, 1, dt)
        self._in_loop(lambda: self._accumulate(phase, accs, online, rows))
        return accs

    def _accumulate(self, phase, accs, online, rows) -> None:
        partner = {m: s for s, m in online.items()}
        for r in phase:
            node = self.g[r]
            acc, acc_dtype = accs[r]
            src, val = self.masked_input(r)
            if rowops.is_row_op(node.op):
                rowops.accumulate(self, r, acc, val)
                continue
            if lanes := rows.get(r) is not acc:  # its lanes' own (online.lanes_keep_max)
                self.line(f"{acc.code} = {self._combine(node.op, acc.code, val, acc_dtype)}")
            if r not in partner:
                continue
            # a sum riding its max's loop (common/online.py), one update per tile: the row's
            # running max and the running sum against it (the online softmax: one exp per
            # element, as the hand-written cross-entropy kernels; the moment mean's shift)
            s_acc, c = accs[partner[r]][0].code, shift_scale(self.g, partner[r])
            row = rows[r].code
            nan_max = self.row_reduce("amax", val, acc_dtype) if not lanes else None
            tile = self.tmp(nan_max or f"tl.max({val}, 1)[:, None]", 1, acc_dtype, "tile max")
            m_new = self.tmp(
                minmax("maximum", row, tile.code, acc_dtype), 1, acc_dtype, "running max"
            )
            x = cast(src, acc_dtype)
            x = x if c is not None else f"tl.exp({x} - {m_new.code})"
            for ln in fold_tile(
                lambda e, note, dt=acc_dtype: self.tmp(e, 1, dt, note).code,
                (s_acc, row, m_new.code),
                c,
                x,
                lambda t: f"tl.sum(tl.where(xmask & rmask, {t}, 0.0), 1)[:, None]",
            ):
                self.line(ln)

    def finish_online(self, s: int, m: int, s_acc: Val, m_acc: Val) -> None:
        """The riding sum's value from its running sum (already against the row's max)."""
        expr = finished(s_acc.code, self.red_val[m].code, shift_scale(self.g, s))
        self.red_val[s] = self.tmp(expr, 1, s_acc.dtype, self.g[s].name + " (online)")

    def loop_iter(self, start: str, end: str) -> str:
        """The iterable of a column loop (subclasses ask Triton to pipeline it)."""
        return f"range({start}, {end}, RBLOCK)"

    def _in_loop(self, body, start: str = "0", end: str = "rnumel", note: str = "") -> None:
        if self.persistent:
            body()
            return
        self.loops.append(Loop(len(self.lines), self.depth))
        self.line(f"for roffset in {self.loop_iter(start, end)}:" + (f"  # {note}" if note else ""))
        self.depth += 1
        self.scopes.append(Scope())
        self.regions.append(set())
        outer, self.region = self.region, len(self.regions) - 1
        self.line("rindex = roffset + rbase")
        self.line(self.mask_line("r", "[1, RBLOCK]"))
        body()
        for ln in self.loops.pop().tail:
            self.line(ln)
        self.region = outer
        self.scopes.pop()
        self.depth -= 1

    # -- metadata ----------------------------------------------------------------------------
    def note_load(self, i: int) -> None:
        """Record that the code being emitted reads loaded node ``i`` (in the current loop)."""
        self.regions[self.region].add(i)

    def load_passes(self) -> tuple[int, ...]:
        """Reads of each loaded buffer: once per column loop that loads it, once if it is only
        loaded outside loops."""
        return tuple(max(1, sum(i in r for r in self.regions)) for i in self.info.loads)
