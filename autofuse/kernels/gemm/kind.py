"""Kernel kind ``gemm``: a matmul with its fused prologue and epilogue, on the GEMM template.

A GEMM group holds one ``mm``/``bmm`` (or two sharing their A operand: horizontal fusion, as in
SwiGLU's ``x @ W1`` and ``x @ W2``), the pointwise nodes that compute its operands (prologue,
evaluated per loaded tile at index (m, k) or (k, n)) and the pointwise nodes over its output
(epilogue, evaluated on the accumulator tile at (m, n) before the only store). The same index
machinery as the other kernels applies: operands reached through views are strided loads, and
the epilogue may read bias, residual or masks broadcast or full-size.

The template takes M, N and K as arguments. Under runtime sizes (``common/sizes.py``) every
tile edge is masked against them, whatever the exact shape (no mask is dropped where a block
divides the extent), a TMA descriptor spans the argument extents, the default config is chosen
at each extent's bucket, and literals that differ between a traced graph's shapes (a size in
the index arithmetic) become arguments (``common/literals.py``): the shapes of one bucket share
one kernel text.
"""

from __future__ import annotations

from dataclasses import replace

from autofuse.ir.graph import Graph, buffer_strides, numel
from autofuse.ir.indexing import Expr, linearize
from autofuse.kernels.common.base import (
    DESCRIPTOR_ALIGNMENT,
    FusionRefused,
    GroupInfo,
    Kernel,
    KernelMeta,
    ProposesNone,
    describe,
    kernel_name,
    loaded_nodes,
    stored_nodes,
)
from autofuse.kernels.common.cost import TileCost
from autofuse.kernels.common.emitter import Emitter, Scope
from autofuse.kernels.common.literals import with_size_arguments
from autofuse.kernels.common.memory import ITEM, ancestors, memory_offset
from autofuse.kernels.common.render import TL_DTYPE, Val, compute_dtype, tile_address
from autofuse.kernels.common.sizes import config_extent, runtime_sizes_on
from autofuse.kernels.common.views import domain_of_flat, flat_of
from autofuse.kernels.gemm.cost import gemm_cost
from autofuse.kernels.gemm.template import (
    GemmConfig,
    GemmSpec,
    grid,
    param_names,
    render,
)
from autofuse.kernels.gemm.tiles import default_configs, prune_configs
from autofuse.settings import target

# the variables of each tile's axes: operand A, operand B, the output (``rm = offs_m[:, None]``)
_A_TILE = ("offs_m[:, None]", "offs_k[None, :]")
_B_TILE = ("offs_k[:, None]", "offs_n[None, :]")
_OUT_TILE = ("rm", "rn")


def analyze_gemm_group(graph: Graph, members: frozenset[int]) -> GroupInfo:
    mms = [m for m in sorted(members) if graph[m].kind == "matmul"]
    if len(mms) > 2:
        raise FusionRefused(f"{len(mms)} matmuls in one group: at most two sharing an operand")
    for m in sorted(members):
        if graph[m].kind == "reduction":
            raise FusionRefused(
                f"{describe(graph, m)} is a reduction: row-reduction epilogues on GEMMs are "
                "not generated yet"
            )
    first = graph[mms[0]]
    if len(mms) == 2:
        second = graph[mms[1]]
        if first.inputs[0] != second.inputs[0] or first.shape != second.shape:
            raise FusionRefused(
                f"{describe(graph, mms[0])} and {describe(graph, mms[1])} do not share their "
                "A operand and output shape: no horizontal GEMM"
            )
        if graph.base_of(second.inputs[0]) in members or graph.base_of(second.inputs[1]) in members:
            raise FusionRefused("a horizontal GEMM pair takes no prologue")
        if mms[1] in ancestors(graph, mms[0]) or mms[0] in ancestors(graph, mms[1]):
            raise FusionRefused("one matmul feeds the other: they cannot share a K loop")
    domain = first.shape
    stored = stored_nodes(graph, members)
    for s in stored:  # over the output, or an epilogue result over a reshape of it (``x @ w
        # + b`` with a 3-D ``x``); a prologue result of another shape is refused
        shape = graph[s].shape
        reshaped = numel(shape) == numel(domain) and not ancestors(graph, s).isdisjoint(mms)
        if shape != domain and not reshaped:
            raise FusionRefused(
                f"{describe(graph, s)} must be stored but is not over the GEMM output "
                f"{list(domain)} (a prologue result needed elsewhere)"
            )
    info = GroupInfo(
        nodes=tuple(sorted(members)),
        kind=GemmKind.name,
        domain=tuple(domain),
        reduce_dims=(),
        stored=stored,
        loads=loaded_nodes(graph, members),
        matmuls=tuple(mms),
    )
    GemmEmitter(graph, info, GemmConfig(16, 16, 16, 1, 1, 2)).hooks()  # index checks
    return info


