"""The GEMM template's launch configs: shape-aware candidates for Hopper (H100/H200) and their
pruning to the problem (tiles clamped to it, shared memory and accumulator registers in
bounds, never empty)."""

from __future__ import annotations

from collections.abc import Sequence

from autofuse.kernels.common.configs import HOPPER_SMEM_BYTES
from autofuse.kernels.gemm.template import GemmConfig


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(x: int) -> int:
    return 1 if x <= 1 else 1 << (int(x) - 1).bit_length()


def default_configs(dtype_bytes: int, M: int, N: int, K: int) -> list[GemmConfig]:
    """Candidate configs for Hopper (H100/H200), shape-aware; pass them to prune_configs.

    Big tiles (128x128, 128x256, 256x128, 64x256 ...) with 4/8 warps and 3-5 stages for
    large problems, BLOCK_K scaled so one K chunk is 128 bytes (64 for bf16, 32 for fp32),
    plus small and skinny tiles when M or N are small (decode-like shapes).
    """
    bk = max(16, 128 // max(1, dtype_bytes))
    C = GemmConfig
    cands = [
        C(128, 256, bk, 8, 8, 3),
        C(256, 128, bk, 8, 8, 3),
        C(128, 128, bk, 8, 8, 4),
        C(128, 128, bk, 8, 4, 4),
        C(128, 128, 2 * bk, 8, 8, 3),
        C(128, 128, bk, 8, 4, 3),
        C(64, 256, bk, 8, 4, 4),
        C(256, 64, bk, 8, 4, 4),
        C(128, 64, bk, 8, 4, 4),
        C(64, 128, bk, 8, 4, 4),
        C(64, 128, 2 * bk, 8, 4, 3),
        C(64, 64, bk, 8, 4, 5),
        C(128, 32, bk, 8, 4, 4),
        C(64, 32, bk, 8, 4, 5),
        C(32, 64, bk, 8, 4, 5),
    ]
    small_m, small_n = _next_pow2(M) <= 64, _next_pow2(N) <= 64
    if small_m or small_n or K <= 64:
        cands += [
            C(32, 32, bk, 8, 4, 4),
            C(32, 32, 2 * bk, 8, 4, 3),
            C(16, 32, 2 * bk, 4, 2, 4),
            C(32, 16, 2 * bk, 4, 2, 4),
            C(16, 16, 2 * bk, 4, 1, 3),
            C(16, 16, bk, 1, 1, 2),
        ]
    if small_m:  # skinny M (decode): wide N tiles, deep K, split work over N
        cands += [
            C(16, 64, 2 * bk, 1, 4, 4),
            C(16, 128, 2 * bk, 1, 4, 4),
            C(16, 256, bk, 1, 4, 4),
            C(32, 128, 2 * bk, 1, 4, 4),
            C(64, 128, bk, 1, 4, 3),
        ]
    if small_n:
        cands += [
            C(64, 16, 2 * bk, 8, 4, 4),
            C(128, 16, 2 * bk, 8, 4, 4),
            C(256, 16, bk, 8, 4, 4),
            C(128, 32, 2 * bk, 8, 4, 4),
        ]
    out: list[GemmConfig] = []
    for c in cands:
        if c not in out:
            out.append(c)
    return out


def _fit_to_problem(c: GemmConfig, M: int, N: int, K: int) -> GemmConfig:
    cap_m, cap_n, cap_k = (max(16, _next_pow2(d)) for d in (M, N, K))
    bm, bn, bk = min(c.BLOCK_M, cap_m), min(c.BLOCK_N, cap_n), min(c.BLOCK_K, cap_k)
    warps = c.num_warps
    while warps > 1 and bm * bn < 128 * warps:
        warps //= 2
    stages = min(c.num_stages, max(2, _cdiv(K, bk) + 1))
    # a single tile row or column: the swizzle is the identity, canonicalise it
    group = 1 if _cdiv(M, bm) == 1 or _cdiv(N, bn) == 1 else c.GROUP_M
    return GemmConfig(bm, bn, bk, group, warps, stages, c.TMA, c.PERSISTENT)


def prune_configs(
    configs: Sequence[GemmConfig],
    dtype_bytes: int,
    M: int,
    N: int,
    K: int,
    n_b: int = 1,
    smem_bytes: int = HOPPER_SMEM_BYTES,
) -> list[GemmConfig]:
    """Fit configs to the problem, drop those that cannot run well; never empty.

    First every config is *clamped* to the problem (then duplicates are removed, first
    occurrence kept, order preserved):

    * a tile dimension larger than ``max(16, next_pow2(dim))`` (BM vs M, BN vs N, BK vs K)
      is reduced to it: a tile of ``next_pow2(dim)`` already covers the dimension, a larger
      one only wastes work;
    * ``num_warps`` is halved while the tile has under 4 outputs per thread
      (``BM*BN < 128*num_warps``);
    * ``num_stages`` is capped at ``max(2, cdiv(K, BK) + 1)`` (no more stages than K chunks);
    * ``GROUP_M`` becomes 1 when there is a single tile row or column (swizzle is a no-op).

    Then a config is dropped when its pipelined shared memory
    ``num_stages * (BM*BK + BK*BN*n_b) * dtype_bytes`` exceeds ``smem_bytes``, or its fp32
    accumulators need more than 128 registers per thread
    (``n_b*BM*BN / (32*num_warps) > 128``: they would spill).

    If nothing survives, the smallest config (by shared memory) is returned clamped, with
    stages, then BK, then the larger of BN/BM reduced until it fits.
    """
    kept: list[GemmConfig] = []
    for c0 in configs:
        c = _fit_to_problem(c0, M, N, K)
        if c.smem_bytes(dtype_bytes, n_b) > smem_bytes:
            continue
        if n_b * c.BLOCK_M * c.BLOCK_N > 128 * 32 * c.num_warps:
            continue
        if c not in kept:
            kept.append(c)
    return kept or [_smallest_fitting(configs, dtype_bytes, M, N, K, n_b, smem_bytes)]


def _smallest_fitting(
    configs: Sequence[GemmConfig], dtype_bytes: int, M: int, N: int, K: int, n_b: int,
    smem_bytes: int,
) -> GemmConfig:  # fmt: skip
    """The smallest config (by shared memory), clamped and shrunk until it fits."""
    if not configs:
        configs = [GemmConfig(16, 16, 16, 1, 1, 2)]
    c0 = min(configs, key=lambda c: (c.smem_bytes(dtype_bytes, n_b), c.BLOCK_M * c.BLOCK_N))
    c = _fit_to_problem(c0, M, N, K)
    bm, bn, bk, stages = c.BLOCK_M, c.BLOCK_N, c.BLOCK_K, c.num_stages

    def fits() -> bool:
        return stages * (bm * bk + bk * bn * n_b) * dtype_bytes <= smem_bytes

    # shrink until it fits: stages down to 2, then BK, then the larger of BN/BM, then 1 stage
    while not fits():
        if stages > 2:
            stages -= 1
        elif bk > 16:
            bk //= 2
        elif max(bm, bn) > 16:
            if bn >= bm:
                bn //= 2
            else:
                bm //= 2
        elif stages > 1:
            stages -= 1
        else:
            break
    warps = c.num_warps
    while warps > 1 and bm * bn < 128 * warps:
        warps //= 2
    while n_b * bm * bn > 128 * 32 * warps and warps < 8:
        warps *= 2
    return GemmConfig(bm, bn, bk, c.GROUP_M, warps, stages)
