"""GEMM groups: a matmul with its fused prologue and epilogue, lowered onto the GEMM template.

A GEMM group holds one ``mm``/``bmm`` (or two sharing their A operand: horizontal fusion, as in
SwiGLU's ``x @ W1`` and ``x @ W2``), the pointwise nodes that compute its operands (prologue,
evaluated per loaded tile at index (m, k) or (k, n)) and the pointwise nodes over its output
(epilogue, evaluated on the accumulator tile at (m, n) before the only store). The same index
machinery as the other kernels applies: operands reached through views are strided loads, and
the epilogue may read bias, residual or masks broadcast or full-size.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .codegen import (
    TL_DTYPE,
    FusionRefused,
    GroupInfo,
    Kernel,
    _cast,
    _describe,
    _Emitter,
    _identity,
    _literal,
    _minmax,
    _Scope,
    _Val,
    broadcast_index,
    compute_dtype,
    exp_minus,
    kernel_name,
    loaded_nodes,
    stored_nodes,
    view_source_index,
)
from .gemm_template import GemmConfig, GemmSpec, default_configs, param_names, prune_configs, render
from .indexing import Expr, linearize
from .ir import Graph, contiguous_strides

_ITEM = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def analyze_gemm_group(graph: Graph, members: frozenset[int]) -> GroupInfo:
    mms = [m for m in sorted(members) if graph[m].kind == "matmul"]
    if len(mms) > 2:
        raise FusionRefused(f"{len(mms)} matmuls in one group: at most two sharing an operand")
    for m in sorted(members):
        if graph[m].kind == "reduction":
            raise FusionRefused(
                f"{_describe(graph, m)} is a reduction: row-reduction epilogues on GEMMs are "
                "not generated yet"
            )
    first = graph[mms[0]]
    if len(mms) == 2:
        second = graph[mms[1]]
        if first.inputs[0] != second.inputs[0] or first.shape != second.shape:
            raise FusionRefused(
                f"{_describe(graph, mms[0])} and {_describe(graph, mms[1])} do not share their "
                "A operand and output shape: no horizontal GEMM"
            )
        if graph.base_of(second.inputs[0]) in members or graph.base_of(second.inputs[1]) in members:
            raise FusionRefused("a horizontal GEMM pair takes no prologue")
        if mms[1] in _ancestors(graph, mms[0]) or mms[0] in _ancestors(graph, mms[1]):
            raise FusionRefused("one matmul feeds the other: they cannot share a K loop")
    domain = first.shape
    stored = stored_nodes(graph, members)
    for s in stored:
        if graph[s].shape != domain:
            raise FusionRefused(
                f"{_describe(graph, s)} must be stored but is not over the GEMM output "
                f"{list(domain)} (a prologue result needed elsewhere)"
            )
    info = GroupInfo(
        nodes=tuple(sorted(members)),
        kind="gemm",
        domain=tuple(domain),
        reduce_dims=(),
        stored=stored,
        loads=loaded_nodes(graph, members),
        matmuls=tuple(mms),
    )
    _GemmEmitter(graph, info, GemmConfig(16, 16, 16, 1, 1, 2)).hooks()  # index checks
    return info


def memory_offset(graph: Graph, i: int, idx) -> Expr:
    """Offset into the buffer behind node ``i`` (through its views) of element ``idx``."""
    while graph[i].kind == "view":
        idx = view_source_index(graph, i, idx)
        i = graph[i].inputs[0]
    node = graph[i]
    strides = node.strides if node.kind == "input" else contiguous_strides(node.shape)
    return linearize(idx, strides, node.shape)


def _ancestors(graph: Graph, i: int) -> set[int]:
    out, todo = set(), list(graph.compute_inputs(i))
    while todo:
        j = todo.pop()
        if j not in out:
            out.add(j)
            todo.extend(graph.compute_inputs(j))
    return out


def _dims(graph: Graph, info: GroupInfo) -> tuple[int, int, int, int]:
    a = graph[graph[info.matmuls[0]].inputs[0]].shape
    out = info.domain
    batch = out[0] if len(out) == 3 else 1
    return batch, out[-2], out[-1], a[-1]


class _GemmEmitter(_Emitter):
    """Emits the hook bodies: operand loads (with prologue) and the epilogue."""

    def __init__(self, graph: Graph, info: GroupInfo, config: GemmConfig) -> None:
        super().__init__(graph, info, config)
        self.depth = 0  # hook lines carry no indentation: the template indents them
        self.int64 = False
        self.mask = "mask"
        batch, m, n, _ = _dims(graph, info)
        b = (Expr.dim("pid_b", 1, batch, True),) if len(info.domain) == 3 else ()
        self.full = b + (Expr.dim("rm", 1, m, True), Expr.dim("rn", 1, n, True))
        self.batch_index = b

    def cls_of(self, e: Expr) -> int:
        return 2 if e.vars else 0

    def mask_for(self, cls: int) -> str | None:
        return self.mask if cls else None

    def reduced(self, i: int, index):
        if index != self.full:
            raise FusionRefused(
                f"{_describe(self.g, i)} is read at ({', '.join(map(str, index))}), not at its "
                "own output tile: the value would come from another program"
            )
        k = self.info.matmuls.index(i)
        name = ("acc0", "acc1")[k] if len(self.info.matmuls) == 2 else "acc"
        return _Val(name, 2, "float32")

    def operand(self, mm: int, which: int, var: str) -> list[str]:
        """Lines assigning ``var``: the A (which=0) or B (which=1) tile of ``mm``."""
        self.lines, self.scopes = [], [_Scope()]
        node = self.g[mm]
        src = node.inputs[which]
        if which == 0:
            idx = self.batch_index + (
                Expr.dim("offs_m[:, None]", 1, node.shape[-2], True),
                Expr.dim("offs_k[None, :]", 1, self.g[src].shape[-1], True),
            )
            self.mask = "mask_m[:, None] & mask_k[None, :]"
        else:
            idx = self.batch_index + (
                Expr.dim("offs_k[:, None]", 1, self.g[src].shape[-2], True),
                Expr.dim("offs_n[None, :]", 1, node.shape[-1], True),
            )
            self.mask = "mask_k[:, None] & mask_n[None, :]"
        dot_dtype = self.g[src].dtype
        base = self.g.base_of(src)
        if getattr(self.cfg, "TMA", False) and tma_operand(self.g, self.info, src):
            return self._descriptor_load(src, which, var)
        if base not in self.members:  # a plain (possibly strided) load, no conversion
            off = self._offset(src, idx)
            ptr = f"{self.ptr[base]} + ({off.render()})"
            if self._even(which):  # the tile never crosses an edge: no mask in the K loop
                self.line(f"{var} = tl.load({ptr})")
            else:
                self.line(f"{var} = tl.load({ptr}, {self.mask}, other=0.0)")
            return self.lines
        v = self.value(src, idx)
        self.line(f"{var} = tl.where({self.mask}, {v.code}, 0.0).to({TL_DTYPE[dot_dtype]})")
        return self.lines

    def _descriptor_load(self, src: int, which: int, var: str) -> list[str]:
        """``var`` read through a TMA descriptor of the whole operand, made once in setup."""
        node = self.g[src]
        rows, cols = node.shape
        desc, block = f"{var}_desc", ("BLOCK_M, BLOCK_K" if which == 0 else "BLOCK_K, BLOCK_N")
        self.setup_lines.append(
            f"{desc} = tl.make_tensor_descriptor({self.ptr[src]}, shape=[{rows}, {cols}], "
            f"strides=[{node.strides[0]}, 1], block_shape=[{block}])  # {node.name}"
        )
        at = (
            "pid_m * BLOCK_M, k_iter * BLOCK_K"
            if which == 0
            else "k_iter * BLOCK_K, pid_n * BLOCK_N"
        )
        self.lines = [f"{var} = {desc}.load([{at}])  # TMA; rows past the edge read as zero"]
        return self.lines

    def _even(self, which: int) -> bool:
        """Whether the operand's tiles divide its shape under this config (masks can go)."""
        _, m, n, k = _dims(self.g, self.info)
        c = self.cfg
        rows = m % c.BLOCK_M == 0 if which == 0 else True
        cols = n % c.BLOCK_N == 0 if which == 1 else True
        return rows and cols and k % c.BLOCK_K == 0

    def _offset(self, i: int, idx) -> Expr:
        return memory_offset(self.g, i, idx)

    def epilogue(self) -> list[str]:
        self.lines, self.scopes = [], [_Scope()]
        self.mask = "mask"
        for s in self.info.stored:
            v = self.value(s, self.full)
            node = self.g[s]
            off = linearize(self.full, contiguous_strides(node.shape), node.shape)
            code = v.code
            if v.literal or v.cls == 0:
                code = f"tl.full([BLOCK_M, BLOCK_N], {code}, tl.float32)"
            if compute_dtype(node.dtype) != node.dtype or v.dtype != node.dtype:
                code = f"{code}.to({TL_DTYPE[node.dtype]})"
            self.line(f"tl.store({self.out_ptr[s]} + ({off.render()}), {code}, mask)")
        return self.lines

    def hooks(self) -> dict[str, list[str]]:
        mms = self.info.matmuls
        self.setup_lines: list[str] = []
        out = {"load_a": self.operand(mms[0], 0, "a"), "load_b": self.operand(mms[0], 1, "b")}
        if len(mms) == 2:
            out["load_b1"] = self.operand(mms[1], 1, "b1")
        out["epilogue"] = self.epilogue()
        out["setup"] = self.setup_lines
        return out


