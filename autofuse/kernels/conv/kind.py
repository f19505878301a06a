"""Kernel kind ``conv``: a forward convolution as an implicit GEMM on the GEMM template, with
the pointwise epilogue that follows it (the peeled bias add, activations, scaling) fused.

The product is the one ``spec.py`` describes: the GEMM template's batch axis is the
convolution's group (``pid_b``), its rows the output pixels, its columns a group's output
channels, its K loop the input channels x kernel taps. The A tile is gathered from the input
(im2col done in registers: each (pixel, tap) element loaded once per K step, the padding
masked, never read) and the B tile from the weight, both through the views and strides they
have (a channels-last input is read in place); the epilogue is the GEMM kind's own
(``GemmEmitter.epilogue``): every stored node evaluated on the fp32 accumulator tile, stored
as kernels read it (``buffer_strides``: the convolution's own output in the library's layout,
channels-last where eager's is, its epilogue's contiguous). fp32 operands go to ``tl.dot`` as TF32 when ``torch.backends.cudnn.allow_tf32`` is
set (what cuDNN does with them then), as IEEE fp32 otherwise; 16-bit ones as they are.

Launch configs are the GEMM template's tiles fitted to the implicit GEMM, at most 4 warps for a
kernel with more than one tap (Inductor's convolution template gave wrong results with 8 warps,
pytorch #173068; a 1x1 kernel is a plain GEMM and keeps the GEMM's 8-warp tiles).
"""

from __future__ import annotations

from dataclasses import replace
from math import prod

import torch

from autofuse.ir.graph import Graph
from autofuse.ir.indexing import Expr
from autofuse.kernels.common.base import (
    FusionRefused,
    GroupInfo,
    Kernel,
    KernelMeta,
    describe,
    kernel_name,
    loaded_nodes,
    stored_nodes,
)
from autofuse.kernels.common.cost import TileCost
from autofuse.kernels.common.emitter import Scope
from autofuse.kernels.common.memory import ITEM, ancestors, memory_offset, nbytes
from autofuse.kernels.common.render import tile_address
from autofuse.kernels.conv import takes
from autofuse.kernels.conv.rule import kernel_reason
from autofuse.kernels.conv.spec import ConvSpec, conv_refusal, conv_spec
from autofuse.kernels.gemm.cost import product_cost
from autofuse.kernels.gemm.kind import GemmEmitter, GemmKind, template_layout, with_helpers
from autofuse.kernels.gemm.template import GemmConfig, GemmSpec, grid, render
from autofuse.kernels.gemm.tiles import default_configs, prune_configs

__all__ = ["ConvKind", "conv_configs", "conv_of", "generate_conv"]

MAX_WARPS = 4  # kernels with more than one tap (pytorch #173068)


def conv_of(graph: Graph, members: frozenset[int]) -> list[int]:
    """The convolutions among ``members`` (opaque nodes the kind may take)."""
    return [m for m in sorted(members) if graph[m].kind == "opaque"]


def analyze_conv_group(graph: Graph, members: frozenset[int]) -> GroupInfo:
    convs = conv_of(graph, members)
    if len(convs) != 1:
        raise FusionRefused(f"{len(convs)} convolutions in one group: one per kernel")
    (conv,) = convs
    why = "AUTOFUSE_CONV_KERNEL=library" if not takes(graph, conv) else None
    why = conv_refusal(graph, conv) or why
    if why is not None:
        raise FusionRefused(f"{describe(graph, conv)} runs as the library call: {why}")
    for m in sorted(members - {conv}):
        if graph[m].kind != "pointwise":
            raise FusionRefused(
                f"{describe(graph, m)} is a {graph[m].kind}: a convolution kernel fuses a "
                "pointwise epilogue only"
            )
    prologue = sorted(members & ancestors(graph, conv))
    if prologue:
        raise FusionRefused(
            f"{describe(graph, prologue[0])} computes an operand of the convolution: no "
            "prologue is fused"
        )
    node = graph[conv]
    stored = stored_nodes(graph, members)
    elsewhere = [s for s in stored if graph[s].shape != node.shape]
    if elsewhere:  # (a value of another shape: computed over another domain)
        raise FusionRefused(
            f"{describe(graph, elsewhere[0])} must be stored but is not over the "
            f"convolution's output {list(node.shape)}"
        )
    info = GroupInfo(
        nodes=tuple(sorted(members)),
        kind=ConvKind.name,
        domain=tuple(node.shape),
        reduce_dims=(),
        stored=stored,
        loads=loaded_nodes(graph, members),
        matmuls=(conv,),
    )
    ConvEmitter(graph, info, GemmConfig(16, 16, 16, 1, 1, 2)).hooks()  # index checks
    return info


