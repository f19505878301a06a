"""Kernel kind ``attention_bwd``: the attention backward (dQ, dK, dV) in one kernel, flash-attention
2 style, with no (T, Tk) tensor in memory.

The group is the backward graph of eager attention (``frontend/remat.py`` makes the forward save
softmax's row max and sum and the attention's output; ``frontend/remat_delta.py`` turns the
softmax backward's row term into ``delta = rowsum(dO * O)``, a small reduction kernel before
this one): tile matmuls recomputing the scores ``Q K^T`` and ``dP = dO V^T``, the pointwise ops
on them (the mask, ``P = exp(x - max) / sum``, ``dS = P * dP - P * delta``, the mask's and the
scale's backward: rendered by the emitter from the op table, as the forward kind does) and the
gradient matmuls reading those tiles (``attention_bwd_analysis.py`` gives each its role).

The grid has two kinds of programs per (batch, head): one per block of BLOCK_N keys, walking the
query rows in BLOCK_M steps and accumulating the key-side gradients (dK, dV: contractions over
the rows) in registers; and one per block of BLOCK_M query rows, walking the keys and
accumulating the query-side gradient (dQ). Each recomputes its tiles from Q, K, V, dO and the
loaded row statistics; nothing is accumulated across programs (no atomics, deterministic).

An index-expression mask (causal, a sliding window: ``attention_bounds.key_bound``) bounds both
loops to the tiles it leaves live, when every gradient's tile operand vanishes with P (see
``attention_bwd_skip.py``): a tile the mask hides then adds exactly zero, unless a row of it has
its max within reach of the mask's constant (a row the mask hides entirely, uniform in eager):
such a program visits every tile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autofuse.ir.graph import Graph, buffer_strides, contiguous_strides, numel
from autofuse.ir.indexing import Expr, linearize
from autofuse.kernels.attention.analysis import head_block
from autofuse.kernels.attention.facts import tile_load
from autofuse.kernels.attention.runtime import BAKED, Sizes, grown_strides, sized_kernel
from autofuse.kernels.attention_bwd import tma as attention_bwd_tma
from autofuse.kernels.attention_bwd.analysis import (
    BwdParts,
    GradMatmul,
    backward_facts,
    tile_index,
)
from autofuse.kernels.attention_bwd.skip import SkipPlan, skip_plan
from autofuse.kernels.common.base import (
    DESCRIPTOR_ALIGNMENT,
    FusionRefused,
    GroupInfo,
    Kernel,
    KernelMeta,
    TileConfig,
    describe,
    kernel_name,
    loaded_nodes,
    stored_nodes,
)
from autofuse.kernels.common.emitter import Emitter, Loop, Scope
from autofuse.kernels.common.render import (
    TL_DTYPE,
    Val,
    cast,
    kernel_header,
    literal,
    tile_address,
)
from autofuse.kernels.common.sizes import runtime_sizes_on
from autofuse.kernels.common.views import broadcast_index

KIND = "attention_bwd"  # the plugin's name (AttentionBwdKind, attention_bwd_space.py)


@dataclass(frozen=True, order=True)
class AttentionBwdConfig(TileConfig):
    """BLOCK_M query rows and BLOCK_N keys per tile: a key program holds BLOCK_N keys and
    walks the rows BLOCK_M at a time; a query program holds BLOCK_M rows and walks the keys
    BLOCK_N at a time, or, with ``swap``, holds BLOCK_N rows and walks BLOCK_M keys (both
    kinds then hold the same block and walk the other: a large held block, a small step)."""

    # the search and the polish switch these on and off (``swap`` is a shape: a neighbour)
    SWITCHES: ClassVar[tuple[str, ...]] = ("flip", "TMA", "whole")
    num_stages: int = 1
    swap: bool = False
    # the key programs compute their tiles turned over (keys by rows, as the Triton tutorial's
    # backward does): P^T and dS^T feed dV and dK with no transpose of a computed tile
    flip: bool = False
    # the tiles read through TMA tensor descriptors where they qualify (attention_bwd_tma.py)
    TMA: bool = False
    # the key programs run the row blocks an exact index-expression mask leaves live for all
    # their keys in a loop of their own, without the mask (the query programs keep one loop:
    # split too, ptxas for sm_90 spilled 96 bytes against 44 at 64 x 64, Triton 3.6)
    whole: bool = False

    def label(self) -> str:
        flags = [f for f in ("swap", "flip", "whole", "TMA") if getattr(self, f)]
        return " ".join([super().label(), *flags])


def role_block_names(config: AttentionBwdConfig, role: str) -> tuple[str, str]:
    """The constexprs that size the rows and the keys of a tile of the ``role`` programs
    ("kv" or "q") under ``config``."""
    if role == "q" and config.swap:
        return "BLOCK_N", "BLOCK_M"
    return "BLOCK_M", "BLOCK_N"


def role_blocks(config: AttentionBwdConfig, role: str) -> tuple[int, int]:
    """(rows, keys) of a tile of the ``role`` programs under ``config``."""
    rows, keys = role_block_names(config, role)
    return getattr(config, rows), getattr(config, keys)


def _swap(code: str) -> str:
    """An offset or mask of a tile with its two axes exchanged (the index names broadcast
    along one axis each: ``offs_m[:, None]`` <-> ``offs_m[None, :]``)."""
    return (
        code.replace("[:, None]", "[@]")
        .replace("[None, :]", "[:, None]")
        .replace("[@]", "[None, :]")
    )


# ---------------------------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------------------------


def analyze_attention_bwd_group(graph: Graph, members: frozenset[int]) -> GroupInfo:
    parts = backward_facts(graph, members)
    stored = stored_nodes(graph, members)
    grads = {g.node for g in parts.grads}
    extra = [s for s in stored if s not in grads]
    if extra:
        raise FusionRefused(
            f"{describe(graph, extra[0])} must be stored: the attention backward kernel writes "
            "only its gradient matmuls (no (T, Tk) tile goes to memory)"
        )
    info = GroupInfo(
        nodes=tuple(sorted(members)),
        kind=KIND,
        domain=parts.domain,
        reduce_dims=(len(parts.domain) - 1,),
        stored=stored,
        loads=loaded_nodes(graph, members),
        matmuls=(*parts.tiles, *sorted(grads)),
    )
    heads = [graph[graph.base_of(graph[t].inputs[0])].shape[-1] for t in parts.tiles]
    heads += [g.free_extent(graph) for g in parts.grads]
    if max(heads) > 256:
        raise FusionRefused(f"head dim {max(heads)} > 256: the tiles do not fit")
    BwdEmitter(graph, info, AttentionBwdConfig(16, 16), parts).emit()  # index checks
    return info


# ---------------------------------------------------------------------------------------------
# Code generation
# ---------------------------------------------------------------------------------------------


class BwdEmitter(Emitter):
    """Renders the kernel body. Inside a loop the tile is rows ``xindex = offs_m[:, None]``
    by keys ``rindex = offs_n[None, :]``; a tile matmul's value is its ``tl.dot`` (operands
    that the program holds fixed are loaded once, before the loop), every other tile value is
    the loop emitter's ``value`` at the domain index."""

    # the score tiles are float32, scaled by log2 e where the softmax scale is folded in: a
    # cast to float32 of the scores is not rounded to their 16-bit dtype (the forward and the
    # backward kernel see the same scores)
    rounds_casts = False

    def block(self, axis: str) -> int:
        """Query rows (``x``: BLOCK_M) by keys (``r``: BLOCK_N) per tile."""
        return self.cfg.BLOCK_M if axis == "x" else self.cfg.BLOCK_N

    def __init__(
        self, graph: Graph, info: GroupInfo, config, parts: BwdParts, sizes: Sizes = BAKED
    ) -> None:
        super().__init__(graph, info, config)
        self.parts = parts
        p = parts
        # under runtime sizes the counts are the arguments T and TK, every tile edge masked
        # (``attention/runtime.py``); ``grown``: the probe that finds the strides holding them
        self.runtime, self.grown = sizes.runtime, sizes.grown
        self.T, self.TK, self.T1, self.TK1 = sizes.names(p.t, p.tk)
        self.rows = Expr.dim("xindex", 1, p.t, True)
        self.keys = Expr.dim("rindex", 1, p.tk, True)
        self.full = tile_index(p.domain, p.heads, len(p.domain), self.rows, self.keys)
        self.bh3 = (Expr.dim("bh", 1, p.heads, True),)
        self.role = ""  # "kv": the program holds keys; "q": it holds rows
        self.held: dict[int, str] = {}  # operand node -> the variable loaded before the loop
        self.skip: SkipPlan | None = skip_plan(graph, info, parts, self.full)
        self.pass_tile = False  # emitting a whole tile: the mask passes every element
        self.descriptors: set[str] = set()  # TMA descriptors made (attention_bwd_tma.py)

    def value(self, i: int, index) -> Val:
        """On a whole tile the mask is its passed input, and a select's condition a constant
        (so the mask's backward, a select on the same condition, passes too)."""
        s = self.skip
        if self.pass_tile and s is not None:
            if i == s.select:
                j = s.passed
                return self.value(j, broadcast_index(self.g[j].shape, self.g[i].shape, index))
            if i == s.cond:
                return Val(literal(s.cond_live, "bool"), 0, "bool", True)
        return super().value(i, index)

    def load_offset(self, i: int, index) -> Expr:
        """As loop kernels read a buffer; in the probe under runtime sizes, at grown strides."""
        if not self.grown:
            return super().load_offset(i, index)
        node = self.g[i]
        strides = grown_strides(node.shape, index, buffer_strides(node))
        return linearize(index, strides, node.shape)

    def _needs_int64(self) -> bool:  # the tiles are never addressed: only loads and outputs
        sizes = [self._extent(i) for i in self.info.loads]
        sizes += [numel(self.g[s].shape) for s in self.info.stored]
        return max(sizes) >= 2**31 - 1

    # -- values ------------------------------------------------------------------------------
    def reduced(self, i: int, index) -> Val:
        """A tile matmul's product at the program's tile: ``tl.dot`` of its operands."""
        g, p = self.g, self.parts
        if i not in p.tiles:
            raise FusionRefused(f"{describe(g, i)} is read by the tiles' ops")
        want = tile_index(p.domain, p.heads, len(g[i].shape), self.rows, self.keys)
        if tuple(index) != want:
            raise FusionRefused(
                f"{describe(g, i)} is read at ({', '.join(map(str, index))}), not at the tile "
                "the program computes"
            )
        a, b = g[i].inputs
        d = g[a].shape[-1]
        dh = self.head_var(d)
        fixed_a, fixed_b = self.role == "q", self.role == "kv"
        rs, ks = self._ax("rows"), self._ax("keys")
        hs_a, hs_b = _swap(rs), _swap(ks)  # the head dim along the other axis
        rows = Expr.dim(f"offs_m{rs}", 1, p.t, True)
        keys = Expr.dim(f"offs_n{ks}", 1, p.tk, True)
        ha = Expr.dim(f"{dh}{hs_a}", 1, d, True)
        hb = Expr.dim(f"{dh}{hs_b}", 1, d, True)
        ta, tb = (f"offs_m{rs}", f"{dh}{hs_a}"), (f"{dh}{hs_b}", f"offs_n{ks}")
        va = self.operand(a, (rows, ha), self.mask(rows=rs, head=(d, hs_a)), fixed_a, ta)
        vb = self.operand(b, (hb, keys), self.mask(keys=ks, head=(d, hs_b)), fixed_b, tb)
        self.dots += 1
        k = p.tiles.index(i)
        pair = f"{vb}, {va}" if self.flipped else f"{va}, {vb}"  # (Q K^T)^T = K Q^T
        self.line(f"mm{k} = tl.dot({pair}{self.prec(g[a].dtype)})  # {g[i].name}")
        return Val(f"mm{k}", 2, "float32")

    def prec(self, dtype: str) -> str:
        return ', input_precision="ieee"' if dtype == "float32" else ""

    def head_var(self, d: int) -> str:
        return f"offs_h{d}"

    @property
    def flipped(self) -> bool:
        """Whether the current role's tiles are keys by rows (``AttentionBwdConfig.flip``)."""
        return self.role == "kv" and self.cfg.flip

    def _ax(self, along: str) -> str:
        """The broadcast suffix of a tile's rows (``along="rows"``) or keys in this role."""
        first = (along == "rows") != self.flipped
        return "[:, None]" if first else "[None, :]"

    def blocks(self) -> tuple[str, str]:
        """The constexprs that size the rows and the keys of the current role's tiles."""
        return role_block_names(self.cfg, self.role)

    def sizes(self) -> tuple[int, int]:
        return role_blocks(self.cfg, self.role)

    def mask(
        self, rows: str = "", keys: str = "", head: tuple[int, str] | None = None
    ) -> str | None:
        """The bounds mask of a tile load or store: rows and keys (``rows`` / ``keys``: the
        broadcast of ``offs_m`` / ``offs_n`` used) where they may run past their extent, a
        head dim past its own."""
        parts = []
        ragged_rows, ragged_keys = self._ragged()
        if rows and ragged_rows:
            parts.append(f"(offs_m{rows} < {self.T})")
        if keys and ragged_keys:
            parts.append(f"(offs_n{keys} < {self.TK})")
        if head is not None and head[0] != head_block(head[0]):
            parts.append(f"({self.head_var(head[0])}{head[1]} < {head[0]})")
        return " & ".join(parts) or None

    def _ragged(self) -> tuple[bool, bool]:
        """Whether the current role's last tiles may run past the rows, the keys: always
        under runtime sizes, else where a block does not divide them."""
        p, (bm, bn) = self.parts, self.sizes()
        return (True, True) if self.runtime else (bool(p.t % bm), bool(p.tk % bn))

    def operand(self, j: int, pair, mask: str | None, fixed: bool, tile=()) -> str:
        """Load matmul operand ``j`` at ``(bh, *pair)`` through its views (before the loop when
        the program holds it fixed); returns its variable. ``tile``: the names of the tile's
        two axes, which its address takes even where an axis of size 1 left it
        (``tile_address``)."""
        if fixed and j in self.held:
            return self.held[j]
        rank = len(self.g[j].shape)
        index = (*self.bh3, *pair) if rank == 3 else tuple(pair)
        base, off = self.parts.operand_offset(self.g, j, index, self.grown)
        self.note_load(base)
        if not fixed:  # the same tile read again this step, or its transpose
            key = ("operand", base, off.render(), mask)
            if (hit := self.lookup(key)) is not None:
                return hit
            swapped = tuple(_swap(x) if x else x for x in key[2:])
            if (hit := self.lookup(("operand", base, *swapped))) is not None:
                return f"tl.trans({hit})"
        var = f"{'h' if fixed else 'o'}{self.n_tmp}"
        self.n_tmp += 1
        desc = attention_bwd_tma.tile(self, base, off, pair, mask)
        code = f"{var} = {desc or tile_load(self.ptr[base], off, tile, mask)}"
        note = f"{self.g[base].name}{', TMA' if desc else ''}"
        if fixed:
            self.loops[-1].before(self, code + f"  # {note}, held")
            self.held[j] = var
        else:
            self.line(code + f"  # {note}")
            self.scopes[-1].cache[key] = var
        return var

    # -- kernel ------------------------------------------------------------------------------
    def emit(self) -> list[str]:
        p = self.parts
        kv = [gm for gm in p.grads if gm.over_rows]
        q = [gm for gm in p.grads if not gm.over_rows]
        nk = str(-(-p.tk // self.cfg.BLOCK_N) if kv else 0)
        self.line("pid = tl.program_id(0)")
        self.line(f"bh = tl.program_id(1){'.to(tl.int64)' if self.int64 else ''}  # batch x head")
        if self.runtime and kv and q:
            self.line("nk = tl.cdiv(TK, BLOCK_N)  # the key blocks: their programs come first")
            nk = "nk"
        extents = {self.g[self.g[t].inputs[0]].shape[-1] for t in p.tiles}
        extents |= {gm.free_extent(self.g) for gm in p.grads}
        for e in sorted(extents):
            self.line(f"{self.head_var(e)} = tl.arange(0, {head_block(e)})  # head dim {e}")
        if kv and q:
            self.line(f"if pid < {nk}:  # a block of keys: {self._names(kv)}")
            self.depth += 1
            self._role("kv", kv)
            self.depth -= 1
            self.line(f"else:  # a block of query rows: {self._names(q)}")
            self.depth += 1
            self._role("q", q, f"pid - {nk}")
            self.depth -= 1
        elif kv:
            self._role("kv", kv)
        else:
            self._role("q", q)
        return self.lines

    def _names(self, grads) -> str:
        return ", ".join(self.g[gm.node].name for gm in grads)

    def _role(self, role: str, grads: list[GradMatmul], pid: str = "pid") -> None:
        self.role, self.held = role, {}
        self.scopes.append(Scope())
        if role == "kv":
            self.line(f"start_k = ({pid}) * BLOCK_N")
            self.line("offs_n = start_k + tl.arange(0, BLOCK_N)")
            self.line(f"rindex = offs_n{self._ax('keys')}")
            self.line(f"rmask = rindex < {self.TK}")
        else:
            bm = self.blocks()[0]
            self.line(f"start_q = ({pid}) * {bm}")
            self.line(f"offs_m = start_q + tl.arange(0, {bm})")
            self.line("xindex = offs_m[:, None]")
            self.line(f"xmask = xindex < {self.T}")
        accs = []
        for k, gm in enumerate(grads):
            blk = head_block(gm.free_extent(self.g))
            fixed = "BLOCK_N" if role == "kv" else self.blocks()[0]
            first = gm.tile_pos == 0 or self.flipped  # flipped: every acc is (keys, head)
            shape = f"[{fixed}, {blk}]" if first else f"[{blk}, {fixed}]"
            acc = f"acc_{role}{k}"  # names differ between the roles' branches (Triton types
            accs.append(acc)  # a name both branches define alike)
            self.line(f"{acc} = tl.zeros({shape}, dtype=tl.float32)  # {self.g[gm.node].name}")
        body = lambda: [self._accumulate(gm, acc) for gm, acc in zip(grads, accs)]  # noqa: E731
        if not self.skip:
            self._loop(role, "0", self.T if role == "kv" else self.TK, body, "every tile")
        elif role == "q":
            lo, hi = self.skip.q_bounds(self)
            self._live_loops(role, lo, hi, body, "keys the mask leaves live for", "rows")
        else:
            lo, hi = self.skip.kv_bounds(self)
            self._live_loops(role, lo, hi, body, "rows the mask leaves live for", "keys")
            note = "rows the mask hides these keys from: only a row block within reach"
            self._loop(role, "0", lo, body, note, guard=True)
            self._loop(role, hi, self.T, body, note, guard=True)
        self.lines.append("")
        for gm, acc in zip(grads, accs):
            self._store(gm, acc)
        self.scopes.pop()
        self.held = {}

    def _live_loops(self, role: str, lo: str, hi: str, body, what: str, held: str) -> None:
        """The live tiles ``lo..hi``: in a key program under ``whole`` (exact limits), the
        whole ones without the mask, between the masked edges."""
        if not (self.skip.exact and self.cfg.whole and role == "kv"):
            self._loop(role, lo, hi, body, f"the {what} these {held}")
            return
        flo, fhi = self.skip.kv_full(self, lo, hi)
        some, every = f"{what} some of the {held}: masked", f"{what} all the {held}: no mask"
        self._loop(role, lo, flo, body, some)
        dots = self.dots  # the metadata counts the dots of a tile once
        self.pass_tile = True
        self._loop(role, flo, fhi, body, every)
        self.pass_tile = False
        self._loop(role, fhi, hi, body, some)
        self.dots = dots

    def _loop(self, role: str, lo: str, hi: str, body, note: str, guard: bool = False) -> None:
        bm, bn = self.blocks()
        step, var = (bm, "start_m") if role == "kv" else (bn, "start_n")
        self.lines.append("")
        self.loops.append(Loop(len(self.lines), self.depth))
        self.line(f"for {var} in range({lo}, {hi}, {step}):  # {note}")
        self.depth += 1
        self.scopes.append(Scope())
        self.regions.append(set())
        outer, self.region = self.region, len(self.regions) - 1
        if role == "kv":
            self.line(f"offs_m = start_m + tl.arange(0, {bm})")
            self.line(f"xindex = offs_m{self._ax('rows')}")
            self.line(f"xmask = xindex < {self.T}")
        else:
            self.line(f"offs_n = start_n + tl.arange(0, {bn})")
            self.line("rindex = offs_n[None, :]")
            self.line(f"rmask = rindex < {self.TK}")
        if guard:
            self.line(f"if {self.skip.reach(self, 'reach')}:")
            self.depth += 1
        dots = self.dots
        body()
        if guard:  # the metadata counts the dots of a tile once
            self.dots = dots
        self.depth -= 1 + guard
        self.region = outer
        self.scopes.pop()
        self.loops.pop()

    def _tile(self, gm: GradMatmul) -> str:
        """The gradient's tile operand on the program's tile, zero past the rows and keys."""
        g, p = self.g, self.parts
        index = tile_index(p.domain, p.heads, len(g[gm.tile].shape), self.rows, self.keys)
        v = self.value(gm.tile, index)
        code = cast(v, "float32")
        bm, bn = self.blocks()
        if self.flipped:
            bm, bn = bn, bm
        if v.cls < 2:
            code = (f"tl.full([{bm}, {bn}], {code}, tl.float32)" if v.literal
                    else f"tl.broadcast_to({code}, [{bm}, {bn}])")  # fmt: skip
        edge = [m for m, ok in zip(("xmask", "rmask"), self._ragged()) if ok]
        if edge:
            code = f"tl.where({' & '.join(edge)}, {code}, 0.0)"
        dt = g[g[gm.node].inputs[gm.tile_pos]].dtype
        return f"({code}).to({TL_DTYPE[dt]})"

    def _accumulate(self, gm: GradMatmul, acc: str) -> None:
        g, p = self.g, self.parts
        e = gm.free_extent(g)
        h = self.head_var(e)
        k = p.grads.index(gm)
        self.line(f"t{k} = {self._tile(gm)}  # {g[gm.tile].name}, read by {g[gm.node].name}")
        L = gm.loaded(g)
        var, ext = ("offs_m", p.t) if gm.over_rows else ("offs_n", p.tk)
        side = "rows" if gm.over_rows else "keys"
        t = f"tl.trans(t{k})" if gm.transposed else f"t{k}"
        if self.flipped:  # the tile is tile^T: acc (keys, head) += tile'^T-or-tile' @ L-or-L^T
            trans = gm.transposed != (gm.tile_pos == 0)
            c = Expr.dim(f"{var}[:, None]", 1, ext, True)
            hh = Expr.dim(f"{h}[None, :]", 1, e, True)
            pair = (c, hh) if gm.tile_pos == 0 else (hh, c)  # L[c, j], or L[i, c] read as L^T
            names = (f"{var}[:, None]", f"{h}[None, :]")
            lv = self.operand(
                L, pair, self.mask(**{side: "[:, None]"}, head=(e, "[None, :]")), False, names
            )
            t = f"tl.trans(t{k})" if trans else f"t{k}"
            self.line(f"{acc} = tl.dot({t}, {lv}, {acc}{self.prec(g[L].dtype)})")
        elif gm.tile_pos == 0:  # out = tile' @ L, L[c, j]
            pair = (
                Expr.dim(f"{var}[:, None]", 1, ext, True),
                Expr.dim(f"{h}[None, :]", 1, e, True),
            )
            names = (f"{var}[:, None]", f"{h}[None, :]")
            lv = self.operand(
                L, pair, self.mask(**{side: "[:, None]"}, head=(e, "[None, :]")), False, names
            )
            self.line(f"{acc} = tl.dot({t}, {lv}, {acc}{self.prec(g[L].dtype)})")
        else:  # out = L @ tile', L[i, c]
            pair = (
                Expr.dim(f"{h}[:, None]", 1, e, True),
                Expr.dim(f"{var}[None, :]", 1, ext, True),
            )
            names = (f"{h}[:, None]", f"{var}[None, :]")
            lv = self.operand(
                L, pair, self.mask(**{side: "[None, :]"}, head=(e, "[:, None]")), False, names
            )
            self.line(f"{acc} = tl.dot({lv}, {t}, {acc}{self.prec(g[L].dtype)})")
        self.dots += 1

    def _store(self, gm: GradMatmul, acc: str) -> None:
        g, p = self.g, self.parts
        node = g[gm.node]
        e = gm.free_extent(g)
        h = self.head_var(e)
        var, ext = ("offs_n", p.tk) if gm.over_rows else ("offs_m", p.t)
        side = "keys" if gm.over_rows else "rows"
        if gm.tile_pos == 0 or self.flipped:  # acc[held, head] (flipped: out or out^T)
            held = Expr.dim(f"{var}[:, None]", 1, ext, True)
            head = Expr.dim(f"{h}[None, :]", 1, e, True)
            pair = (held, head) if gm.tile_pos == 0 else (head, held)
            mask = self.mask(**{side: "[:, None]"}, head=(e, "[None, :]"))
            names = (f"{var}[:, None]", f"{h}[None, :]")
        else:  # acc[head, held]
            pair = (
                Expr.dim(f"{h}[:, None]", 1, e, True),
                Expr.dim(f"{var}[None, :]", 1, ext, True),
            )
            mask = self.mask(**{side: "[None, :]"}, head=(e, "[:, None]"))
            names = (f"{var}[None, :]", f"{h}[:, None]")
        index = (*self.bh3, *pair) if len(node.shape) == 3 else pair
        # a single query row or a head dim of 1: the whole tile stored all the same
        strides = contiguous_strides(node.shape)
        if self.grown:
            strides = grown_strides(node.shape, index, strides)
        off = tile_address(linearize(index, strides, node.shape), names)
        masked = f", {mask}" if mask else ""
        out = f"{acc}.to({TL_DTYPE[node.dtype]})"
        self.line(f"tl.store({self.out_ptr[gm.node]} + ({off}), {out}{masked})")


def generate_attention_bwd(
    graph: Graph, info: GroupInfo, config: AttentionBwdConfig, index: int
) -> Kernel:
    """The kernel of the group under ``config``; under runtime sizes one that takes the query
    and key counts as arguments, as the forward's (``attention/runtime.py``): every tile edge
    masked, so no tile is read through a descriptor (they read only unmasked tiles)."""
    parts = backward_facts(graph, frozenset(info.nodes))

    def render(sizes: Sizes) -> Kernel:
        em = BwdEmitter(graph, info, config, parts, sizes)
        return _render(graph, info, config, index, em)

    return sized_kernel(render, runtime_sizes_on())


def _render(
    graph: Graph, info: GroupInfo, config: AttentionBwdConfig, index: int, em: BwdEmitter
) -> Kernel:
    parts = em.parts
    body = em.emit()
    name = kernel_name(graph, info, "attbwd", index)
    params = [em.ptr[i] for i in info.loads] + [em.out_ptr[i] for i in info.stored]
    params += ["T", "TK"] if em.runtime else []
    consts = ["BLOCK_M", "BLOCK_N"]
    what = f"attention backward, tiles {list(info.domain)}"
    header = kernel_header(em, name, what, params + [f"{c}: tl.constexpr" for c in consts])
    helpers = [h.source + "\n" for h in sorted(em.helpers, key=lambda h: h.name)]
    src = "\n".join(["import triton", "import triton.language as tl", "", ""] + helpers + header)
    layout = [("in", k) for k in range(len(info.loads))]
    layout += [("out", k) for k in range(len(info.stored))]
    layout += [("int", parts.t), ("int", parts.tk)] if em.runtime else []
    kv = any(gm.over_rows for gm in parts.grads)
    q = any(not gm.over_rows for gm in parts.grads)
    programs = kv * -(-parts.tk // config.BLOCK_N) + q * -(-parts.t // role_blocks(config, "q")[0])
    kw = (
        ("BLOCK_M", config.BLOCK_M), ("BLOCK_N", config.BLOCK_N),
        ("num_warps", config.num_warps), ("num_stages", config.num_stages),
    )  # fmt: skip
    tiles = [role_blocks(config, r) for r, on in (("kv", kv), ("q", q)) if on]
    work = em.skip.work(*tiles) if em.skip else 1.0
    return Kernel(
        name=name,
        source=src + "\n" + "\n".join(body) + "\n",
        config=config,
        info=info,
        layout=tuple(layout),
        grid=(programs, parts.heads),
        launch_kw=kw,
        meta=KernelMeta(
            load_passes=em.load_passes(),
            dots=em.dots,
            work=work,
            needs_allocator=bool(em.descriptors),
            input_alignment=DESCRIPTOR_ALIGNMENT if em.descriptors else 0,
        ),
    )
