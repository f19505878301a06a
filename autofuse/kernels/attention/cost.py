"""The attention kind's cost facts: two dots per visited (BLOCK_M, BLOCK_N) tile (a causal mask
skips about half: ``bounds.key_fraction``) on tensor cores for 16-bit operands, the epilogue and
the online softmax on CUDA cores; Q and the output once from DRAM, K and V once per program
(from L2 but the first), the epilogue's loads once per visited tile."""

from __future__ import annotations

from typing import Any

from autofuse.ir.graph import Graph
from autofuse.ir.ops import op_def
from autofuse.kernels.attention.analysis import head_block
from autofuse.kernels.attention.bounds import key_bound, key_fraction, scores_index
from autofuse.kernels.attention.emit import parts_of
from autofuse.kernels.common.base import GroupInfo
from autofuse.kernels.common.cost import TileCost
from autofuse.kernels.common.memory import nbytes


def attention_cost(g: Graph, info: GroupInfo, config: Any) -> TileCost:
    bm, bn, warps, stages = config.BLOCK_M, config.BLOCK_N, config.num_warps, config.num_stages
    parts = parts_of(g, info)
    bd, bdv = head_block(parts.d), head_block(parts.dv)
    limits = key_bound(g, info, scores_index(info.domain))[1]
    work = key_fraction(parts.t, parts.tk, limits, bm, bn)
    q, k, v = (parts.operand(g, which) for which in ("q", "k", "v"))
    heads, t, tk = parts.heads, parts.t, parts.tk
    item = 2 if g[q].dtype in ("bfloat16", "float16") else 4
    programs, steps = heads * -(-t // bm), -(-tk // bn) * work
    tile_elems = programs * steps * bm * bn
    epilogue = sum(op_def(g[m].op).cost for m in info.nodes if g[m].kind == "pointwise")
    operands = {g.base_of(j) for j in (q, k, v)}
    dram = nbytes(g, g.base_of(q)) + sum(nbytes(g, s) for s in info.stored)
    dram += sum(nbytes(g, j) for j in operands - {g.base_of(q)})
    l2 = programs * steps * bn * (bd + bdv) * item
    l2 += sum(nbytes(g, j) for j in info.loads if j not in operands) * work
    return TileCost(
        programs=programs,
        warps=warps,
        smem=(bm * bd + stages * bn * (bd + bdv)) * item,
        mma_flops=2.0 * tile_elems * (bd + bdv),
        tensor_cores=item == 2,
        efficiency=(min(1.0, bm * bn / (128 * 64)) ** 0.5,),
        core_ops=tile_elems * (epilogue + 12),  # + exp, max, sum, rescale
        dram=dram,
        l2=l2,
        quantized=False,
    )