def gemm_dims(graph: Graph, info: GroupInfo) -> tuple[int, int, int, int]:
    a = graph[graph[info.matmuls[0]].inputs[0]].shape
    out = info.domain
    batch = out[0] if len(out) == 3 else 1
    return batch, out[-2], out[-1], a[-1]


class GemmEmitter(Emitter):
    """Emits the hook bodies: operand loads (with prologue) and the epilogue."""

    def __init__(self, graph: Graph, info: GroupInfo, config: GemmConfig) -> None:
        super().__init__(graph, info, config)
        self.depth = 0  # hook lines carry no indentation: the template indents them
        self.int64 = False
        self.mask, self.tile = "mask", _OUT_TILE  # those of the tile being emitted
        batch, m, n, _ = gemm_dims(graph, info)
        b = (Expr.dim("pid_b", 1, batch, True),) if len(info.domain) == 3 else ()
        self.full = b + (Expr.dim("rm", 1, m, True), Expr.dim("rn", 1, n, True))
        self.batch_index = b

    def cls_of(self, e: Expr) -> int:
        return 2 if e.vars else 0

    def mask_for(self, cls: int) -> str | None:
        return self.mask if cls else None

    def tile_axes(self, cls: int) -> tuple[str, ...]:
        return self.tile

    def reduced(self, i: int, index):
        if index != self.full:
            raise FusionRefused(
                f"{describe(self.g, i)} is read at ({', '.join(map(str, index))}), not at its "
                "own output tile: the value would come from another program"
            )
        k = self.info.matmuls.index(i)
        name = ("acc0", "acc1")[k] if len(self.info.matmuls) == 2 else "acc"
        return Val(name, 2, "float32")

    def operand(self, mm: int, which: int, var: str) -> list[str]:
        """Lines assigning ``var``: the A (which=0) or B (which=1) tile of ``mm``."""
        self.lines, self.scopes = [], [Scope()]
        node = self.g[mm]
        src = node.inputs[which]
        if which == 0:
            idx = self.batch_index + (
                Expr.dim("offs_m[:, None]", 1, node.shape[-2], True),
                Expr.dim("offs_k[None, :]", 1, self.g[src].shape[-1], True),
            )
            self.mask, self.tile = "mask_m[:, None] & mask_k[None, :]", _A_TILE
        else:
            idx = self.batch_index + (
                Expr.dim("offs_k[:, None]", 1, self.g[src].shape[-2], True),
                Expr.dim("offs_n[None, :]", 1, node.shape[-1], True),
            )
            self.mask, self.tile = "mask_k[:, None] & mask_n[None, :]", _B_TILE
        dot_dtype = self.g[src].dtype
        base = self.g.base_of(src)
        if getattr(self.cfg, "TMA", False) and tma_operand(self.g, self.info, src):
            return self._descriptor_load(src, which, var)
        if base not in self.members and base in self.ptr:  # a plain (strided) load as it is
            off = self._offset(src, idx)
            ptr = f"{self.ptr[base]} + ({tile_address(off, self.tile)})"
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
        rows, cols = ("M", "K") if which == 0 else ("K", "N")  # the arguments: any size
        if not runtime_sizes_on():
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
        """Whether the operand's tiles divide its shape under this config (masks can go);
        never with runtime sizes (the extents are the arguments: any size)."""
        if runtime_sizes_on():
            return False
        _, m, n, k = gemm_dims(self.g, self.info)
        c = self.cfg
        rows = m % c.BLOCK_M == 0 if which == 0 else True
        cols = n % c.BLOCK_N == 0 if which == 1 else True
        return rows and cols and k % c.BLOCK_K == 0

    def _offset(self, i: int, idx) -> Expr:
        return memory_offset(self.g, i, idx)

    def epilogue(self) -> list[str]:
        self.lines, self.scopes = [], [Scope()]
        self.mask, self.tile = "mask", _OUT_TILE
        for s in self.info.stored:
            node = self.g[s]
            idx = self.full  # a reshape of the output: its element at the tile's flat offset
            if node.shape != self.info.domain:
                idx = domain_of_flat(flat_of(idx, self.info.domain), node.shape)
            v = self.value(s, idx)  # refused unless it reads the tile's own accumulator
            off = linearize(idx, buffer_strides(node), node.shape)
            code = v.code
            if v.literal or v.cls == 0:
                code = f"tl.full([BLOCK_M, BLOCK_N], {code}, tl.float32)"
            if compute_dtype(node.dtype) != node.dtype or v.dtype != node.dtype:
                code = f"{code}.to({TL_DTYPE[node.dtype]})"
            tile = tile_address(off, self.tile)
            self.line(f"tl.store({self.out_ptr[s]} + ({tile}), {code}, mask)")
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
    item = ITEM.get(node.dtype)
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


