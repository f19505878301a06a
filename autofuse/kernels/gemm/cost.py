"""The GEMM kind's cost facts: its output tiles, their shared memory, the product's flops at a
tile, padding and K-step efficiency, and the operands' traffic (A re-read once per column of
tiles, B once per row of tiles, from L2 but the first). ``product_cost`` prices any tiled
product on the GEMM template (the convolution kind's implicit GEMM too)."""

from __future__ import annotations

from autofuse.ir.graph import Graph
from autofuse.kernels.common.base import GroupInfo
from autofuse.kernels.common.cost import TileCost
from autofuse.kernels.common.memory import ITEM, nbytes
from autofuse.kernels.gemm.template import GemmConfig


def gemm_cost(g: Graph, info: GroupInfo, config: GemmConfig) -> TileCost:
    mm = g[info.matmuls[0]]
    a = g[mm.inputs[0]]
    batch = info.domain[0] if len(info.domain) == 3 else 1
    m, n, k = info.domain[-2], info.domain[-1], a.shape[-1]
    a_bytes, b_bytes = nbytes(g, g.base_of(mm.inputs[0])), nbytes(g, g.base_of(mm.inputs[1]))
    smem = config.smem_bytes(ITEM.get(a.dtype, 2), len(info.matmuls))
    return product_cost(g, info, config, smem, (batch, m, n, k), a.dtype, (a_bytes, b_bytes))


def product_cost(
    g: Graph,
    info: GroupInfo,
    config: GemmConfig,
    smem: int,
    dims: tuple[int, int, int, int],
    dtype: str,
    operand_bytes: tuple[int, int],
) -> TileCost:
    """A tiled product's facts: ``dims`` (batch, M, N, K) over ``config``'s tiles (taking
    ``smem`` bytes of shared memory), its operands (A: ``operand_bytes[0]`` re-read once per
    column of tiles, B once per row of tiles) in ``dtype``, every load and store of ``info``
    once from DRAM."""
    bm, bn, bk = config.BLOCK_M, config.BLOCK_N, config.BLOCK_K
    batch, m, n, k = dims
    tm, tn = -(-m // bm), -(-n // bn)
    pad_eff = (m * n) / (tm * bm * tn * bn)
    tile_eff = min(1.0, (bm * bn) / (128 * 128)) ** 0.5
    k_eff = min(1.0, bk / 32) ** 0.5
    dram = sum(nbytes(g, j) for j in info.loads) + sum(nbytes(g, s) for s in info.stored)
    l2 = operand_bytes[0] * tn + operand_bytes[1] * tm
    return TileCost(
        programs=batch * tm * tn,
        warps=config.num_warps,
        smem=smem,
        mma_flops=2.0 * batch * m * n * k * len(info.matmuls),
        tensor_cores=dtype in ("bfloat16", "float16"),
        efficiency=(pad_eff, tile_eff, k_eff),
        core_ops=0.0,
        dram=dram,
        l2=l2,
        quantized=True,
    )
