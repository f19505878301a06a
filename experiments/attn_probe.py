"""Probe: which kernel design makes ``softmax(masked_fill(q @ k^T / sqrt(d), mask))`` fast on the
H200? A standalone measurement, not part of the compiler; its answer decides which design the
row-GEMM template grows.

Designs (each one kernel, one program per BLOCK_M rows of one batch):
- ``two_pass``: the row-GEMM template's scheme: pass 1 computes the row max and sum of exps
  online, pass 2 recomputes every product and stores the normalized tile. Products: 2x.
- ``one_pass``: pass 1 also stores the unnormalized ``exp2(s - m_j)`` tile (m_j the running max
  when tile j was done, kept per tile in registers); pass 2 reads the program's own stores back
  (L2-hot) and rescales each by ``exp2(m_j - m) / l``. Products: 1x; one extra read and write of
  the output, mostly in L2.
Both take the scale times log2(e) into one multiply and use exp2. Mask forms: a bool tensor
(``tensor``), a causal condition from indices (``causal``, columns past the diagonal skipped).

    python -m experiments.attn_probe --out $OUT
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from pathlib import Path

import torch
import triton
import triton.language as tl

from experiments.bench import stamp

LOG2E = 1.4426950408889634


@triton.jit
def _scores(q, k_ptr, mask_ptr, offs_m, n0, S, D: tl.constexpr, BN: tl.constexpr,
            qk_scale, CAUSAL: tl.constexpr):  # fmt: skip
    """One [BM, BN] tile of scaled, masked scores in log2 units."""
    offs_n = n0 + tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    kt = tl.load(k_ptr + offs_n[None, :] * D + offs_d[:, None])
    s = tl.dot(q, kt) * qk_scale
    if CAUSAL:
        dead = offs_n[None, :] > offs_m[:, None]
    else:
        dead = tl.load(mask_ptr + offs_m[:, None] * S + offs_n[None, :]).to(tl.int1)
    return tl.where(dead, float("-inf"), s)


@triton.jit
def two_pass(q_ptr, k_ptr, mask_ptr, out_ptr, S, qk_scale, D: tl.constexpr, BM: tl.constexpr,
             BN: tl.constexpr, STAGES: tl.constexpr, CAUSAL: tl.constexpr):  # fmt: skip
    per_b = S // BM
    b = tl.program_id(0) // per_b
    offs_m = (tl.program_id(0) % per_b) * BM + tl.arange(0, BM)
    q = tl.load(q_ptr + b * S * D + offs_m[:, None] * D + tl.arange(0, D)[None, :])
    k_ptr += b * S * D
    end = S
    if CAUSAL:
        end = (tl.program_id(0) % per_b) * BM + BM
    m = tl.full([BM], float("-inf"), tl.float32)
    lsum = tl.zeros([BM], tl.float32)
    for n0 in tl.range(0, end, BN, num_stages=STAGES):
        s = _scores(q, k_ptr, mask_ptr, offs_m, n0, S, D, BN, qk_scale, CAUSAL)
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        lsum = lsum * tl.exp2(m - m_safe) + tl.sum(tl.exp2(s - m_safe[:, None]), 1)
        m = m_new
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    inv = 1.0 / lsum
    out_ptr += b * S * S
    for n0 in tl.range(0, end, BN, num_stages=STAGES):
        s = _scores(q, k_ptr, mask_ptr, offs_m, n0, S, D, BN, qk_scale, CAUSAL)
        p = tl.exp2(s - m_safe[:, None]) * inv[:, None]
        offs_n = n0 + tl.arange(0, BN)
        tl.store(out_ptr + offs_m[:, None] * S + offs_n[None, :], p.to(out_ptr.dtype.element_ty))
    if CAUSAL:
        zero = tl.zeros([BM, BN], out_ptr.dtype.element_ty)
        for n0 in range(end, S, BN):
            offs_n = n0 + tl.arange(0, BN)
            tl.store(out_ptr + offs_m[:, None] * S + offs_n[None, :], zero)


@triton.jit
def one_pass(q_ptr, k_ptr, mask_ptr, out_ptr, S, qk_scale, D: tl.constexpr, BM: tl.constexpr,
             BN: tl.constexpr, NT: tl.constexpr, STAGES: tl.constexpr, CAUSAL: tl.constexpr):  # fmt: skip
    per_b = S // BM
    b = tl.program_id(0) // per_b
    offs_m = (tl.program_id(0) % per_b) * BM + tl.arange(0, BM)
    q = tl.load(q_ptr + b * S * D + offs_m[:, None] * D + tl.arange(0, D)[None, :])
    k_ptr += b * S * D
    out_ptr += b * S * S
    end = S
    if CAUSAL:
        end = (tl.program_id(0) % per_b) * BM + BM
    tiles = tl.arange(0, NT)[None, :]
    hist = tl.zeros([BM, NT], tl.float32)  # the running max each tile's exps were taken against
    m = tl.full([BM], float("-inf"), tl.float32)
    lsum = tl.zeros([BM], tl.float32)
    for n0 in tl.range(0, end, BN, num_stages=STAGES):
        s = _scores(q, k_ptr, mask_ptr, offs_m, n0, S, D, BN, qk_scale, CAUSAL)
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        lsum = lsum * tl.exp2(m - m_safe) + tl.sum(p, 1)
        m = m_new
        hist = tl.where(tiles == n0 // BN, m_safe[:, None], hist)
        offs_n = n0 + tl.arange(0, BN)
        tl.store(out_ptr + offs_m[:, None] * S + offs_n[None, :], p.to(out_ptr.dtype.element_ty))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    scale = tl.exp2(hist - m_safe[:, None]) * (1.0 / lsum)[:, None]  # [BM, NT]
    tl.debug_barrier()  # this program's stores are visible to all its threads
    for n0 in range(0, end, BN):
        f = tl.sum(tl.where(tiles == n0 // BN, scale, 0.0), 1)
        offs_n = n0 + tl.arange(0, BN)
        ptrs = out_ptr + offs_m[:, None] * S + offs_n[None, :]
        p = tl.load(ptrs).to(tl.float32) * f[:, None]
        tl.store(ptrs, p.to(out_ptr.dtype.element_ty))
    if CAUSAL:
        zero = tl.zeros([BM, BN], out_ptr.dtype.element_ty)
        for n0 in range(end, S, BN):
            offs_n = n0 + tl.arange(0, BN)
            tl.store(out_ptr + offs_m[:, None] * S + offs_n[None, :], zero)


def reference(q, k, mask, causal: bool) -> torch.Tensor:
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        i = torch.arange(q.shape[-2], device=q.device)
        mask = i[:, None] < i[None, :]
    return torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)


def launch(design: str, q, k, mask, out, bm: int, bn: int, warps: int, stages: int, causal: bool):
    b, s, d = q.shape
    scale = LOG2E / math.sqrt(d)
    grid = (b * s // bm,)
    if design == "two_pass":
        two_pass[grid](q, k, mask, out, s, scale, D=d, BM=bm, BN=bn, STAGES=stages,
                       CAUSAL=causal, num_warps=warps, num_stages=stages)  # fmt: skip
    else:
        one_pass[grid](q, k, mask, out, s, scale, D=d, BM=bm, BN=bn, NT=s // bn, STAGES=stages,
                       CAUSAL=causal, num_warps=warps, num_stages=stages)  # fmt: skip


CONFIGS = [(64, 64, 4, 3), (64, 64, 4, 2), (128, 64, 8, 3), (128, 64, 4, 2), (64, 128, 4, 2),
           (128, 128, 8, 2), (64, 32, 4, 3), (128, 32, 4, 3)]  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=2048)
    args = p.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    q = torch.randn(args.batch, args.seq, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(args.batch, args.seq, 128, device=dev, dtype=torch.bfloat16)
    mask = torch.rand(args.seq, args.seq, device=dev) > 0.9
    out = torch.empty(args.batch, args.seq, args.seq, device=dev, dtype=torch.bfloat16)
    rows = []
    for causal in (False, True):
        ref = reference(q, k, mask, causal)
        for design in ("two_pass", "one_pass"):
            for bm, bn, warps, stages in CONFIGS:
                name = f"{design} {'causal' if causal else 'tensor'} BM={bm} BN={bn} w{warps} s{stages}"
                row = {"design": design, "causal": causal, "BM": bm, "BN": bn, "warps": warps,
                       "stages": stages}  # fmt: skip
                try:
                    out.normal_()  # no stale result can pass
                    launch(design, q, k, mask, out, bm, bn, warps, stages, causal)
                    err = (out.double() - ref).abs().max().item()
                    row["max_abs_err"] = err
                    if not err < 2e-2:
                        raise ValueError(f"wrong result: max abs error {err:.3g}")
                    run = functools.partial(launch, design, q, k, mask, out, bm, bn, warps,
                                            stages, causal)  # fmt: skip
                    row["time_s"] = triton.testing.do_bench(run, warmup=25, rep=100) * 1e-3
                except Exception as e:  # noqa: BLE001 - a failing config is a result
                    row["failure"] = f"{type(e).__name__}: {str(e)[:200]}"
                rows.append(row)
                t = row.get("time_s")
                print(f"{name:55s} {t * 1e6 if t else float('nan'):8.1f} us  "
                      f"{row.get('failure', '')}", flush=True)  # fmt: skip
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / f"attn_probe_{stamp()['commit']}.json"
    path.write_text(json.dumps({"stamp": stamp(), "rows": rows}, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