def _dim(var: str, div: int, size: int, outermost: bool) -> Expr:
    return Expr.dim(var, div, size, outermost)


def _pixel(var: str, spec: ConvSpec) -> tuple[Expr, list[Expr]]:
    """(image, output coordinates) of the flat pixel index ``var``."""
    out = spec.out_size
    coords = [_dim(var, prod(out[d + 1 :]), out[d], False) for d in range(len(out))]
    return _dim(var, spec.pixels, spec.batch, True), coords


def _tap(var: str, spec: ConvSpec) -> tuple[Expr, list[Expr]]:
    """(channel of the group, kernel tap coordinates) of the flat K index ``var``: channel
    outermost, or innermost where ``spec.channel_inner``."""
    ks, inner = spec.kernel, spec.cg_in if spec.channel_inner else 1
    taps = [_dim(var, inner * prod(ks[d + 1 :]), ks[d], False) for d in range(len(ks))]
    if spec.channel_inner:
        taps[0] = _dim(var, inner * prod(ks[1:]), ks[0], True)
        return _dim(var, 1, spec.cg_in, False), taps
    return _dim(var, spec.taps, spec.cg_in, True), taps


class ConvEmitter(GemmEmitter):
    """The GEMM emitter with the convolution's operand gathers and output index."""

    def __init__(self, graph: Graph, info: GroupInfo, config: GemmConfig) -> None:
        super().__init__(graph, info, config)
        self.conv = info.matmuls[0]
        self.spec = conv_spec(graph, self.conv)
        self.wide = self._needs_int64()  # 64-bit index arithmetic
        s = self.spec
        self.group = _dim("pid_b", 1, s.groups, True)
        image, coords = _pixel("rm", s)
        channel = self.group.scale(s.cg_out) + _dim("rn", 1, s.cg_out, True)
        self.full = (image, channel, *coords)
        self.batch_index = ()

    def value(self, i: int, index):
        if i == self.conv:  # the accumulator, at its own tile only (GemmEmitter.reduced)
            return self.reduced(i, index)
        return super().value(i, index)

    def _vars(self, pairs: list[tuple[str, str]]) -> None:
        for var, code in pairs:
            self.line(f"{var} = {code}.to(tl.int64)" if self.wide else f"{var} = {code}")

    def gather_a(self) -> list[str]:
        """Lines assigning ``a``: the input's [BLOCK_M, BLOCK_K] im2col tile, zero in the
        padding and on the tails."""
        self.lines, self.scopes = [], [Scope()]
        s = self.spec
        self._vars([("cv_am", "offs_m[:, None]"), ("cv_ak", "offs_k[None, :]")])
        image, coords = _pixel("cv_am", s)
        channel, taps = _tap("cv_ak", s)
        where = [
            o.scale(st) + t.scale(dl).shift(-p)
            for o, t, st, dl, p in zip(coords, taps, s.stride, s.dilation, s.padding)
        ]
        idx = (image, self.group.scale(s.cg_in) + channel, *where)
        mask = ["mask_m[:, None] & mask_k[None, :]"]
        for d, (e, p) in enumerate(zip(where, s.padding)):
            if p > 0:  # taps that fall in the padding read nothing
                self.line(f"cv_i{d} = {e.render()}")
                mask.append(f"(cv_i{d} >= 0) & (cv_i{d} < {s.in_size[d]})")
        return self._load("a", s.x, idx, " & ".join(mask), ("cv_am", "cv_ak"))

    def gather_b(self) -> list[str]:
        """Lines assigning ``b``: the weight's [BLOCK_K, BLOCK_N] tile (flipped and with its
        channel dims swapped for a transposed convolution)."""
        self.lines, self.scopes = [], [Scope()]
        s = self.spec
        self._vars([("cv_bk", "offs_k[:, None]"), ("cv_bn", "offs_n[None, :]")])
        channel, taps = _tap("cv_bk", s)
        out_channel = _dim("cv_bn", 1, s.cg_out, True)
        if s.flipped:
            flipped = [t.scale(-1).shift(k - 1) for t, k in zip(taps, s.kernel)]
            idx = (self.group.scale(s.cg_in) + channel, out_channel, *flipped)
        else:
            idx = (self.group.scale(s.cg_out) + out_channel, channel, *taps)
        mask = "mask_k[:, None] & mask_n[None, :]"
        return self._load("b", s.w, idx, mask, ("cv_bk", "cv_bn"))

    def _load(self, var: str, src: int, idx, mask: str, tile: tuple[str, str]) -> list[str]:
        base = self.g.base_of(src)
        if base in self.members or base not in self.ptr:
            raise FusionRefused(f"{describe(self.g, src)} is not a loaded buffer")
        off = memory_offset(self.g, src, idx)
        ptr = f"{self.ptr[base]} + ({tile_address(off, tile)})"
        self.line(f"{var} = tl.load({ptr}, {mask}, other=0.0)")
        return self.lines

    def hooks(self) -> dict[str, list[str]]:
        epilogue = self.epilogue()
        if self.wide:  # the output's offsets in 64 bits
            epilogue = ["rm = rm.to(tl.int64)", "rn = rn.to(tl.int64)", *epilogue]
        return {"load_a": self.gather_a(), "load_b": self.gather_b(), "epilogue": epilogue}


