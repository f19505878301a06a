"""The GEMM kind's cost facts: its output tiles, their shared memory, the product's flops at a
tile, padding and K-step efficiency, and the operands' traffic (A re-read once per column of
tiles, B once per row of tiles, from L2 but the first)."""

from __future__ import annotations

from autofuse.ir.graph import Graph
from autofuse.kernels.common.base import GroupInfo, Kernel
from autofuse.kernels.common.cost import TileCost
from autofuse.kernels.common.memory import nbytes


def gemm_cost(g: Graph, info: GroupInfo, kernel: Kernel) -> TileCost:
    assert kernel.meta.tiles is not None
    bm, bn, bk, smem = kernel.meta.tiles
    mm = g[info.matmuls[0]]
    a = g[mm.inputs[0]]
    batch = info.domain[0] if len(info.domain) == 3 else 1
    m, n, k = info.domain[-2], info.domain[-1], a.shape[-1]
    tm, tn = -(-m // bm), -(-n // bn)
    pad_eff = (m * n) / (tm * bm * tn * bn)
    tile_eff = min(1.0, (bm * bn) / (128 * 128)) ** 0.5
    k_eff = min(1.0, bk / 32) ** 0.5
    dram = sum(nbytes(g, j) for j in info.loads) + sum(nbytes(g, s) for s in info.stored)
    l2 = nbytes(g, g.base_of(mm.inputs[0])) * tn + nbytes(g, g.base_of(mm.inputs[1])) * tm
    return TileCost(
        programs=batch * tm * tn,
        warps=dict(kernel.launch_kw).get("num_warps", 4),
        smem=smem,
        mma_flops=2.0 * batch * m * n * k * len(info.matmuls),
        tensor_cores=a.dtype in ("bfloat16", "float16"),
        efficiency=(pad_eff, tile_eff, k_eff),
        core_ops=0.0,
        dram=dram,
        l2=l2,
        quantized=True,
    )
