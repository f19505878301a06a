"""Kernel kind ``gemm_row``: a matmul whose output rows are reduced in the same kernel.

The output tile walks the row in RBLOCK steps (an online max/sum for softmax, one pass per
phase otherwise); a causal mask computed from aranges bounds the column loops, ``SKIP`` configs
skip tiles a mask tensor sets to a constant, ``PIPELINE`` configs hand the column loops to
Triton's software pipeliner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from autofuse.ir.graph import Graph
from autofuse.ir.indexing import Expr
from autofuse.kernels.common.base import (
    FusionRefused,
    GroupInfo,
    Kernel,
    describe,
    kernel_name,
    loaded_nodes,
    stored_nodes,
)
from autofuse.kernels.common.configs import HOPPER_SMEM_BYTES, check_pow2
from autofuse.kernels.common.cost import LoopKind
from autofuse.kernels.common.emitter import Emitter, Scope
from autofuse.kernels.common.loop_kernel import render_loop_kernel
from autofuse.kernels.common.memory import ITEM, memory_offset
from autofuse.kernels.common.online import finished, fold_tile, shift_scale
from autofuse.kernels.common.reads import CONSTANT, Reads, walk_loop_kernel
from autofuse.kernels.common.render import (
    TL_DTYPE,
    Val,
    cast,
    compute_dtype,
    exp_minus,
    identity,
    literal,
    minmax,
    tile_address,
)
from autofuse.kernels.common.rowops import is_row_op
from autofuse.kernels.common.selects import column_bound, constant_select
from autofuse.kernels.common.views import broadcast_index, loop_index
from autofuse.kernels.reduction.kind import check_stored_shapes, reduction_domain


@dataclass(frozen=True, order=True)
class RowGemmConfig:
    """XBLOCK output rows (BLOCK_M) per program, RBLOCK columns (BLOCK_N) per step of the row,
    BLOCK_K of the inner product per dot."""

    SWITCHES: ClassVar[tuple[str, ...]] = (
        "SKIP",
        "PIPELINE",
    )  # the search and the polish switch them
    XBLOCK: int
    RBLOCK: int
    BLOCK_K: int
    num_warps: int = 4
    num_stages: int = 2
    SKIP: bool = False  # tiles whose every lane a where() replaces by a constant skip the dot
    # the column loops are pipelined by Triton num_stages deep for every load in them, not only
    # the dot operands (the default): epilogue operands that vary along the row (a mask tensor,
    # a norm's weight) then arrive through shared memory in the dot's layout, with no per-tile
    # layout conversion
    PIPELINE: bool = False

    def label(self) -> str:
        return (
            f"BLOCK_M={self.XBLOCK} BLOCK_N={self.RBLOCK} BLOCK_K={self.BLOCK_K} "
            f"num_warps={self.num_warps} num_stages={self.num_stages}"
            + (" SKIP" if self.SKIP else "")
            + (" PIPELINE" if self.PIPELINE else "")
        )


def analyze_gemm_row_group(graph: Graph, members: frozenset[int]) -> GroupInfo:
    """A matmul whose output rows are reduced in the same kernel (the output tile walks the
    row in RBLOCK steps: an online max/sum for softmax, one pass per phase otherwise)."""
    mms = [m for m in sorted(members) if graph[m].kind == "matmul"]
    if len(mms) != 1:
        raise FusionRefused("a row-reduction epilogue takes exactly one matmul")
    for m in sorted(members):
        if is_row_op(graph[m].op):
            raise FusionRefused(f"{describe(graph, m)}: no scan or argmax in a GEMM's epilogue")
    mm = mms[0]
    node = graph[mm]
    for j in node.inputs:
        if graph.base_of(j) in members:
            raise FusionRefused(
                f"{describe(graph, mm)}: a GEMM with a row-reduction epilogue takes no prologue"
            )
    reds = [m for m in sorted(members) if graph[m].kind == "reduction"]
    domain, rdims = reduction_domain(graph, reds)
    last = len(node.shape) - 1
    if domain != node.shape or rdims != (last,):
        raise FusionRefused(
            f"reductions over {list(domain)} dims {list(rdims)} are not over the rows of "
            f"{describe(graph, mm)} (its last dim)"
        )
    stored = stored_nodes(graph, members)
    check_stored_shapes(graph, stored, domain, rdims)
    info = GroupInfo(
        nodes=tuple(sorted(members)),
        kind=GemmRowKind.name,
        domain=tuple(domain),
        reduce_dims=rdims,
        stored=stored,
        loads=loaded_nodes(graph, members),
        matmuls=(mm,),
    )
    configs = gemm_row_configs(graph, info)
    if not configs:
        raise FusionRefused(
            f"no launch config fits {describe(graph, mm)}: rows of a batched product must be a "
            "multiple of a BLOCK_M >= 16"
        )
    RowGemmEmitter(graph, info, configs[0]).emit()  # index checks
    return info


class RowGemmEmitter(Emitter):
    """The reduction kernel whose matmul member is computed per (rows, RBLOCK) tile by tl.dot,
    inside whichever pass needs it. Unlike the memory-bound reductions (per-lane accumulators,
    one cross-lane reduction at the end), each score tile is reduced to its rows at once: the
    online softmax then costs one exp per element and pass, as in flash attention, and the
    accumulators are [XBLOCK, 1] instead of holding a second tile in registers. When the whole
    inner dimension fits one BLOCK_K, the A tile (the program's rows) is loaded once."""

    def __init__(self, graph: Graph, info: GroupInfo, config) -> None:
        super().__init__(graph, info, config)
        select = constant_select(graph, info)
        self.select = select if getattr(config, "SKIP", False) else None
        self.bound = (
            None if select is None else column_bound(graph, self.full, config.XBLOCK, select)
        )
        self.const_sel = select  # the where() a constant tile replaces by its constant
        self.const_tile = False  # emitting a loop where the select is its constant
        self.pipelined = False  # emitting a column loop that Triton pipelines for every load

    def value(self, i: int, index) -> Val:
        if self.const_tile and i == self.const_sel.node:
            dt = self.g[i].dtype
            return Val(literal(self.g[self.const_sel.const].attr("value"), dt), 0,
                        compute_dtype(dt), True)  # fmt: skip
        return super().value(i, index)

    def _in_loop(self, body, start: str = "0", end: str = "rnumel", note: str = "") -> None:
        if self.persistent:
            return super()._in_loop(body)
        if self.bound is None:
            return self._live_loop(body, "0", "rnumel")
        name = self.g[self.const_sel.node].name
        if self.bound.upper:
            self._live_loop(body, "0", "rhi")
            self._const_loop(body, "rhi", "rnumel", f"{name} gives its constant on these columns")
        else:
            self._const_loop(body, "0", "rlo", f"{name} gives its constant on these columns")
            self._live_loop(body, "rlo", "rnumel")

    def _const_loop(self, body, start: str, end: str, note: str) -> None:
        def const() -> None:
            self.const_tile = True
            body()
            self.const_tile = False

        super()._in_loop(const, start, end, note + ": no product")

    def _live_loop(self, body, start: str, end: str) -> None:
        if self.select is None:
            self.pipelined = getattr(self.cfg, "PIPELINE", False)
            super()._in_loop(body, start, end)
            self.pipelined = False
            return

        def branched() -> None:
            sel, g = self.select, self.g
            cond = self.value(
                sel.cond, broadcast_index(g[sel.cond].shape, g[sel.node].shape, self.full)
            )
            c = cast(cond, "bool")
            if sel.const_when:
                test = f"tl.min(tl.min(tl.where(xmask & rmask, {c}, 1).to(tl.int32), 1), 0) > 0"
            else:
                test = f"tl.max(tl.max(tl.where(xmask & rmask, {c}, 0).to(tl.int32), 1), 0) == 0"
            name = g[sel.node].name
            self.line(f"if {test}:  # {name} is its constant on the whole tile: no product")
            for const in (True, False):
                self.depth += 1
                self.scopes.append(Scope())
                self.const_tile = const
                body()
                self.const_tile = False
                self.scopes.pop()
                self.depth -= 1
                if const:
                    self.line("else:")

        super()._in_loop(branched, start, end)

    def loop_iter(self, start: str, end: str) -> str:
        if not self.pipelined:
            return super().loop_iter(start, end)
        return f"tl.range({start}, {end}, RBLOCK, num_stages={self.cfg.num_stages})"

    def single_k(self) -> bool:
        mm = self.g[self.info.matmuls[0]]
        return self.cfg.BLOCK_K >= self.g[mm.inputs[0]].shape[-1]

    def preamble(self) -> None:
        if self.bound is not None:
            self._bound_lines()
        if not self.single_k():
            return
        mm = self.info.matmuls[0]
        self.line("offs_k = tl.arange(0, BLOCK_K)")
        self.line(f"a = {self._a_load(mm)}  # {self.g[mm].name}: A rows, loaded once")

    def _bound_lines(self) -> None:
        """``rhi`` (``rlo``): the first (last) RBLOCK-aligned column past which the select is its
        constant on every row of this program (a causal mask's upper triangle)."""
        b, name = self.bound, self.g[self.const_sel.node].name
        first = b.row.render()
        if b.upper:
            last = f"{first} + {b.scale * (self.cfg.XBLOCK - 1) + b.offset}"
            self.line(f"rhi = tl.minimum(tl.maximum({last}, 0), rnumel)  # {name}: live columns")
            self.line("rhi = ((rhi + RBLOCK - 1) // RBLOCK) * RBLOCK")
        else:
            lo = f"{first} + {b.offset}"
            self.line(f"rlo = tl.minimum(tl.maximum({lo}, 0), rnumel)  # {name}: live columns")
            self.line("rlo = (rlo // RBLOCK) * RBLOCK")

    def _a_load(self, mm: int) -> str:
        g = self.g
        a = g[mm].inputs[0]
        k = g[a].shape[-1]
        kr_var = "offs_k[None, :]"  # a [1, 1] operand's offset is a constant: tile_address
        kr = Expr.dim(kr_var, 1, k, True)
        a_off = tile_address(memory_offset(g, a, (*self.full[:-1], kr)), ("xindex", kr_var))
        mask = "xmask" if k % self.cfg.BLOCK_K == 0 and k else f"xmask & (offs_k[None, :] < {k})"
        self.note_load(g.base_of(a))
        return f"tl.load({self.ptr[g.base_of(a)]} + ({a_off}), {mask}, other=0.0)"

    def reduced(self, i: int, index):
        if self.g[i].kind != "matmul":
            return super().reduced(i, index)
        if index != self.full:
            raise FusionRefused(
                f"{describe(self.g, i)} is read at ({', '.join(map(str, index))}), not at its "
                "own output tile"
            )
        return self.dot_tile(i)

    def dot_tile(self, mm: int) -> Val:
        g = self.g
        node = g[mm]
        a, b = node.inputs
        k = g[a].shape[-1]
        batched = len(node.shape) == 3
        m = node.shape[-2]
        kc_var = "offs_k[:, None]"  # a [1, 1] B (v.mT @ v's backward): a constant offset
        kc = Expr.dim(kc_var, 1, k, True)
        # every row of a program is in one batch (BLOCK_M divides M): a uniform batch index
        b_batch = (Expr.dim("xoffset", m, node.shape[0], True),) if batched else ()
        b_idx = (*b_batch, kc, self.full[-1])
        b_mask = "rmask" if k % self.cfg.BLOCK_K == 0 and k else f"(offs_k[:, None] < {k}) & rmask"
        b_off = tile_address(memory_offset(g, b, b_idx), (kc_var, "rindex"))
        b_load = f"tl.load({self.ptr[g.base_of(b)]} + ({b_off}), {b_mask}, other=0.0)"
        self.note_load(g.base_of(b))
        prec = ', input_precision="ieee"' if g[a].dtype == "float32" else ""
        if self.single_k():
            self.line(f"b = {b_load}")
            self.dots += 1
            return self.tmp(f"tl.dot(a, b{prec})", 2, "float32", f"{node.name} tile")
        acc = self.tmp("tl.zeros([XBLOCK, RBLOCK], dtype=tl.float32)", 2, "float32")
        self.line(f"for k_off in range(0, {k}, BLOCK_K):  # {node.name}: K loop")
        self.depth += 1
        self.line("offs_k = k_off + tl.arange(0, BLOCK_K)")
        self.line(f"a = {self._a_load(mm)}")
        self.line(f"b = {b_load}")
        self.dots += 1
        self.line(f"{acc.code} = tl.dot(a, b, {acc.code}{prec})")
        self.depth -= 1
        return acc

    # -- row-wise accumulation (looped kernels; a persistent one reduces its one tile) --------
    def _looped_phase(self, phase: list[int]) -> dict:
        accs = {}
        for r in phase:
            dt = self.acc_dtype(r)
            init = f"tl.full([XBLOCK, 1], {identity(self.g[r].op, dt)}, {TL_DTYPE[dt]})"
            accs[r] = (self.tmp(init, 1, dt), dt)
        online = {s: m for s, m in self.online.items() if m in phase}
        for s in online:
            dt = self.acc_dtype(s)
            accs[s] = (self.tmp(f"tl.zeros([XBLOCK, 1], dtype={TL_DTYPE[dt]})", 1, dt), dt)
        self._in_loop(lambda: self._accumulate_rows(phase, accs, online))
        return accs

    def _accumulate_rows(self, phase, accs, online) -> None:
        partner = {m: s for s, m in online.items()}
        for r in phase:
            op = self.g[r].op
            acc, dt = accs[r]
            src, val = self.masked_input(r)
            # on a constant tile the input is one value per row: the tile's reduction is that
            # value (max, min) or that value times the number of columns (sum)
            per_row = src.cls < 2 and op in ("sum", "mean", "amax", "amin")
            if per_row:
                row = self._row_value(src, dt)
                tile_code = f"{row} * {self._count()}" if op in ("sum", "mean") else row
            else:
                tile_code = self.row_reduce(op, val, dt)
            tile = self.tmp(tile_code, 1, dt, f"{self.g[r].name} of the tile")
            if r not in partner:
                self.line(f"{acc.code} = {self._combine(op, acc.code, tile.code, dt)}")
                continue
            # a sum riding its max's loop (common/online.py): the online softmax's running
            # row max and sum of exp(x - max) rescaled, or the moment mean's shifted sum
            s_acc, c = accs[partner[r]][0].code, shift_scale(self.g, partner[r])
            m_new = self.tmp(minmax("maximum", acc.code, tile.code, dt), 1, dt, "running max")
            x = self._row_value(src, dt) if per_row else cast(src, dt)
            x = x if c is not None else exp_minus(x, m_new.code)
            count = self._count()
            for ln in fold_tile(
                lambda e, note, dt=dt: self.tmp(e, 1, dt, note).code,
                (s_acc, acc.code, m_new.code),
                c,
                x,
                (lambda t, n=count: f"{n} * ({t})")
                if per_row
                else (lambda t: f"tl.sum(tl.where(xmask & rmask, {t}, 0.0), 1)[:, None]"),
            ):
                self.line(ln)

    def _row_value(self, src: Val, dt: str) -> str:
        """A scalar or per-row value as an [XBLOCK, 1] tensor of dtype ``dt``."""
        if src.cls == 1:
            return cast(src, dt)
        return f"(tl.zeros([XBLOCK, 1], dtype={TL_DTYPE[dt]}) + {cast(src, dt)})"

    def _count(self) -> str:
        """How many columns of this tile are inside the row."""
        if self.info.rnumel % self.cfg.RBLOCK == 0:
            return f"{float(self.cfg.RBLOCK)!r}"
        return "tl.sum(rmask.to(tl.float32), 1)[:, None]"

    def finish_reduction(self, r: int, acc: Val, acc_dtype: str) -> None:
        if self.persistent:
            return super().finish_reduction(r, acc, acc_dtype)
        self.set_reduced(r, acc.code, acc_dtype)

    def finish_online(self, s: int, m: int, s_acc: Val, m_acc: Val) -> None:
        if self.persistent:
            return super().finish_online(s, m, s_acc, m_acc)
        # a row that is all -inf: eager sums exp(-inf - -inf) = NaN, the running sum stayed 0
        expr = finished(s_acc.code, m_acc.code, shift_scale(self.g, s))
        self.red_val[s] = self.tmp(expr, 1, s_acc.dtype, self.g[s].name + " (online)")


class RowGemmReads(Reads):
    """The row GEMM kernel's reads (``common/reads.py``): the product is computed in every
    loop that needs it (its B tile read, and its A rows unless one BLOCK_K holds them: loaded
    once before the loops), but not on the tiles where the select is its constant."""

    def __init__(self, graph: Graph, info: GroupInfo, config: RowGemmConfig) -> None:
        super().__init__(graph, info, config.RBLOCK < info.rnumel)
        self.cfg, self.const_tile = config, False
        a = graph[info.matmuls[0]].inputs[0]
        self.single_k = config.BLOCK_K >= graph[a].shape[-1]
        self.select = constant_select(graph, info)
        full = loop_index(info.domain, info.reduce_dims)
        sel = self.select
        self.bound = None if sel is None else column_bound(graph, full, config.XBLOCK, sel)

    def replaced(self, i: int) -> int | None:
        return CONSTANT if self.const_tile and i == self.select.node else None

    def reduced(self, i: int) -> None:
        if self.g[i].kind != "matmul":
            return super().reduced(i)
        a, b = self.g[i].inputs
        if not self.single_k:
            self.read(self.g.base_of(a))
        self.read(self.g.base_of(b))
        self.dots += 1

    def in_loop(self, body: Callable[[], Any]) -> None:
        """A column loop: the live columns (each tile tested for the constant where SKIP),
        and, past the select's bound, the columns where it is its constant."""
        if self.select is None or not self.cfg.SKIP:
            self.loop(body)
        else:
            self.loop(lambda: self.branched(body))
        if self.bound is not None:
            self.loop(lambda: self.constant(body))

    def branched(self, body: Callable[[], Any]) -> None:
        self.value(self.select.cond)
        self.scoped(lambda: self.constant(body))
        self.scoped(body)

    def constant(self, body: Callable[[], Any]) -> None:
        self.const_tile = True
        body()
        self.const_tile = False


def row_gemm_reads(
    graph: Graph, info: GroupInfo, config: RowGemmConfig
) -> tuple[tuple[int, ...], int]:
    """(load passes, dots) of a row GEMM kernel under ``config``."""
    reads = RowGemmReads(graph, info, config)
    if not reads.looped:  # the whole row in one block: each load read once, one product
        return (1,) * len(info.loads), 1
    if reads.single_k:
        reads.read(graph.base_of(graph[info.matmuls[0]].inputs[0]))
    walk_loop_kernel(reads, reads.in_loop)
    return reads.passes(), reads.dots


def gemm_row_configs(graph: Graph, info: GroupInfo) -> list[RowGemmConfig]:
    mm = graph[info.matmuls[0]]
    m, n, k = mm.shape[-2], mm.shape[-1], graph[mm.inputs[0]].shape[-1]
    batched = len(mm.shape) == 3
    dt = ITEM.get(graph[mm.inputs[0]].dtype, 2)
    cap_n = max(16, _np2(n))
    out = []
    for bm in (16, 32, 64, 128):
        if bm > max(16, _np2(m)) or (batched and m % bm):
            continue
        for bn in (16, 32, 64, 128, 256):
            if bn > cap_n or bm * bn > 128 * 128:
                continue
            for bk in (16, 32, 64, 128):
                if bk > max(16, _np2(k)):
                    continue
                for w in (4, 8):
                    for st in (2, 3, 4):
                        if (
                            st * (bm * bk + bk * bn) * dt > HOPPER_SMEM_BYTES
                            or bm * bn < 32 * w * 4
                        ):
                            continue
                        out.append(RowGemmConfig(bm, bn, bk, w, st))
    plain = list(out)
    if constant_select(graph, info) is not None:  # skipping constant tiles: the search decides
        out += [replace(c, SKIP=True) for c in plain if c.RBLOCK < n]
    if row_loads(graph, info):  # pipelining the epilogue's loads too: the search decides
        out += [replace(c, PIPELINE=True) for c in plain if c.RBLOCK < n]
    return out


def row_loads(graph: Graph, info: GroupInfo) -> bool:
    """Whether the epilogue loads operands that vary along the output row (a mask tensor, a
    norm's weight or bias): those are what a PIPELINE config pipelines beside the dot's."""
    operands = {graph.base_of(j) for j in graph[info.matmuls[0]].inputs}
    n = info.domain[-1]
    return any(i not in operands and graph[i].shape[-1:] == (n,) for i in info.loads)


def gemm_row_default(graph: Graph, info: GroupInfo) -> RowGemmConfig:
    """Measured best on the H200 for attention scores (d=128): the A rows loaded once (BLOCK_K
    = K), 64-column steps, 4 warps, 3 stages (causal scores with bounded column loops: 183 us,
    results/h200/sweep_att_088186d.json). Skipping constant tiles by an in-loop branch (causal:
    339 us best vs 238 us without) measured slower there; it and PIPELINE are left to the
    search."""
    configs = gemm_row_configs(graph, info)
    mm = graph[info.matmuls[0]]
    k = min(128, _np2(graph[mm.inputs[0]].shape[-1]))
    want = (64, 64, k, 4)
    return min(
        configs,
        key=lambda c: (
            c.SKIP or c.PIPELINE,
            sum(
                abs(_log2(a) - _log2(b))
                for a, b in zip((c.XBLOCK, c.RBLOCK, c.BLOCK_K, c.num_warps), want)
            )
            + abs(c.num_stages - 3),  # stages count linearly (3 and 2 are one bit long)
        ),
    )


def _np2(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def _log2(x: int) -> int:
    return x.bit_length()


class GemmRowKind(LoopKind):
    name = "gemm_row"
    runtime_sizes = True  # a loop kernel: its rows the xnumel argument, columns rnumel
    library_first = False
    config_class = RowGemmConfig

    def bucket_rule(self, info: GroupInfo) -> bool:
        """Configs by bucket for a 2-D product only: a batched one's programs each lie in one
        batch (BLOCK_M divides the exact M), so its configs are chosen per exact shape."""
        return len(info.domain) == 2

    def claims(self, graph: Graph, members: frozenset[int]) -> bool:
        kinds = {graph[m].kind for m in members}
        return "matmul" in kinds and "reduction" in kinds

    def analyze(self, graph: Graph, members: frozenset[int]) -> GroupInfo:
        return analyze_gemm_row_group(graph, members)

    def config_space(self, graph: Graph, info: GroupInfo) -> list[RowGemmConfig]:
        return gemm_row_configs(graph, info)

    def default_config(self, graph: Graph, info: GroupInfo) -> RowGemmConfig:
        return gemm_row_default(graph, info)

    def check_config(self, info: GroupInfo, config: RowGemmConfig) -> None:
        check_pow2(XBLOCK=config.XBLOCK, num_warps=config.num_warps, RBLOCK=config.RBLOCK)

    def reads(
        self, graph: Graph, info: GroupInfo, config: RowGemmConfig
    ) -> tuple[tuple[int, ...], int]:
        return row_gemm_reads(graph, info, config)

    def prefix(self, info: GroupInfo, config: RowGemmConfig) -> str:
        return "mmper" if config.RBLOCK >= info.rnumel else "mmred"

    def generate(self, graph: Graph, info: GroupInfo, config: RowGemmConfig, index: int) -> Kernel:
        self.check_config(info, config)
        name = kernel_name(graph, info, self.prefix(info, config), index)
        em = RowGemmEmitter(graph, info, config)
        kw = [("BLOCK_K", config.BLOCK_K), ("num_stages", config.num_stages)]
        return render_loop_kernel(em, name, self.name, ("BLOCK_K",), kw)