def input_precision(dtype: str) -> str | None:
    """``tl.dot``'s precision for ``dtype`` operands: TF32 for fp32 where cuDNN may use it
    (``torch.backends.cudnn.allow_tf32``), IEEE fp32 where not; 16-bit ones as they are."""
    if dtype != "float32":
        return None
    return "tf32" if torch.backends.cudnn.allow_tf32 else "ieee"


def generate_conv(graph: Graph, info: GroupInfo, config: GemmConfig, index: int = 0) -> Kernel:
    em = ConvEmitter(graph, info, config)
    hooks = em.hooks()
    s = em.spec
    groups, m, n, k = s.gemm()
    name = kernel_name(graph, info, "conv", index)
    extra = tuple(em.ptr[i] for i in info.loads) + tuple(em.out_ptr[i] for i in info.stored)
    dtype = graph[s.x].dtype
    what = "transposed convolution (stride 1)" if s.flipped else "convolution"
    spec = GemmSpec(
        name=name,
        batched=groups > 1,
        extra_params=extra,
        load_a=hooks["load_a"],
        load_b=hooks["load_b"],
        epilogue=hooks["epilogue"],
        doc=f"{len(info.nodes)} ops -> 1 kernel: "
        + ", ".join(graph[i].name or graph[i].op for i in info.nodes)
        + f"\nimplicit GEMM of a {len(s.kernel)}-D {what}: M={m} pixels, N={n} channels, "
        f"K={k} (channels x taps), {groups} group(s); stride {list(s.stride)}, padding "
        f"{list(s.padding)}, dilation {list(s.dilation)}",
        input_precision=input_precision(dtype),
    )
    source = with_helpers(render(spec, config), em.helpers)
    item = ITEM.get(dtype, 2)
    return Kernel(
        name=name,
        source=source,
        config=config,
        info=info,
        layout=tuple(template_layout(spec, len(info.loads), m, n, k)),
        grid=grid(spec, config, m, n, groups),
        launch_kw=tuple(config.constexprs().items()),
        meta=KernelMeta(
            load_passes=(1,) * len(info.loads),
            dots=1,
            tiles=(config.BLOCK_M, config.BLOCK_N, config.BLOCK_K, config.smem_bytes(item)),
        ),
    )


