"""Kernel kind ``attention``: matmul -> pointwise / mask -> row softmax -> matmul in one kernel.

The group is found from the IR: two matmuls, the second reading (through casts and clones: a p = 0
dropout) the softmax of pointwise ops over the first's output. One program takes BLOCK_M query rows
of one (batch, head) and walks the keys in BLOCK_N tiles, flash-attention style: the score tile
``Q K^T`` (``tl.dot``, fp32), the group's pointwise ops on it (scale, masks: rendered by the emitter
from the op table), an online softmax (running row max ``m_i`` and sum ``l_i``; the output
accumulator is rescaled when the max grows) and ``acc += P V``; the score matrix never goes to
memory. Where the graph keeps softmax's row max and sum (the statistics a training forward saves
for the backward, see ``frontend/remat.py``), the final ``m_i`` and ``l_i`` are stored. Q, K and V
are read through their views (a transposed K, grouped-query heads shared by an expand + reshape:
index arithmetic, no copy).

An index-expression mask (causal, sliding window; a select, or an added ``where(cond, 0, C)``,
see ``attention_bounds.py``) bounds the key loop: tiles whose every element the mask makes its
constant C are skipped. They matter only to a row whose max stays near C (a row the mask hides
entirely, which eager makes uniform for a finite C): a guarded pass over the skipped tiles then
adds them exactly as eager would.

Under runtime sizes (``common/sizes.py``) the kernel takes the query and key counts ``T`` and
``TK`` as arguments, with the strides that hold them (``runtime.py``), masks its rows and keys
always and is configured by the lengths' bucket: the lengths of one bucket share one kernel.
"""

from __future__ import annotations

from dataclasses import replace

from autofuse.ir.graph import Graph
from autofuse.kernels.attention import tma as attention_tma
from autofuse.kernels.attention.analysis import forward_facts, head_block
from autofuse.kernels.attention.chains import chain_groups
from autofuse.kernels.attention.cost import attention_cost
from autofuse.kernels.attention.emit import (
    AttentionConfig,
    AttentionEmitter,
    generate_attention,
    parts_of,
)
from autofuse.kernels.common.base import (
    FusionRefused,
    GroupInfo,
    Kernel,
    describe,
    loaded_nodes,
    nearest_config,
    next_pow2,
    stored_nodes,
)
from autofuse.kernels.common.configs import HOPPER_SMEM_BYTES, check_pow2
from autofuse.kernels.common.cost import TileCost
from autofuse.kernels.common.memory import ITEM
from autofuse.kernels.common.sizes import config_extent, runtime_sizes_on


def analyze_attention_group(graph: Graph, members: frozenset[int]) -> GroupInfo:
    parts = forward_facts(graph, members)
    stored = stored_nodes(graph, members)
    extra = [s for s in stored if s not in (parts.mm2, parts.amax, parts.total)]
    if extra or parts.mm2 not in stored:
        raise FusionRefused(
            f"{describe(graph, extra[0]) if extra else 'nothing'} must be stored: the attention "
            "kernel writes only P @ V and the softmax's row max and sum (the scores and "
            "probabilities never go to memory)"
        )
    x = graph[parts.x]
    info = GroupInfo(
        nodes=tuple(sorted(members)),
        kind=AttentionKind.name,
        domain=tuple(x.shape),
        reduce_dims=(len(x.shape) - 1,),
        stored=stored,
        loads=loaded_nodes(graph, members),
        matmuls=(parts.mm1, parts.mm2),
    )
    if max(parts.d, parts.dv) > 256:
        raise FusionRefused(f"head dim {max(parts.d, parts.dv)} > 256: the tiles do not fit")
    AttentionEmitter(graph, info, AttentionConfig(16, 16), parts).emit()  # index checks
    return info


# ---------------------------------------------------------------------------------------------
# Code generation
# ---------------------------------------------------------------------------------------------