def template_layout(spec: GemmSpec, n_in: int, m: int, n: int, k: int) -> list[tuple[str, int]]:
    """The kernel's arguments for the template's parameters (``Kernel.layout``) when the hooks
    address every buffer through ``in_ptr*`` / ``out_ptr*`` (the operand strides unused)."""
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
    return layout


def with_helpers(source: str, helpers) -> str:
    """A rendered template with the jitted helpers its epilogue calls (e.g. _af_tanh) defined
    after the imports."""
    if not helpers:
        return source
    head = "import triton\nimport triton.language as tl\n"
    assert source.startswith(head)
    defs = "".join("\n" + h.source + "\n" for h in sorted(helpers, key=lambda h: h.name))
    return head + defs + source[len(head) :]


def generate_gemm(graph: Graph, info: GroupInfo, config: GemmConfig, index: int = 0) -> Kernel:
    em = GemmEmitter(graph, info, config)
    hooks = em.hooks()
    name = kernel_name(graph, info, "mm", index)
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
    source = with_helpers(render(spec, config), em.helpers)
    batch, m, n, k = gemm_dims(graph, info)
    n_in = len(info.loads)
    layout = template_layout(spec, n_in, m, n, k)
    item = ITEM.get(a_dtype, 2)
    kernel = Kernel(
        name=name,
        source=source,
        config=config,
        info=info,
        layout=tuple(layout),
        grid=grid(spec, config, m, n, batch),
        launch_kw=tuple(config.constexprs().items()),
        meta=KernelMeta(
            load_passes=(1,) * n_in,
            dots=len(info.matmuls),
            tiles=(
                config.BLOCK_M,
                config.BLOCK_N,
                config.BLOCK_K,
                config.smem_bytes(item, len(info.matmuls)),
            ),
            needs_allocator=config.TMA,
            input_alignment=DESCRIPTOR_ALIGNMENT if config.TMA else 0,
        ),
    )
    return with_size_arguments(kernel, subscripts=True)  # sizes in its index arithmetic


def gemm_configs(graph: Graph, info: GroupInfo) -> list[GemmConfig]:
    batch, m, n, k = (config_extent(d) for d in gemm_dims(graph, info))
    dt = ITEM.get(graph[graph[info.matmuls[0]].inputs[0]].dtype, 2)
    out = prune_configs(default_configs(dt, m, n, k), dt, m, n, k, n_b=len(info.matmuls))
    if tma_eligible(graph, info):  # descriptor loads, for the search to weigh against pointers
        out += [replace(c, TMA=True) for c in out if c.BLOCK_K * dt >= 32]
    if batch == 1:  # big tiles on one program per multiprocessor, looping over the tiles
        sms = sm_count()
        out += [replace(c, PERSISTENT=sms) for c in out if c.BLOCK_M * c.BLOCK_N >= 128 * 128]
    return out


def sm_count() -> int:
    """Programs of a PERSISTENT GEMM: the target's multiprocessors (an H100/H200's 132 where
    there is no GPU: the interpreter and the cost model)."""
    return target().sm_count


class GemmKind(ProposesNone):
    name = "gemm"
    # on the H200 the tuner picked cuBLAS + a fused epilogue kernel over the generated GEMM
    # kernel for gemm+bias+GELU and SwiGLU (results/h200/lib_a3c3894.*; 447 us), and the
    # generated gemm+bias+GELU kernel took 448-466 us across its best configs
    # (gemm_probe_088186d.json): unmeasured plans, at default configs, start from cuBLAS
    runtime_sizes = True  # M, N, K the arguments, configs by bucket (see the module)
    library_first = True
    config_class = GemmConfig

    def claims(self, graph: Graph, members: frozenset[int]) -> bool:
        kinds = {graph[m].kind for m in members}
        return "matmul" in kinds and "reduction" not in kinds

    def analyze(self, graph: Graph, members: frozenset[int]) -> GroupInfo:
        return analyze_gemm_group(graph, members)

    def config_space(self, graph: Graph, info: GroupInfo) -> list[GemmConfig]:
        return gemm_configs(graph, info)

    def default_config(self, graph: Graph, info: GroupInfo) -> GemmConfig:
        return self.config_space(graph, info)[0]

    def check_config(self, info: GroupInfo, config: GemmConfig) -> None:
        if not isinstance(config, GemmConfig):
            raise ValueError(f"a GEMM kernel takes a GemmConfig, got {type(config).__name__}")

    def cost_facts(self, graph: Graph, info: GroupInfo, config: GemmConfig) -> TileCost:
        return gemm_cost(graph, info, config)

    def prefix(self, info: GroupInfo, config: GemmConfig) -> str:
        return "mm"

    def generate(self, graph: Graph, info: GroupInfo, config: GemmConfig, index: int) -> Kernel:
        return generate_gemm(graph, info, config, index)