def conv_configs(graph: Graph, info: GroupInfo) -> list[GemmConfig]:
    """The GEMM template's tiles fitted to the implicit GEMM; at most :data:`MAX_WARPS` warps
    unless the kernel is 1x1 (its accumulator then within the register budget)."""
    s = conv_spec(graph, info.matmuls[0])
    _, m, n, k = s.gemm()
    dt = ITEM.get(graph[s.x].dtype, 2)
    out: list[GemmConfig] = []
    for c in prune_configs(default_configs(dt, m, n, k), dt, m, n, k):
        if not s.pointwise and c.num_warps > MAX_WARPS:
            c = replace(c, num_warps=MAX_WARPS)
            if c.BLOCK_M * c.BLOCK_N > 128 * 32 * MAX_WARPS:
                continue  # the accumulator would spill
        if c not in out:
            out.append(c)
    return out or [GemmConfig(16, 16, 16, 1, 1, 2)]


def conv_cost(graph: Graph, info: GroupInfo, config: GemmConfig) -> TileCost:
    """The implicit GEMM's facts: the im2col rows re-read once per column of tiles (from L2
    but the first), the weight once per row of tiles."""
    s = conv_spec(graph, info.matmuls[0])
    groups, m, n, k = s.gemm()
    item = ITEM.get(graph[s.x].dtype, 2)
    operands = (groups * m * k * item, nbytes(graph, graph.base_of(s.w)))
    smem = config.smem_bytes(item)
    return product_cost(graph, info, config, smem, (groups, m, n, k), graph[s.x].dtype, operands)


class ConvKind(GemmKind):
    """The GEMM kind's protocol on the implicit GEMM (its default config: the first of its
    space)."""

    name = "conv"
    runtime_sizes = False  # sizes baked in (its index arithmetic): a kernel per exact shape
    # a plan chosen without measuring keeps cuDNN but where kernels/conv/rule.py says
    # (``library_rule``, per group)
    lowers_opaque = True  # its groups hold an opaque node: the convolution

    def claims(self, graph: Graph, members: frozenset[int]) -> bool:
        return bool(conv_of(graph, members))

    def library_rule(self, graph: Graph, info: GroupInfo) -> bool:
        """Whether a plan chosen without measuring runs the group's convolution as the
        library call (``rule.py``; a group of more than the convolution fuses an epilogue)."""
        return self.rule_note(graph, info) is None

    def rule_note(self, graph: Graph, info: GroupInfo) -> str | None:
        """Why the rule runs the kernel rather than the library call (``rule.py``), if it
        says."""
        return kernel_reason()

    def analyze(self, graph: Graph, members: frozenset[int]) -> GroupInfo:
        return analyze_conv_group(graph, members)

    def config_space(self, graph: Graph, info: GroupInfo) -> list[GemmConfig]:
        return conv_configs(graph, info)

    def check_config(self, info: GroupInfo, config: GemmConfig) -> None:
        if not isinstance(config, GemmConfig) or config.TMA or config.PERSISTENT:
            raise ValueError(f"a convolution kernel takes a plain GemmConfig, got {config}")

    def cost_facts(self, graph: Graph, info: GroupInfo, config: GemmConfig) -> TileCost:
        return conv_cost(graph, info, config)

    def prefix(self, info: GroupInfo, config: GemmConfig) -> str:
        return "conv"

    def generate(self, graph: Graph, info: GroupInfo, config: GemmConfig, index: int) -> Kernel:
        return generate_conv(graph, info, config, index)
