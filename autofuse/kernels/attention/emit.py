"""The attention kind's kernel: its config and the emitter of the flash-attention style kernel
(``kind.py`` tells the whole kind)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

from autofuse.ir.graph import Graph, buffer_strides, contiguous_strides, numel
from autofuse.ir.indexing import Expr, linearize
from autofuse.kernels.attention import tma as attention_tma
from autofuse.kernels.attention.analysis import AttentionParts, forward_facts, head_block
from autofuse.kernels.attention.bounds import (
    key_bound,
    key_fraction,
    live_columns,
    scores_index,
    whole_columns,
    whole_range_lines,
)
from autofuse.kernels.attention.facts import tile_load
from autofuse.kernels.attention.runtime import (
    BAKED,
    KEY_VARS,
    ROW_VARS,
    Sizes,
    grown_strides,
    sized_kernel,
)
from autofuse.kernels.common.base import (
    DESCRIPTOR_ALIGNMENT,
    FusionRefused,
    GroupInfo,
    Kernel,
    KernelMeta,
    TileConfig,
    describe,
    kernel_name,
)
from autofuse.kernels.common.emitter import Emitter, Scope
from autofuse.kernels.common.render import (
    LOG2E,
    TL_DTYPE,
    Val,
    cast,
    compute_dtype,
    kernel_header,
    literal,
    tile_address,
)
from autofuse.kernels.common.sizes import runtime_sizes_on
from autofuse.kernels.common.views import (
    broadcast_index,
)


@dataclass(frozen=True, order=True)
class AttentionConfig(TileConfig):
    """BLOCK_M query rows per program, BLOCK_N keys per step of the key loop; ``TMA``: K and V
    tiles read through tensor descriptors (``attention_tma.py``)."""

    SWITCHES: ClassVar[tuple[str, ...]] = ("TMA",)  # the search and the polish switch it
    TMA: bool = False

    def label(self) -> str:
        return super().label() + (" TMA" if self.TMA else "")


# ---------------------------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------------------------


_NEG_INF = 'float("-inf")'
_NAN = 'float("nan")'
_UNDERFLOW = -200.0  # exp(x - m) is 0.0 in fp32 below this: those elements add nothing


class AttentionEmitter(Emitter):
    """Renders the kernel body. The scores' epilogue is the loop emitter's ``value`` at the
    domain index (rows ``xindex = offs_m[:, None]``, keys ``rindex = offs_n[None, :]``,
    batch dims from ``bh``, the program's (batch, head)); the first matmul's value is the tile
    ``qk``; the softmax and the second matmul are this class's own lines."""

    # the score tiles are float32, scaled by log2 e where the softmax scale is folded in: a
    # cast to float32 of the scores is not rounded to their 16-bit dtype (the forward and the
    # backward kernel see the same scores)
    rounds_casts = False

    def block(self, axis: str) -> int:
        """Query rows (``x``: BLOCK_M) by keys (``r``: BLOCK_N) per tile."""
        return self.cfg.BLOCK_M if axis == "x" else self.cfg.BLOCK_N

    def __init__(
        self, graph: Graph, info: GroupInfo, config, parts: AttentionParts, sizes: Sizes = BAKED
    ) -> None:
        super().__init__(graph, info, config)
        self.parts = parts
        # under runtime sizes the counts are the arguments T and TK (``runtime.py``); ``grown``:
        # the probe that finds which strides hold them
        self.runtime, self.grown = sizes.runtime, sizes.grown
        self.T, self.TK, self.T1, _ = sizes.names(parts.t, parts.tk)
        self.dims = parts  # rows, keys and head dims: the group's facts
        self.full = scores_index(info.domain)
        self.bh3 = (
            (Expr.dim("bh", 1, self.dims.heads, True),) if len(graph[parts.mm1].shape) == 3 else ()
        )
        self.select, self.limits, self.exact = key_bound(graph, info, self.full)
        self.const_tile = False  # emitting a tile on which the select gives its constant
        self.pass_tile = False  # emitting a tile on which the select passes the scores
        self.fold = parts.fold
        self.tma: dict[str, attention_tma.Operand] = {}  # K / V read by descriptors (emit)

    def _needs_int64(self) -> bool:  # the scores are never addressed: only loads and the output
        sizes = [self._extent(i) for i in self.info.loads]
        sizes.append(numel(self.g[self.info.matmuls[1]].shape))
        return max(sizes) >= 2**31 - 1

    # -- values ------------------------------------------------------------------------------
    def value(self, i: int, index) -> Val:
        if self.pass_tile and i == self.select.node:
            j = self.select.passed
            return self.value(j, broadcast_index(self.g[j].shape, self.g[i].shape, index))
        if self.const_tile and i == self.select.node:
            if self.fold:
                return Val(literal(self.select.folded(self.fold), "float32"), 0, "float32", True)
            dt = self.g[i].dtype
            return Val(literal(self.select.const, dt), 0, compute_dtype(dt), True)
        if self.fold and i in self.fold.consts:  # the scores in the log2 domain: C * log2 e
            return Val(literal(self.fold.consts[i], "float32"), 0, "float32", True)
        if self.fold and i == self.fold.scale_node:
            return self.tmp("qk * qk_scale", 2, "float32", f"{self.g[i].name}, times log2 e")
        if self.fold and i == self.fold.add and self.lookup((i, index)) is None:
            self.scopes[-1].cache[(i, index)] = v = self._add_bias(i, index)
            return v
        return super().value(i, index)

    def _add_bias(self, i: int, index) -> Val:
        """The added mask in the log2 domain: ``b * log2 e`` kept finite where ``b`` is (a
        row that ``finfo.min`` hides stays uniform), fused with the scale where it adds to it
        directly: ``tl.fma(qk, qk_scale, b)``."""
        node, g = self.g[i], self.g
        ja, jb = node.inputs
        if g.base_of(ja) == self.fold.bias:
            ja, jb = jb, ja
        b = self.value(jb, broadcast_index(g[jb].shape, node.shape, index))
        cls, b = b.cls, cast(b, "float32")
        big = 3.4028234663852886e38
        b2 = self.tmp(f"tl.where(tl.abs({b}) == float(\"inf\"), {b}, "
                      f"tl.minimum(tl.maximum({b} * {LOG2E!r}, {-big!r}), {big!r}))",
                      cls, "float32",
                      f"{g[self.fold.bias].name} times log2 e")  # fmt: skip
        if g.base_of(ja) == self.fold.scale_node:
            return self.tmp(f"tl.fma(qk, qk_scale, {b2.code})", 2, "float32", node.name)
        a = self.value(ja, broadcast_index(g[ja].shape, node.shape, index))
        return self.tmp(f"{cast(a, 'float32')} + {b2.code}", 2, "float32", node.name)

    def load(self, i: int, index) -> Val:
        """A mask tensor's load, masked only along the dims its address uses where they can
        run past the tile (a (B, 1, 1, T) padding mask is one [1, BLOCK_N] vector a tile)."""
        if self.guards:
            return super().load(i, index)
        node = self.g[i]
        strides = buffer_strides(node)
        if self.grown:
            strides = grown_strides(node.shape, index, strides)
        off = linearize(index, strides, node.shape)
        mask = self._mask(off.vars)
        cd = compute_dtype(node.dtype)
        self.note_load(i)
        code = f"tl.load({self.ptr[i]} + ({off.render()}){f', {mask}, other=0' if mask else ''})"
        if cd != node.dtype:
            code += f".to({TL_DTYPE[cd]})"
        return self.tmp(code, self.cls_of(off), cd, f"load {node.name}")

    def _mask(self, names, extra: str = "") -> str | None:
        """The bounds mask of an address using ``names``: only of a dim whose tiles may run
        past its extent (none on a whole tile: the keys of a tile live on every row end
        before the last, see ``_full_lines``), and ``extra``."""
        parts = []
        if any(n.startswith(ROW_VARS) for n in names) and self._ragged("x"):
            parts.append("xmask")
        keys = any(n.startswith(KEY_VARS) for n in names)
        if keys and self._ragged("r") and not self.pass_tile:
            parts.append("rmask" if any(n.startswith("rindex") for n in names) else
                         f"(offs_n[:, None] < {self.TK})")  # fmt: skip
        parts += [extra] if extra else []
        return " & ".join(parts) or None

    def _ragged(self, axis: str) -> bool:
        """Whether the last tile may run past the query rows (``x``) or the keys (``r``):
        always under runtime sizes (the counts are arguments), else where a block does not
        divide them."""
        if self.runtime:
            return True
        d, cfg = self.dims, self.cfg
        return bool(d.t % cfg.BLOCK_M if axis == "x" else d.tk % cfg.BLOCK_N)

    def reduced(self, i: int, index) -> Val:
        mm1 = self.parts.mm1
        want = (*self.bh3, self.full[-2], self.full[-1])
        if i != mm1:
            raise FusionRefused(f"{describe(self.g, i)} is read by the scores' epilogue")
        if tuple(index) != want:
            raise FusionRefused(
                f"{describe(self.g, i)} is read at ({', '.join(map(str, index))}), not at the "
                "score tile the program computes"
            )
        return Val("qk", 2, "float32")

    def _operand_load(self, which: str, index, mask: str | None, var: str) -> None:
        if which in self.tma:
            return attention_tma.load(self, which, var)
        j = self.parts.operand(self.g, which)
        base, off = self.parts.operand_offset(self.g, j, index, self.grown)
        self.note_load(base)
        self.line(f"{var} = {tile_load(self.ptr[base], off, _TILE[which], mask)}")

    # -- kernel ------------------------------------------------------------------------------
    def emit(self) -> list[str]:
        d = self.dims
        self.line("pid_m = tl.program_id(0)")
        self.line(f"bh = tl.program_id(1){'.to(tl.int64)' if self.int64 else ''}  # batch x head")
        self.line("offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
        self.line("xindex = offs_m[:, None]")
        self.line(f"xmask = xindex < {self.T}")
        self.line("offs_d = tl.arange(0, BLOCK_D)")
        self.line("offs_dv = tl.arange(0, BLOCK_DV)")
        dq = Expr.dim("offs_d[None, :]", 1, d.d, True)
        qmask = self._mask(
            {"xindex"}, "" if d.d == head_block(d.d) else f"(offs_d[None, :] < {d.d})"
        )
        self._operand_load("q", (*self.bh3, self.full[-2], dq), qmask, "q")
        self.tma = attention_tma.setup(self) if self.cfg.TMA else {}
        if self.fold:
            self.line(f"qk_scale = {self.fold.qk_scale!r}  # the softmax scale times log2 e")
        dom = "qk * qk_scale" if self.fold else "x"
        self.line(f"m_i = tl.full([BLOCK_M], {_NEG_INF}, tl.float32)  # running row max of {dom}")
        self.line("l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp(x - max)")
        self.line("acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)")
        lo, hi = self._bound_lines()
        self.lines.append("")
        if self.limits and self.exact:
            name = self.g[self.select.node].name
            self._loop("lo", "flo", False, f"keys {name} leaves live for some rows: masked")
            self.pass_tile = True
            self._loop("flo", "fhi", False, f"keys {name} leaves live for every row: no mask")
            self.pass_tile = False
            self._loop("fhi", "hi", False, f"keys {name} leaves live for some rows: masked")
        else:
            self._loop(lo, hi, False, "live keys")
        self._const_pass(lo, hi)
        self._store()
        return self.lines

    def _bound_lines(self) -> tuple[str, str]:
        if not self.limits:
            return "0", self.TK
        name = self.g[self.select.node].name
        self.line(f"# {name}: the keys its condition leaves live for these rows")
        self.line("r0 = pid_m * BLOCK_M")
        self.line(f"r1 = tl.minimum(r0 + BLOCK_M - 1, {self.T1})")
        hi, lo = live_columns(self.limits, "r0", "r1")
        self.line(f"hi = tl.minimum(tl.maximum({hi or self.TK}, 0), {self.TK})")
        self.line(f"lo = tl.minimum(tl.maximum({lo or 0}, 0), hi)")
        if self.exact:
            self._full_lines()
        self.line("lo = (lo // BLOCK_N) * BLOCK_N")
        self.line("hi = ((hi + BLOCK_N - 1) // BLOCK_N) * BLOCK_N")
        return "lo", "hi"

    def _full_lines(self) -> None:
        """``flo``, ``fhi``: the whole key tiles live on every row of the program."""
        flo, fhi = whole_columns(self.limits, "r0", "r1")
        whole_range_lines(self.line, ("flo", "fhi"), flo, fhi, "lo", "hi", "BLOCK_N")

    def _loop(self, start: str, end: str, const: bool, note: str) -> None:
        self.line(f"for start_n in range({start}, {end}, BLOCK_N):  # {note}")
        self.depth += 1
        self.scopes.append(Scope())
        self.regions.append(set())
        outer, self.region = self.region, len(self.regions) - 1
        self._tile(const)
        self.region = outer
        self.scopes.pop()
        self.depth -= 1

    def _tile(self, const: bool) -> None:
        d = self.dims
        self.line("offs_n = start_n + tl.arange(0, BLOCK_N)")
        self.line("rindex = offs_n[None, :]")
        self.line(f"rmask = rindex < {self.TK}")
        dmask = "" if d.d == head_block(d.d) else f"(offs_d[:, None] < {d.d})"
        prec = ', input_precision="ieee"' if self.g[self.parts.mm1].dtype == "float32" else ""
        if not const:
            dk = Expr.dim("offs_d[:, None]", 1, d.d, True)
            self._operand_load(
                "k", (*self.bh3, dk, self.full[-1]), self._mask({"rindex"}, dmask), "kt"
            )
            self.dots += 1
            self.line(f"qk = tl.dot(q, kt{prec})  # scores")
            f, added = self.fold, self.pass_tile and self.fold and self.fold.add == self.select.node
            if f and ((not f.add and (self.pass_tile or not f.consts)) or (added and not f.consts)):
                self._online_fma(prec)
                return
        self.const_tile = const
        x = self.value(self.parts.x, self.full)
        self.const_tile = False
        code = cast(x, "float32")
        if x.cls < 2:
            code = (
                f"tl.full([BLOCK_M, BLOCK_N], {code}, tl.float32)"
                if x.literal
                else (f"tl.broadcast_to({code}, [BLOCK_M, BLOCK_N])")
            )
        if self._ragged("r"):
            code = f"tl.where(rmask, {code}, {_NEG_INF})"
        dom = ", times log2 e" if self.fold else ""
        self.line(f"s = {code}  # {self.g[self.parts.x].name}, the softmax input{dom}")
        if const and not self._const_x():
            self.line(f"if tl.max(tl.max(tl.where(xmask, s - m_i[:, None], {_NEG_INF}), 1), 0) > "
                      f"{_UNDERFLOW}:  # a row these constant keys still reach")  # fmt: skip
            self.depth += 1
            self._online(prec)
            self.depth -= 1
        else:
            self._online(prec)

    def _online_fma(self, prec: str) -> None:
        """The folded scale on a tile the selects pass: ``p = exp2(qk * qk_scale - m)``, one
        FMA a score (the row max of ``qk`` times the positive ``qk_scale`` is the row max of
        the products: rounding is monotone)."""
        if self._ragged("r") and not self.pass_tile:
            self.line(f"qk = tl.where(rmask, qk, {_NEG_INF})  # keys past the end")
        self.line("m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)")
        self._online(prec, "tl.fma(qk, qk_scale, -m_use[:, None])")

    def _online(self, prec: str, shifted: str | None = None) -> None:
        d = self.dims
        if shifted is None:
            self.line("m_new = tl.maximum(m_i, tl.max(s, 1))")
            shifted = "s - m_use[:, None]"
        self.line(f"m_use = tl.where(m_new == {_NEG_INF}, 0.0, m_new)  # no -inf - -inf")
        if self.fold:  # the scores are in the log2 domain already
            self.line(f"p = tl.exp2({shifted})")
            self.line("alpha = tl.exp2(m_i - m_use)")
        else:
            self.line(f"p = tl.exp2(({shifted}) * {LOG2E!r})")
            self.line(f"alpha = tl.exp2((m_i - m_use) * {LOG2E!r})")
        # acc holds the normalized output so far (weights p / l summing to 1): an unnormalized
        # sum of p * v overflows where v is near the dtype's max and eager's softmax @ v does not
        self.line("l_new = l_i * alpha + tl.sum(p, 1)")
        self.line("r_new = 1.0 / tl.where(l_new > 0, l_new, 1.0)  # (p is 0 where l_new is)")
        self.line("keep = alpha * l_i * r_new  # the old weights' share of the new sum")
        self.line("p = p * r_new[:, None]")
        self.line("l_i = l_new")
        dn = Expr.dim("offs_n[:, None]", 1, d.tk, True)
        dv = Expr.dim("offs_dv[None, :]", 1, d.dv, True)
        dvmask = "" if d.dv == head_block(d.dv) else f"(offs_dv[None, :] < {d.dv})"
        self._operand_load("v", (*self.bh3, dn, dv), self._mask({"offs_n"}, dvmask), "v")
        self.dots += 1
        pd = TL_DTYPE[self.parts.p_dtype]
        self.line(
            f"acc = tl.dot(p.to({pd}), v, acc * keep[:, None]{prec})  # rescaled, accumulated"
        )
        self.line("m_i = m_new")

    def _const_x(self) -> str | None:
        """The softmax input on a skipped tile when it is one constant (the select's constant
        reaches it through casts), as a literal; None otherwise."""
        g, i = self.g, self.parts.x
        while g[i].op == "cast" and i != self.select.node:
            i = g[i].inputs[0]
        if i != self.select.node:
            return None
        if self.fold:
            return literal(self.select.folded(self.fold), "float32")  # -inf: no pass
        x = g[self.parts.x]
        c = float(self.select.const)
        import torch  # the constant rounded as eager rounds it on the way to x

        t = torch.tensor(c, dtype=getattr(torch, g[i].dtype)).to(getattr(torch, x.dtype))
        return literal(float(t), "float32")  # inf and nan as float("...") (no Python names)

    def _const_pass(self, lo: str, hi: str) -> None:
        """The skipped tiles, added where a row's max is still within reach of the constant."""
        if not self.limits:
            return
        cx = self._const_x()
        if cx is not None and cx == literal(-math.inf, "float32"):
            self.line("# the skipped keys hold -inf: they add nothing")
            return
        self.lines.append("")
        if cx is not None:
            self.line(f"if tl.max(tl.where(offs_m < {self.T}, {cx} - m_i, {_NEG_INF}), 0) > "
                      f"{_UNDERFLOW}:  # a row whose max the masked keys reach")  # fmt: skip
            self.depth += 1
        self._loop("0", lo, True, "keys the mask hides: no product")
        self._loop(hi, self.TK, True, "keys the mask hides: no product")
        if cx is not None:
            self.depth -= 1

    def _store(self) -> None:
        d, g = self.dims, self.g
        mm2 = self.parts.mm2
        node = g[mm2]
        self.lines.append("")
        self.line(
            f"out = tl.where(l_i[:, None] > 0, acc, {_NAN})  # a row of -inf only: NaN, as eager"
        )
        dv = Expr.dim("offs_dv[None, :]", 1, d.dv, True)
        off = self._written((*self.bh3, self.full[-2], dv), node.shape)
        mask = "xmask" + ("" if d.dv == head_block(d.dv) else f" & (offs_dv[None, :] < {d.dv})")
        addr = tile_address(off, ("xindex", "offs_dv[None, :]"))
        self.line(
            f"tl.store({self.out_ptr[mm2]} + ({addr}), out.to({TL_DTYPE[node.dtype]}), {mask})"
        )
        self._store_stats()

    def _written(self, index, shape) -> Expr:
        """The offset of ``index`` in a buffer of ``shape`` the kernel writes (contiguous)."""
        strides = contiguous_strides(shape)
        if self.grown:
            strides = grown_strides(shape, index, strides)
        return linearize(index, strides, shape)

    def _store_stats(self) -> None:
        """softmax's row max and sum where the graph keeps them (saved for the backward): the
        final ``m_i`` and ``l_i`` (a row of -inf only: sum NaN, as eager's exp(-inf - -inf))."""
        g = self.g
        rows = self.full[:-1]
        for i, var in ((self.parts.amax, "m_i"), (self.parts.total, "l_stat")):
            if i not in self.info.stored:
                continue
            if var == "l_stat":
                self.line(f'l_stat = tl.where(m_i == {_NEG_INF}, float("nan"), l_i)')
            node = g[i]
            shape = node.shape[:-1] if len(node.shape) == len(self.info.domain) else node.shape
            off = self._written(rows, shape)
            val = f"{var}[:, None].to({TL_DTYPE[node.dtype]})"
            addr = tile_address(off, ("xindex",))
            self.line(f"tl.store({self.out_ptr[i]} + ({addr}), {val}, xmask)")


# the row and column variables of each operand tile: Q [BLOCK_M, D], K^T [D, BLOCK_N], V [BLOCK_N, DV]
_TILE = {"q": ("xindex", "offs_d[None, :]"), "k": ("offs_d[:, None]", "rindex"),
         "v": ("offs_n[:, None]", "offs_dv[None, :]")}  # fmt: skip


def parts_of(graph: Graph, info: GroupInfo) -> AttentionParts:
    """The attention group's parts (its two matmuls, softmax, mask and epilogue; its sizes),
    found once."""
    return forward_facts(graph, frozenset(info.nodes))


def generate_attention(
    graph: Graph, info: GroupInfo, config: AttentionConfig, index: int
) -> Kernel:
    """The kernel of the group under ``config``; under runtime sizes one that takes the query
    and key counts as arguments (``runtime.py``), but for a TMA config: its descriptors span
    the buffers' rows at this shape and need whole key tiles, so it stays a kernel per shape
    (the config space offers none under runtime sizes; a TMA config whose ``BLOCK_N`` does
    not divide this shape's keys reads by pointers)."""
    parts = parts_of(graph, info)
    runtime = runtime_sizes_on()
    if runtime and config.TMA and parts.tk % config.BLOCK_N:
        config = replace(config, TMA=False)

    def render(sizes: Sizes) -> Kernel:
        em = AttentionEmitter(graph, info, config, parts, sizes)
        return _render(graph, info, config, index, em)

    return sized_kernel(render, runtime and not config.TMA)


def _render(
    graph: Graph, info: GroupInfo, config: AttentionConfig, index: int, em: AttentionEmitter
) -> Kernel:
    body = em.emit()
    name = kernel_name(graph, info, "att", index)
    d = em.parts
    bd, bdv = head_block(d.d), head_block(d.dv)
    params = [em.ptr[i] for i in info.loads] + [em.out_ptr[i] for i in info.stored]
    params += ["T", "TK"] if em.runtime else []
    consts = ["BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_DV"]
    what = f"attention, scores {list(info.domain)}, head dim {d.d}"
    header = kernel_header(em, name, what, params + [f"{c}: tl.constexpr" for c in consts])
    helpers = [h.source + "\n" for h in sorted(em.helpers, key=lambda h: h.name)]
    src = "\n".join(["import triton", "import triton.language as tl", "", ""] + helpers + header)
    layout = [("in", k) for k in range(len(info.loads))]
    layout += [("out", k) for k in range(len(info.stored))]
    layout += [("int", d.t), ("int", d.tk)] if em.runtime else []
    kw = (
        ("BLOCK_M", config.BLOCK_M), ("BLOCK_N", config.BLOCK_N), ("BLOCK_D", bd),
        ("BLOCK_DV", bdv), ("num_warps", config.num_warps), ("num_stages", config.num_stages),
    )  # fmt: skip
    return Kernel(
        name=name,
        source=src + "\n" + "\n".join(body) + "\n",
        config=config,
        info=info,
        layout=tuple(layout),
        grid=(-(-d.t // config.BLOCK_M), d.heads),
        launch_kw=kw,
        meta=KernelMeta(
            load_passes=em.load_passes(),
            dots=2,
            work=key_fraction(d.t, d.tk, em.limits, config.BLOCK_M, config.BLOCK_N),
            needs_allocator=config.TMA,
            input_alignment=DESCRIPTOR_ALIGNMENT if config.TMA else 0,
        ),
    )


# ---------------------------------------------------------------------------------------------
# Configs and the plugin
# ---------------------------------------------------------------------------------------------