def tma_operand(graph: Graph, info: GroupInfo, src: int) -> bool:
    """Whether a 2-D GEMM operand can be read through a TMA descriptor: a graph input (no
    view, no prologue) stored row-major with a 16-byte aligned row pitch."""
    node = graph[src]
    if len(info.domain) != 2 or node.kind != "input" or len(node.shape) != 2:
        return False
    item = _ITEM.get(node.dtype)
    rows, cols = node.shape
    return (
        item is not None
        and node.strides[1] == 1
        and node.strides[0] >= cols
        and (node.strides[0] * item) % 16 == 0
        and cols * item >= 16
    )


def tma_eligible(graph: Graph, info: GroupInfo) -> bool:
    """Every operand of the group's matmuls loads through a descriptor."""
    return all(tma_operand(graph, info, j) for mm in info.matmuls for j in graph[mm].inputs)


def generate_gemm(graph: Graph, info: GroupInfo, config: GemmConfig, index: int = 0) -> Kernel:
    em = _GemmEmitter(graph, info, config)
    hooks = em.hooks()
    name = kernel_name(graph, info, config, index)
    extra = tuple(em.ptr[i] for i in info.loads) + tuple(em.out_ptr[i] for i in info.stored)
    a_dtype = graph[graph[info.matmuls[0]].inputs[0]].dtype
    spec = GemmSpec(
        name=name,
        batched=len(info.domain) == 3,
        extra_params=extra,
        n_b=len(info.matmuls),
        load_a=hooks["load_a"],
        load_b=hooks["load_b"],
        load_b1=hooks.get("load_b1"),
        epilogue=hooks["epilogue"],
        setup=hooks["setup"] or None,
        doc=f"{len(info.nodes)} ops -> 1 kernel: "
        + ", ".join(graph[i].name or graph[i].op for i in info.nodes),
        input_precision="ieee" if a_dtype == "float32" else None,
    )
    source = render(spec, config)
    if em.helpers:  # jitted helpers the epilogue calls (e.g. _af_tanh), after the imports
        from .codegen import HELPERS

        head = "import triton\nimport triton.language as tl\n"
        assert source.startswith(head)
        defs = "".join("\n" + HELPERS[h] + "\n" for h in sorted(em.helpers))
        source = head + defs + source[len(head) :]
    batch, m, n, k = _dims(graph, info)
    n_in = len(info.loads)
    first_in = ("in", 0) if n_in else ("out", 0)
    layout: list[tuple[str, int]] = []
    for p in param_names(spec):
        if p in ("a_ptr", "b_ptr", "b1_ptr"):
            layout.append(first_in)  # the hooks address every buffer through in_ptr*/out_ptr*
        elif p in ("M", "N", "K"):
            layout.append(("int", {"M": m, "N": n, "K": k}[p]))
        elif p.startswith("stride_"):
            layout.append(("int", 0))
        elif p.startswith("in_ptr"):
            layout.append(("in", int(p[6:])))
        elif p.startswith("out_ptr"):
            layout.append(("out", int(p[7:])))
        else:
            raise ValueError(f"unexpected GEMM template parameter {p!r}")
    from .gemm_template import grid

    return Kernel(
        name=name,
        source=source,
        config=config,
        info=info,
        layout=tuple(layout),
        grid=grid(spec, config, m, n, batch),
        launch_kw=tuple(config.constexprs().items()),
    )


