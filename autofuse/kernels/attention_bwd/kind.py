"""Kernel kind ``attention_bwd``: its config space, its default and the plugin (the kernel
itself: ``attention_bwd.py``).

The space: BLOCK_M / BLOCK_N 16..128, 4 or 8 warps, 1..3 stages, ``swap`` and ``flip``
orientations, ``whole`` under an exact index-expression mask, and ``TMA`` (tiles through tensor
descriptors) where the tiles never run past the sequence. Register and shared-memory estimates
keep out configs that would not fit; both were checked against ``ptxas`` for sm_90 on the
causal d = 128 backward (``experiments/probes/kernel_resources.py``, Triton 3.6, aligned buffers):
128 x 64 tiles with 8 warps and 2 stages compile with no spill in 182 KB of shared memory,
64 x 64 tiles with 4 warps spill 200 bytes (outside the estimate), 3 stages of 128 x 64 do
not fit. Under runtime sizes the kernel takes T and TK as arguments, as the forward's
(``attention/runtime.py``): the space is the bucket's, without TMA (every tile edge masked).
"""

from __future__ import annotations

from dataclasses import replace

from autofuse.ir.graph import Graph
from autofuse.kernels.attention.analysis import head_block
from autofuse.kernels.attention_bwd.analysis import backward_facts
from autofuse.kernels.attention_bwd.cost import bwd_reads
from autofuse.kernels.attention_bwd.emit import (
    KIND,
    AttentionBwdConfig,
    BwdEmitter,
    BwdParts,
    analyze_attention_bwd_group,
    generate_attention_bwd,
)
from autofuse.kernels.common.base import GroupInfo, Kernel, ProposesNone, nearest_config, next_pow2
from autofuse.kernels.common.configs import HOPPER_SMEM_BYTES, check_pow2
from autofuse.kernels.common.cost import LoopCost, loop_cost
from autofuse.kernels.common.memory import ITEM
from autofuse.kernels.common.sizes import config_extent, runtime_sizes_on


def attention_bwd_configs(graph: Graph, info: GroupInfo) -> list[AttentionBwdConfig]:
    """BLOCK_M / BLOCK_N 16..128 (16 and 32 only for short sequences), 4 or 8 warps, 1..3
    stages, within about 288 fp32 registers a thread by the count of the tiles (P, dP, dS) and
    the accumulators (ptxas keeps what it cannot hold at 255 in few spilled bytes up to there),
    and within shared memory for the pipelined operand tiles, a held one, and P / dS; where
    BLOCK_M < BLOCK_N, also with ``swap`` (every program holds BLOCK_N and steps by BLOCK_M, as
    the Triton tutorial's backward does: 128 held, 32 a step); each also with ``flip``, under
    an exact index-expression mask with ``whole``, and with ``TMA`` where descriptors can
    read the tiles."""
    parts = backward_facts(graph, frozenset(info.nodes))
    skip = BwdEmitter(graph, info, AttentionBwdConfig(16, 16), parts).skip
    item = max(ITEM.get(graph[graph[m].inputs[0]].dtype, 2) for m in info.matmuls)
    heads = [head_block(gm.free_extent(graph)) for gm in parts.grads]
    dh = max([*heads, *(head_block(graph[graph[t].inputs[0]].shape[-1]) for t in parts.tiles)])
    cap_m, cap_n = (max(16, next_pow2(config_extent(n))) for n in (parts.t, parts.tk))
    out = []
    for bm in (16, 32, 64, 128):
        if bm > cap_m or (bm < 32 and cap_m > 64):
            continue
        for bn in (16, 32, 64, 128):
            if bn > cap_n or (bn < 32 and cap_n > 64):
                continue
            for w in (4, 8):
                if (3 * bm * bn + max(bm, bn) * sum(heads)) // (32 * w) > 288:
                    continue
                for st in (1, 2, 3):
                    smem = 1.1 * (st * (bm + bn) + max(bm, bn)) * dh * item + bm * bn * (item + 4)
                    if smem > HOPPER_SMEM_BYTES:
                        continue
                    for flip in (False, True):
                        out.append(AttentionBwdConfig(bm, bn, w, st, flip=flip))
                        if bm < bn <= cap_m and bm <= cap_n:  # query programs hold bn rows
                            out.append(AttentionBwdConfig(bm, bn, w, st, swap=True, flip=flip))
    wholes = [replace(c, whole=True) for c in out] if skip is not None and skip.exact else []
    tma = []
    # tiles that never run past the sequence (none under runtime sizes: every edge masked)
    if not runtime_sizes_on() and _tma_reads(graph, info, parts):
        tma = [replace(c, TMA=True) for c in out + wholes if _whole_tiles(parts, c)]
    out += [c for c in wholes if not _ptxas_fails(c)]
    return out + tma or [AttentionBwdConfig(16, 16, 1, 1)]


def _ptxas_fails(c: AttentionBwdConfig) -> bool:
    """``whole`` configs with pointer loads that Triton 3.6's ptxas crashes on (error -11) for
    the causal d = 128 backward (experiments/probes/kernel_resources.py: 17 of 360 configs, all of
    them these): 64 x 128 / 128 x 64 tiles and flipped key programs over wider key blocks,
    with 2 or 3 stages. Their TMA variants compile."""
    wide = c.BLOCK_M * c.BLOCK_N >= 8192 or (c.flip and c.BLOCK_M < c.BLOCK_N)
    return wide and c.num_stages >= 2


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
    head dims up to 64; 8 warps and 3 stages above: the best of the space timed for causal
    d = 128 on the H200, results/h200/attn_bwd_sweep_a760a14.json): the nearest config that
    fits this group, with ``whole`` where the mask allows it (fewer ops a tile; ptxas for
    sm_90 spills 16 bytes there against 44 without, Triton 3.6)."""
    parts = backward_facts(graph, frozenset(info.nodes))
    big = max(gm.free_extent(graph) for gm in parts.grads) > 64
    want = (64, 64, 8, 3) if big else (64, 64, 4, 2)
    space = attention_bwd_configs(graph, info)
    near = nearest_config(
        [c for c in space if not (c.flip or c.swap or c.TMA or c.whole)] or space, want
    )
    return replace(near, whole=True) if replace(near, whole=True) in space else near


class AttentionBwdKind(ProposesNone):
    name = KIND
    runtime_sizes = True  # T and TK the arguments, configs by bucket (``attention/runtime.py``)
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

    def reads(
        self, graph: Graph, info: GroupInfo, config: AttentionBwdConfig
    ) -> tuple[tuple[int, ...], int]:
        """(the times its kernel reads each load, its dots per tile: ``cost.py``)."""
        return bwd_reads(graph, info, config)

    def cost_facts(self, graph: Graph, info: GroupInfo, config: AttentionBwdConfig) -> LoopCost:
        reads = self.reads(graph, info, config)
        return loop_cost(graph, info, reads, config.BLOCK_M, config.BLOCK_N, config.num_warps)

    def prefix(self, info: GroupInfo, config: AttentionBwdConfig) -> str:
        return "attbwd"

    def generate(
        self, graph: Graph, info: GroupInfo, config: AttentionBwdConfig, index: int
    ) -> Kernel:
        self.check_config(info, config)
        return generate_attention_bwd(graph, info, config, index)