def attention_configs(graph: Graph, info: GroupInfo) -> list[AttentionConfig]:
    """BLOCK_M 64 / 128 (16 and 32 only for short sequences), BLOCK_N 32..128, 4 or 8 warps,
    2..4 stages: within shared memory (Q once, K and V per stage, the P and S tiles) and about
    128 fp32 registers per thread for the score tile and the accumulator. Under runtime sizes
    the same for every length of a bucket, and no TMA config (see ``generate_attention``)."""
    d = parts_of(graph, info)
    item = ITEM.get(graph[graph[info.matmuls[0]].inputs[0]].dtype, 2)
    bd, bdv = head_block(d.d), head_block(d.dv)
    cap_m, cap_n = (max(16, next_pow2(config_extent(n))) for n in (d.t, d.tk))
    out = []
    for bm in (16, 32, 64, 128):
        if bm > cap_m or (bm < 64 and cap_m > 64):
            continue
        for bn in (16, 32, 64, 128):
            if bn > cap_n or (bn < 32 and cap_n > 32):
                continue
            for w in (4, 8):
                regs = bm * (bn + bdv) // (32 * w)
                if regs > 128 or (bm >= 64 and bm * bn < 16 * 32 * w):
                    continue
                for st in (2, 3, 4):
                    # + the probability tile as the second dot's operand and the fp32 score
                    # tile's layout conversion (seen on an H200: 128 x 128, d 64, 4 stages
                    # asks 245760 bytes, exactly this sum)
                    smem = (bm * bd + st * bn * (bd + bdv)) * item + bm * bn * (item + 4)
                    if smem <= HOPPER_SMEM_BYTES:
                        out.append(AttentionConfig(bm, bn, w, st))
    probe = AttentionEmitter(graph, info, AttentionConfig(16, 16), d)
    if not runtime_sizes_on() and attention_tma.readable(
        probe
    ):  # K and V tiles by descriptors, on whole key tiles
        # (not with 2 stages: Triton 3.6's ptxas crashes on every such config of the causal
        # d = 128 forward, error -11; experiments/probes/kernel_resources.py)
        out += [replace(c, TMA=True) for c in out if d.tk % c.BLOCK_N == 0 and c.num_stages != 2]
    return out or [AttentionConfig(16, 16, 1, 1)]


def attention_default(graph: Graph, info: GroupInfo) -> AttentionConfig:
    """The usual flash-attention forward choice on Hopper: 128 x 64 tiles, 8 warps for head
    dim 128 (4 below), 3 stages; the nearest config that fits this group."""
    d = parts_of(graph, info)
    want = (128, 64, 8 if max(d.d, d.dv) >= 128 else 4, 3)
    return nearest_config([c for c in attention_configs(graph, info) if not c.TMA], want)


class AttentionKind:
    name = "attention"
    runtime_sizes = True  # T and TK the arguments, configs by bucket (``runtime.py``)
    library_first = False
    config_class = AttentionConfig

    def claims(self, graph: Graph, members: frozenset[int]) -> bool:
        mms = sum(graph[m].kind == "matmul" for m in members)
        return mms == 2 and any(graph[m].kind == "reduction" for m in members)

    def analyze(self, graph: Graph, members: frozenset[int]) -> GroupInfo:
        return analyze_attention_group(graph, members)

    def config_space(self, graph: Graph, info: GroupInfo) -> list[AttentionConfig]:
        return attention_configs(graph, info)

    def default_config(self, graph: Graph, info: GroupInfo) -> AttentionConfig:
        return attention_default(graph, info)

    def check_config(self, info: GroupInfo, config: AttentionConfig) -> None:
        if not isinstance(config, AttentionConfig):
            raise ValueError(f"an attention kernel takes an AttentionConfig, got {config!r}")
        check_pow2(BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N, num_warps=config.num_warps)

    def cost_facts(self, graph: Graph, info: GroupInfo, config: AttentionConfig) -> TileCost:
        return attention_cost(graph, info, config)

    def quick_configs(self, graph: Graph, info: GroupInfo) -> list[AttentionConfig]:
        return []  # its configs are the search's (and the SDPA backends, the planner's)

    def proposals(
        self, graph: Graph, members: frozenset[int], reach: dict[int, int]
    ) -> list[frozenset[int]]:
        """Attention chains (the backward's joined ones too), which pairwise merges reach only
        through groups no kind takes."""
        return chain_groups(graph, members, reach)

    def prefix(self, info: GroupInfo, config: AttentionConfig) -> str:
        return "att"

    def generate(
        self, graph: Graph, info: GroupInfo, config: AttentionConfig, index: int
    ) -> Kernel:
        self.check_config(info, config)
        return generate_attention(graph, info, config, index)