def gemm_configs(graph: Graph, info: GroupInfo) -> list[GemmConfig]:
    batch, m, n, k = _dims(graph, info)
    dt = _ITEM.get(graph[graph[info.matmuls[0]].inputs[0]].dtype, 2)
    out = prune_configs(default_configs(dt, m, n, k), dt, m, n, k, n_b=len(info.matmuls))
    if tma_eligible(graph, info):  # descriptor loads, for the search to weigh against pointers
        out += [replace(c, TMA=True) for c in out if c.BLOCK_K * dt >= 32]
    if batch == 1:  # big tiles on one program per multiprocessor, looping over the tiles
        sms = sm_count()
        out += [replace(c, PERSISTENT=sms) for c in out if c.BLOCK_M * c.BLOCK_N >= 128 * 128]
    return out


def sm_count() -> int:
    """Programs of a PERSISTENT GEMM: the GPU's multiprocessors (an H100/H200's 132 where
    there is no GPU: the interpreter and the cost model)."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return 132


# ---------------------------------------------------------------------------------------------
# GEMM + row reduction: softmax / norms / row max over the matmul's output rows, in one kernel
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class RowGemmConfig:
    """XBLOCK output rows (BLOCK_M) per program, RBLOCK columns (BLOCK_N) per step of the row,
    BLOCK_K of the inner product per dot."""

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


@dataclass(frozen=True)
class ConstantSelect:
    """``where(cond, C, x)`` (or ``where(cond, x, C)``) through which every use of the matmul
    passes: on a tile where ``cond`` is all true (all false) the product is never needed, and
    the row reductions and stores see the constant C (a causal mask's upper triangle)."""

    node: int
    cond: int
    const: int
    const_when: bool  # the value of cond for which the result is C


def constant_select(graph: Graph, info: GroupInfo) -> ConstantSelect | None:
    members = set(info.nodes)
    mm = info.matmuls[0]
    for w in info.nodes:
        node = graph[w]
        if node.op != "where" or node.shape != info.domain:
            continue
        c, t, f = node.inputs
        for const, other, when in ((t, f, True), (f, t, False)):
            base = graph.base_of(const)
            if graph[base].op != "const" or graph.base_of(other) not in members:
                continue
            if mm in _ancestors(graph, c) | {graph.base_of(c)}:
                continue
            if mm in _ancestors(graph, other) | {graph.base_of(other)} and _only_through(
                graph, info, mm, w
            ):
                return ConstantSelect(w, c, base, const_when=when)
    return None


@dataclass(frozen=True)
class ColumnBound:
    """The select is its constant on every column ``c >= row + offset`` (``upper``) or
    ``c < row + offset`` of a row, with ``row = scale * first_row_of_program + ...`` given by
    ``row`` rendered at the program's first row (``xoffset``): a causal mask, whose constant
    tiles need no product and, in a row reduction, no loads."""

    row: Expr
    scale: int
    offset: int
    upper: bool


_FLIP = {"lt": "gt", "gt": "lt", "le": "ge", "ge": "le"}
_NEGATE = {"lt": "ge", "ge": "lt", "gt": "le", "le": "gt"}


def column_bound(em: _Emitter, sel: ConstantSelect) -> ColumnBound | None:
    """Where ``sel``'s condition compares an arange over the rows with one over the columns,
    the columns on which it gives the constant, as a bound the loops can start or stop at."""
    g = em.g
    index = broadcast_index(g[sel.cond].shape, g[sel.node].shape, em.full)
    c = sel.cond
    while g[c].kind == "view":
        index = view_source_index(g, c, index)
        c = g[c].inputs[0]
    op = g[c].op
    if op not in _FLIP:
        return None
    sides = [_iota_expr(g, j, broadcast_index(g[j].shape, g[c].shape, index)) for j in g[c].inputs]
    if None in sides:
        return None
    row = _row_term(sides[0], em.cfg.XBLOCK)
    col = _col_offset(sides[1])
    if row is None or col is None:  # the column on the left: c op r
        row, col = _row_term(sides[1], em.cfg.XBLOCK), _col_offset(sides[0])
    else:
        op = _FLIP[op]  # r op c == c flip(op) r
    if row is None or col is None:
        return None
    if not sel.const_when:
        op = _NEGATE[op]
    first, scale = row
    # the constant holds for the columns c (rindex + col) with: c op first_row_value
    if op == "gt":  # rindex + col > r  <=>  rindex >= r - col + 1: live below that
        return ColumnBound(first, scale, 1 - col, True)
    if op == "ge":
        return ColumnBound(first, scale, -col, True)
    if op == "lt":  # live from rindex >= r - col
        return ColumnBound(first, scale, -col, False)
    return ColumnBound(first, scale, 1 - col, False)  # le


def _iota_expr(g: Graph, i: int, index) -> Expr | None:
    while g[i].kind == "view":
        index = view_source_index(g, i, index)
        i = g[i].inputs[0]
    if g[i].op != "iota":
        return None
    return index[0].scale(g[i].attr("step")).shift(g[i].attr("start"))


def _row_term(e: Expr, xblock: int) -> tuple[Expr, int] | None:
    """``k * (xindex % M) + c`` with XBLOCK dividing M (no wrap inside a program, so the value
    grows with the row): that expression at the program's first row, and ``k``."""
    if len(e.terms) != 1 or e.vars != frozenset({"xindex"}):
        return None
    ((t, k),) = e.terms
    if t.var != "xindex" or t.div != 1 or k <= 0 or (t.mod is not None and t.mod % xblock):
        return None
    return Expr(((replace(t, var="xoffset", vars=frozenset({"xoffset"})), k),), e.const), k


def _col_offset(e: Expr) -> int | None:
    """``rindex + c``: c."""
    if len(e.terms) != 1 or e.vars != frozenset({"rindex"}):
        return None
    ((t, k),) = e.terms
    if t.var != "rindex" or t.div != 1 or k != 1 or t.mod is not None:
        return None
    return e.const


def _only_through(graph: Graph, info: GroupInfo, mm: int, w: int) -> bool:
    """Every path from ``mm`` to a stored node or a reduction of the group passes through
    ``w``."""
    members, stored = set(info.nodes), set(info.stored)
    seen, todo = set(), [mm]
    while todo:
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        if i in stored or (i != mm and graph[i].kind == "reduction"):
            return False
        todo += [u for u in graph.compute_users[i] if u in members and u != w]
    return True


def analyze_gemm_row_group(graph: Graph, members: frozenset[int]) -> GroupInfo:
    """A matmul whose output rows are reduced in the same kernel (the output tile walks the
    row in RBLOCK steps: an online max/sum for softmax, one pass per phase otherwise)."""
    from .codegen import _check_stored_shapes, _reduction_domain

    mms = [m for m in sorted(members) if graph[m].kind == "matmul"]
    if len(mms) != 1:
        raise FusionRefused("a row-reduction epilogue takes exactly one matmul")
    mm = mms[0]
    node = graph[mm]
    for j in node.inputs:
        if graph.base_of(j) in members:
            raise FusionRefused(
                f"{_describe(graph, mm)}: a GEMM with a row-reduction epilogue takes no prologue"
            )
    reds = [m for m in sorted(members) if graph[m].kind == "reduction"]
    domain, rdims = _reduction_domain(graph, reds)
    last = len(node.shape) - 1
    if domain != node.shape or rdims != (last,):
        raise FusionRefused(
            f"reductions over {list(domain)} dims {list(rdims)} are not over the rows of "
            f"{_describe(graph, mm)} (its last dim)"
        )
    stored = stored_nodes(graph, members)
    _check_stored_shapes(graph, stored, domain, rdims)
    info = GroupInfo(
        nodes=tuple(sorted(members)),
        kind="gemm_row",
        domain=tuple(domain),
        reduce_dims=rdims,
        stored=stored,
        loads=loaded_nodes(graph, members),
        matmuls=(mm,),
    )
    configs = gemm_row_configs(graph, info)
    if not configs:
        raise FusionRefused(
            f"no launch config fits {_describe(graph, mm)}: rows of a batched product must be a "
            "multiple of a BLOCK_M >= 16"
        )
    RowGemmEmitter(graph, info, configs[0]).emit()  # index checks
    return info


class RowGemmEmitter(_Emitter):
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
        self.bound = None if select is None else column_bound(self, select)
        self.const_sel = select  # the where() a constant tile replaces by its constant
        self.const_tile = False  # emitting a loop where the select is its constant
        self.pipelined = False  # emitting a column loop that Triton pipelines for every load

    def value(self, i: int, index) -> _Val:
        if self.const_tile and i == self.const_sel.node:
            dt = self.g[i].dtype
            return _Val(_literal(self.g[self.const_sel.const].attr("value"), dt), 0,
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
            c = _cast(cond, "bool")
            if sel.const_when:
                test = f"tl.min(tl.min(tl.where(xmask & rmask, {c}, 1).to(tl.int32), 1), 0) > 0"
            else:
                test = f"tl.max(tl.max(tl.where(xmask & rmask, {c}, 0).to(tl.int32), 1), 0) == 0"
            name = g[sel.node].name
            self.line(f"if {test}:  # {name} is its constant on the whole tile: no product")
            for const in (True, False):
                self.depth += 1
                self.scopes.append(_Scope())
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
        kr = Expr.dim("offs_k[None, :]", 1, k, True)
        a_off = memory_offset(g, a, (*self.full[:-1], kr)).render()
        mask = "xmask" if k % self.cfg.BLOCK_K == 0 else f"xmask & (offs_k[None, :] < {k})"
        return f"tl.load({self.ptr[g.base_of(a)]} + ({a_off}), {mask}, other=0.0)"

    def reduced(self, i: int, index):
        if self.g[i].kind != "matmul":
            return super().reduced(i, index)
        if index != self.full:
            raise FusionRefused(
                f"{_describe(self.g, i)} is read at ({', '.join(map(str, index))}), not at its "
                "own output tile"
            )
        return self.dot_tile(i)

    def dot_tile(self, mm: int) -> _Val:
        g = self.g
        node = g[mm]
        a, b = node.inputs
        k = g[a].shape[-1]
        batched = len(node.shape) == 3
        m = node.shape[-2]
        kc = Expr.dim("offs_k[:, None]", 1, k, True)
        # every row of a program is in one batch (BLOCK_M divides M): a uniform batch index
        b_batch = (Expr.dim("xoffset", m, node.shape[0], True),) if batched else ()
        b_idx = (*b_batch, kc, self.full[-1])
        b_mask = "rmask" if k % self.cfg.BLOCK_K == 0 else f"(offs_k[:, None] < {k}) & rmask"
        b_off = memory_offset(g, b, b_idx).render()
        b_load = f"tl.load({self.ptr[g.base_of(b)]} + ({b_off}), {b_mask}, other=0.0)"
        prec = ', input_precision="ieee"' if g[a].dtype == "float32" else ""
        if self.single_k():
            self.line(f"b = {b_load}")
            return self.tmp(f"tl.dot(a, b{prec})", 2, "float32", f"{node.name} tile")
        acc = self.tmp("tl.zeros([XBLOCK, RBLOCK], dtype=tl.float32)", 2, "float32")
        self.line(f"for k_off in range(0, {k}, BLOCK_K):  # {node.name}: K loop")
        self.depth += 1
        self.line("offs_k = k_off + tl.arange(0, BLOCK_K)")
        self.line(f"a = {self._a_load(mm)}")
        self.line(f"b = {b_load}")
        self.line(f"{acc.code} = tl.dot(a, b, {acc.code}{prec})")
        self.depth -= 1
        return acc

    # -- row-wise accumulation (looped kernels; a persistent one reduces its one tile) --------
    def _looped_phase(self, phase: list[int]) -> dict:
        accs = {}
        for r in phase:
            dt = self.acc_dtype(r)
            init = f"tl.full([XBLOCK, 1], {_identity(self.g[r].op, dt)}, {TL_DTYPE[dt]})"
            accs[r] = (self.tmp(init, 1, dt), dt)
        online = {s: m for s, m in self.online.items() if m in phase}
        for s in online:
            accs[s] = (self.tmp("tl.zeros([XBLOCK, 1], dtype=tl.float32)", 1, "float32"), "float32")
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
            # online softmax: the running row max, and the row sum of exp(x - max) rescaled
            s_acc = accs[partner[r]][0].code
            m_new = self.tmp(_minmax("maximum", acc.code, tile.code, dt), 1, dt, "running max")
            if per_row:
                tile_sum = f"{self._count()} * tl.exp({self._row_value(src, dt)} - {m_new.code})"
            else:
                tile_sum = (
                    f"tl.sum(tl.where(xmask & rmask, {exp_minus(_cast(src, dt), m_new.code)}, "
                    "0.0), 1)[:, None]"
                )
            self.line(
                f'{s_acc} = tl.where({m_new.code} == float("-inf"), 0.0, '
                f"{s_acc} * tl.exp({acc.code} - {m_new.code}) + {tile_sum})"
            )
            self.line(f"{acc.code} = {m_new.code}")

    def _row_value(self, src: _Val, dt: str) -> str:
        """A scalar or per-row value as an [XBLOCK, 1] tensor of dtype ``dt``."""
        if src.cls == 1:
            return _cast(src, dt)
        return f"(tl.zeros([XBLOCK, 1], dtype={TL_DTYPE[dt]}) + {_cast(src, dt)})"

    def _count(self) -> str:
        """How many columns of this tile are inside the row."""
        if self.info.rnumel % self.cfg.RBLOCK == 0:
            return f"{float(self.cfg.RBLOCK)!r}"
        return "tl.sum(rmask.to(tl.float32), 1)[:, None]"

    def finish_reduction(self, r: int, acc: _Val, acc_dtype: str) -> None:
        if self.persistent:
            return super().finish_reduction(r, acc, acc_dtype)
        self.set_reduced(r, acc.code, acc_dtype)

    def finish_online(self, s: int, m: int, s_acc: _Val, m_acc: _Val) -> None:
        if self.persistent:
            return super().finish_online(s, m, s_acc, m_acc)
        self.red_val[s] = s_acc


def gemm_row_configs(graph: Graph, info: GroupInfo) -> list[RowGemmConfig]:
    mm = graph[info.matmuls[0]]
    m, n, k = mm.shape[-2], mm.shape[-1], graph[mm.inputs[0]].shape[-1]
    batched = len(mm.shape) == 3
    dt = _ITEM.get(graph[mm.inputs[0]].dtype, 2)
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
                        if st * (bm * bk + bk * bn) * dt > 232448 or bm * bn < 32 * w * 4:
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
