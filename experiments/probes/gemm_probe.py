"""Probe: does loading GEMM operands through TMA tensor descriptors (optionally persistent over
the output tiles) beat the pointer-based template and cuBLAS + a fused epilogue kernel on the
H200, for ``gelu(x @ w + b)`` in bf16? A standalone measurement, not part of the compiler: its
answer decides whether the GEMM template grows a descriptor-load variant.

    python -m experiments.probes.gemm_probe --out $OUT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from experiments.bench.suite import stamp


@triton.jit
def _gelu(x):
    return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))


@triton.jit
def _tile_epilogue(acc, bias_ptr, out_ptr, pid_m, pid_n, N, BM: tl.constexpr, BN: tl.constexpr):
    offs_n = pid_n * BN + tl.arange(0, BN)
    rm = (pid_m * BM + tl.arange(0, BM))[:, None]
    y = _gelu(acc + tl.load(bias_ptr + offs_n)[None, :].to(tl.float32))
    tl.store(out_ptr + rm * N + offs_n[None, :], y.to(out_ptr.dtype.element_ty))


@triton.jit
def _tile_coords(tile, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """Output tile number -> (pid_m, pid_n), GROUP_M rows of tiles at a time (L2 reuse)."""
    num_m, num_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    group = GROUP_M * num_n
    first_m = (tile // group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (tile % group) % size_m, (tile % group) // size_m


@triton.jit
def _tma_tile(
    a_desc, b_desc, pid_m, pid_n, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        a = a_desc.load([pid_m * BM, k * BK])
        b = b_desc.load([k * BK, pid_n * BN])
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def gemm_gelu_tma(
    a_ptr,
    b_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BM, BN, GROUP_M)
    acc = _tma_tile(a_desc, b_desc, pid_m, pid_n, K, BM, BN, BK)
    _tile_epilogue(acc, bias_ptr, out_ptr, pid_m, pid_n, N, BM, BN)


@triton.jit
def gemm_gelu_tma_persistent(
    a_ptr,
    b_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    NUM_SMS: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    tiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
    for tile in tl.range(tl.program_id(0), tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = _tile_coords(tile, M, N, BM, BN, GROUP_M)
        acc = _tma_tile(a_desc, b_desc, pid_m, pid_n, K, BM, BN, BK)
        _tile_epilogue(acc, bias_ptr, out_ptr, pid_m, pid_n, N, BM, BN)


@triton.jit
def gemm_gelu_ptr(
    a_ptr,
    b_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BM, BN, GROUP_M)
    rm = (pid_m * BM + tl.arange(0, BM))[:, None]
    rn = (pid_n * BN + tl.arange(0, BN))[None, :]
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        a = tl.load(a_ptr + rm * K + (k * BK + rk)[None, :])
        b = tl.load(b_ptr + (k * BK + rk)[:, None] * N + rn)
        acc = tl.dot(a, b, acc)
    _tile_epilogue(acc, bias_ptr, out_ptr, pid_m, pid_n, N, BM, BN)


CONFIGS = [  # BM, BN, BK, GROUP_M, warps, stages
    (128, 256, 64, 8, 8, 3),
    (128, 256, 64, 8, 8, 4),
    (256, 128, 64, 8, 8, 3),
    (128, 128, 64, 8, 4, 4),
    (128, 128, 64, 8, 8, 4),
    (128, 128, 128, 8, 8, 3),
]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="results")
    p.add_argument("--m", type=int, default=8192)
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--k", type=int, default=4096)
    a = p.parse_args()
    triton.set_allocator(
        lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda")
    )
    torch.manual_seed(0)
    m, n, k = a.m, a.n, a.k
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) * 0.02
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    ref = F.gelu(x.float() @ w.float() + b.float())
    flops = 2.0 * m * n * k
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []

    def record(name, fn, cfg=None):
        out = fn()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        t = triton.testing.do_bench(fn, warmup=100, rep=400, return_mode="median") * 1e-3
        rows.append(
            {
                "variant": name,
                "config": cfg,
                "time_s": t,
                "rel_err": err,
                "tflops": flops / t / 1e12,
            }
        )
        print(
            f"{name:28s} {str(cfg):32s} {t * 1e6:8.1f}us {flops / t / 1e12:6.0f} TFLOP/s "
            f"err={err:.1e}",
            flush=True,
        )

    record("cublas_mm+gelu(bias)", lambda: F.gelu(x @ w + b))
    record("cublas_mm_alone", lambda: x @ w)
    for cfg in CONFIGS:
        bm, bn, bk, g, nw, ns = cfg
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
        variants = [
            ("ptr", gemm_gelu_ptr, grid, {}),
            ("tma", gemm_gelu_tma, grid, {}),
            ("tma_persistent", gemm_gelu_tma_persistent, (sms,), {"NUM_SMS": sms}),
        ]
        for name, kern, grd, extra in variants:
            launch = dict(BM=bm, BN=bn, BK=bk, GROUP_M=g, num_warps=nw, num_stages=ns)

            def run(kern=kern, grd=grd, extra=extra, out=out, launch=launch):
                kern[grd](x, w, b, out, m, n, k, **extra, **launch)
                return out

            try:
                record(name, run, cfg)
            except Exception as e:  # an out-of-resources config is a data point, not a crash
                rows.append({"variant": name, "config": cfg, "failure": str(e)[:300]})
                print(name, cfg, "FAILED", str(e)[:200], flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gemm_probe.json").write_text(
        json.dumps({"stamp": stamp(), "shape": [m, n, k], "rows": rows}, indent=2)
    )


if __name__ == "__main__":
    main()
