"""Kernel kind ``attention_bwd``: its config space, its default and the plugin (the kernel
itself: ``attention_bwd.py``).

The space: BLOCK_M / BLOCK_N 16..128, 4 or 8 warps, 1..3 stages, ``swap`` and ``flip``
orientations, ``whole`` under an exact index-expression mask, and ``TMA`` (tiles through tensor
descriptors) where the tiles never run past the sequence. Register and shared-memory estimates
keep configs that would not fit out; without pointer tiles (TMA) the register estimate may be
higher (``experiments/kernel_resources.py``: at head dim 128, 64 x 32 tiles with 4 warps and
128 x 32 tiles with 8 warps compile with no spill through descriptors, 240-440 bytes spilled
with pointer loads).
"""

from __future__ import annotations

from dataclasses import replace

from autofuse.ir.graph import Graph
from autofuse.kernels.attention_analysis import head_block
from autofuse.kernels.attention_bwd import (
    KIND,
    AttentionBwdConfig,
    BwdEmitter,
    BwdParts,
    analyze_attention_bwd_group,
    bwd_parts,
    generate_attention_bwd,
)
from autofuse.kernels.base import GroupInfo, Kernel, nearest_config, next_pow2
from autofuse.kernels.gemm import ITEM
from autofuse.kernels.gemm_template import HOPPER_SMEM_BYTES
from autofuse.kernels.pointwise import check_pow2


def attention_bwd_configs(graph: Graph, info: GroupInfo) -> list[AttentionBwdConfig]:
    """BLOCK_M / BLOCK_N 16..128 (16 and 32 only for short sequences), 4 or 8 warps, 1..3
    stages, within about 160 fp32 registers per thread for the tiles (P, dP, dS) and the
    accumulators (288 through descriptors), and within shared memory for the operand tiles;
    where BLOCK_M < BLOCK_N, also with ``swap`` (every program holds BLOCK_N and steps by
    BLOCK_M, as the Triton tutorial's backward does: 128 held, 32 a step); each also with
    ``flip``, under an exact index-expression mask with ``whole``, and with ``TMA`` where
    descriptors can read the tiles."""
    parts = bwd_parts(graph, frozenset(info.nodes))
    skip = BwdEmitter(graph, info, AttentionBwdConfig(16, 16), parts).skip
    item = max(ITEM.get(graph[graph[m].inputs[0]].dtype, 2) for m in info.matmuls)
    heads = [head_block(gm.free_extent(graph)) for gm in parts.grads]
    dh = max([*heads, *(head_block(graph[graph[t].inputs[0]].shape[-1]) for t in parts.tiles)])
    cap_m, cap_n = max(16, next_pow2(parts.t)), max(16, next_pow2(parts.tk))
    out, tma_only = [], []
    for bm in (16, 32, 64, 128):
        if bm > cap_m or (bm < 32 and cap_m > 64):
            continue
        for bn in (16, 32, 64, 128):
            if bn > cap_n or (bn < 32 and cap_n > 64):
                continue
            for w in (4, 8):
                regs = (3 * bm * bn + max(bm, bn) * sum(heads)) // (32 * w)
                for st in (1, 2, 3):
                    tiles = bm * bn * (item + 4)
                    if regs <= 160 and st * (bm + bn) * dh * 2 * item + tiles <= HOPPER_SMEM_BYTES:
                        into = out
                    elif regs <= 288 and 1.1 * (st * (bm + bn) + max(bm, bn)) * dh * item + tiles <= HOPPER_SMEM_BYTES:  # fmt: skip
                        into = tma_only  # the TMA copies' buffers, a held tile, P / dS
                    else:
                        continue
                    for flip in (False, True):
                        into.append(AttentionBwdConfig(bm, bn, w, st, flip=flip))
                        if bm < bn <= cap_m and bm <= cap_n:  # query programs hold bn rows
                            into.append(AttentionBwdConfig(bm, bn, w, st, swap=True, flip=flip))
    if skip is not None and skip.exact:  # an exact mask: each config also with ``whole``
        out += [replace(c, whole=True) for c in out]
        tma_only += [replace(c, whole=True) for c in tma_only]
    if _tma_reads(graph, info, parts):  # tiles that never run past the sequence
        out += [replace(c, TMA=True) for c in out + tma_only if _whole_tiles(parts, c)]
    return out or [AttentionBwdConfig(16, 16, 1, 1)]


def _whole_tiles(parts: BwdParts, c: AttentionBwdConfig) -> bool:
    return all(n % max(c.BLOCK_M, c.BLOCK_N) == 0 for n in (parts.t, parts.tk))


def _tma_reads(graph: Graph, info: GroupInfo, parts: BwdParts) -> bool:
    """Whether some tile of the group can be read through a descriptor (probed at 16 x 16)."""
    probe = AttentionBwdConfig(16, 16, TMA=True)
    if not _whole_tiles(parts, probe):
        return False
    em = BwdEmitter(graph, info, probe, parts)
    em.emit()
    return bool(em.descriptors)


def attention_bwd_default(graph: Graph, info: GroupInfo) -> AttentionBwdConfig:
    """The flash-attention 2 backward's usual tiles on Hopper (64 x 64, 4 warps, 2 stages for
    head dims up to 64; 8 warps and 3 stages above: the best of the whole space for causal
    d = 128 on the H200, results/h200/attn_bwd_sweep_a760a14.json): the nearest config that
    fits this group."""
    parts = bwd_parts(graph, frozenset(info.nodes))
    big = max(gm.free_extent(graph) for gm in parts.grads) > 64
    want = (64, 64, 8, 3) if big else (64, 64, 4, 2)
    return nearest_config(attention_bwd_configs(graph, info), want)


class AttentionBwdKind:
    name = KIND
    library_first = False
    config_class = AttentionBwdConfig

    def claims(self, graph: Graph, members: frozenset[int]) -> bool:
        return sum(graph[m].kind == "matmul" for m in members) >= 3

    def analyze(self, graph: Graph, members: frozenset[int]) -> GroupInfo:
        return analyze_attention_bwd_group(graph, members)

    def config_space(self, graph: Graph, info: GroupInfo) -> list[AttentionBwdConfig]:
        return attention_bwd_configs(graph, info)

    def default_config(self, graph: Graph, info: GroupInfo) -> AttentionBwdConfig:
        return attention_bwd_default(graph, info)

    def check_config(self, info: GroupInfo, config: AttentionBwdConfig) -> None:
        if not isinstance(config, AttentionBwdConfig):
            raise ValueError(
                f"an attention backward kernel takes an AttentionBwdConfig, got {config!r}"
            )
        check_pow2(BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N, num_warps=config.num_warps)

    def prefix(self, info: GroupInfo, config: AttentionBwdConfig) -> str:
        return "attbwd"

    def generate(
        self, graph: Graph, info: GroupInfo, config: AttentionBwdConfig, index: int
    ) -> Kernel:
        self.check_config(info, config)
        return generate_attention_bwd(graph, info, config, index)
