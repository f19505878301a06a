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

    python -m experiments.probes.attn_probe --out $OUT
"""

from __future__ import annotations

import argparse
import functools
import math

import torch
import triton
import triton.language as tl

from experiments.bench.suite import write_probe

LOG2E = 1.4426950408889634


TENSOR, CAUSAL_MASK, NO_MASK, BITS, BITS_GATHER = 0, 1, 2, 3, 4
MASKS = {"tensor": TENSOR, "causal": CAUSAL_MASK, "none": NO_MASK, "bits": BITS,
         "bits_gather": BITS_GATHER}  # fmt: skip


@triton.jit
def _dead(mask_ptr, offs_m, n0, S, BM: tl.constexpr, BN: tl.constexpr, MASK: tl.constexpr):
    """The [BM, BN] tile's masked-out entries, from the mask in the form MASK names."""
    offs_n = n0 + tl.arange(0, BN)
    if MASK == 1:
        dead = offs_n[None, :] > offs_m[:, None]
    elif MASK == 3:  # 32 columns per int32 word: load the tile's words, spread them over columns
        W: tl.constexpr = BN // 32
        words = tl.load(
            mask_ptr + offs_m[:, None] * (S // 32) + (n0 // 32 + tl.arange(0, W))[None, :]
        )
        spread = tl.reshape(tl.broadcast_to(words[:, :, None], (BM, W, 32)), (BM, BN))
        dead = ((spread >> (tl.arange(0, BN) % 32)[None, :]) & 1) != 0
    elif MASK == 4:  # the same words, gathered per column
        words = tl.load(mask_ptr + offs_m[:, None] * (S // 32) + (offs_n // 32)[None, :])
        dead = ((words >> (offs_n % 32)[None, :]) & 1) != 0
    else:
        dead = tl.load(mask_ptr + offs_m[:, None] * S + offs_n[None, :]).to(tl.int1)
    return dead


@triton.jit
def _scores(q, k_ptr, mask_ptr, offs_m, n0, S, D: tl.constexpr, BM: tl.constexpr,
            BN: tl.constexpr, qk_scale, MASK: tl.constexpr):  # fmt: skip
    """One [BM, BN] tile of scaled, masked scores in log2 units."""
    offs_n = n0 + tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    kt = tl.load(k_ptr + offs_n[None, :] * D + offs_d[:, None])
    s = tl.dot(q, kt) * qk_scale
    if MASK != 2:
        s = tl.where(_dead(mask_ptr, offs_m, n0, S, BM, BN, MASK), float("-inf"), s)
    return s


@triton.jit
def _row_block(q_ptr, S, D: tl.constexpr, BM: tl.constexpr, MASK: tl.constexpr):
    """This program's batch, its rows, their q tile, and the end of their live columns."""
    per_b = S // BM
    b = tl.program_id(0) // per_b
    m0 = (tl.program_id(0) % per_b) * BM
    offs_m = m0 + tl.arange(0, BM)
    q = tl.load(q_ptr + b * S * D + offs_m[:, None] * D + tl.arange(0, D)[None, :])
    end = S
    if MASK == 1:  # causal: no live column past the block's last row
        end = m0 + BM
    return b, offs_m, q, end


@triton.jit
def _online(m, lsum, s):
    """Tile ``s`` into the running row max ``m`` and sum of exp2(s - max) ``lsum``; also the
    max the tile's exps were taken against, and those exps."""
    m_new = tl.maximum(m, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    return m_new, lsum * tl.exp2(m - m_safe) + tl.sum(p, 1), m_safe, p


@triton.jit
def _zero_tail(out_ptr, offs_m, end, S, BM: tl.constexpr, BN: tl.constexpr):
    """Zeros in the columns from ``end`` on (past the diagonal of a causal mask)."""
    zero = tl.zeros([BM, BN], out_ptr.dtype.element_ty)
    for n0 in range(end, S, BN):
        offs_n = n0 + tl.arange(0, BN)
        tl.store(out_ptr + offs_m[:, None] * S + offs_n[None, :], zero)


@triton.jit
def two_pass(q_ptr, k_ptr, mask_ptr, out_ptr, S, qk_scale, D: tl.constexpr, BM: tl.constexpr,
             BN: tl.constexpr, STAGES: tl.constexpr, MASK: tl.constexpr):  # fmt: skip
    b, offs_m, q, end = _row_block(q_ptr, S, D, BM, MASK)
    k_ptr += b * S * D
    out_ptr += b * S * S
    m = tl.full([BM], float("-inf"), tl.float32)
    lsum = tl.zeros([BM], tl.float32)
    for n0 in tl.range(0, end, BN, num_stages=STAGES):
        s = _scores(q, k_ptr, mask_ptr, offs_m, n0, S, D, BM, BN, qk_scale, MASK)
        m, lsum, _, _ = _online(m, lsum, s)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    inv = 1.0 / lsum
    for n0 in tl.range(0, end, BN, num_stages=STAGES):
        s = _scores(q, k_ptr, mask_ptr, offs_m, n0, S, D, BM, BN, qk_scale, MASK)
        p = tl.exp2(s - m_safe[:, None]) * inv[:, None]
        offs_n = n0 + tl.arange(0, BN)
        tl.store(out_ptr + offs_m[:, None] * S + offs_n[None, :], p.to(out_ptr.dtype.element_ty))
    if MASK == 1:
        _zero_tail(out_ptr, offs_m, end, S, BM, BN)


@triton.jit
def one_pass(q_ptr, k_ptr, mask_ptr, out_ptr, S, qk_scale, D: tl.constexpr, BM: tl.constexpr,
             BN: tl.constexpr, NT: tl.constexpr, STAGES: tl.constexpr, MASK: tl.constexpr):  # fmt: skip
    b, offs_m, q, end = _row_block(q_ptr, S, D, BM, MASK)
    k_ptr += b * S * D
    out_ptr += b * S * S
    tiles = tl.arange(0, NT)[None, :]
    hist = tl.zeros([BM, NT], tl.float32)  # the running max each tile's exps were taken against
    m = tl.full([BM], float("-inf"), tl.float32)
    lsum = tl.zeros([BM], tl.float32)
    for n0 in tl.range(0, end, BN, num_stages=STAGES):
        s = _scores(q, k_ptr, mask_ptr, offs_m, n0, S, D, BM, BN, qk_scale, MASK)
        m, lsum, m_safe, p = _online(m, lsum, s)
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
    if MASK == 1:
        _zero_tail(out_ptr, offs_m, end, S, BM, BN)


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """[S, S] bool -> [S, S // 32] int32, column 32 w + b in bit b of word w."""
    s = mask.shape[-1]
    w = (mask.view(-1, s // 32, 32).to(torch.int64) << torch.arange(32, device=mask.device)).sum(-1)
    return (w - (w >> 31) * (1 << 32)).to(torch.int32)  # two's complement for bit 31


def reference(q, k, mask, kind: str) -> torch.Tensor:
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if kind == "causal":
        i = torch.arange(q.shape[-2], device=q.device)
        mask = i[:, None] < i[None, :]
    elif kind == "none":
        return torch.softmax(s, dim=-1)
    return torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)


def launch(design: str, q, k, mask, out, bm: int, bn: int, warps: int, stages: int, kind: str):
    """``mask``: the bool mask, or its packed words for the bits kinds."""
    b, s, d = q.shape
    scale = LOG2E / math.sqrt(d)
    grid = (b * s // bm,)
    kw = dict(D=d, BM=bm, BN=bn, STAGES=stages, MASK=MASKS[kind], num_warps=warps,
              num_stages=stages)  # fmt: skip
    if design == "two_pass":
        two_pass[grid](q, k, mask, out, s, scale, **kw)
    else:
        one_pass[grid](q, k, mask, out, s, scale, NT=s // bn, **kw)


CONFIGS = [(64, 64, 4, 3), (64, 64, 4, 2), (128, 64, 8, 3), (128, 64, 4, 2), (64, 128, 4, 2),
           (128, 128, 8, 2), (64, 32, 4, 3), (128, 32, 4, 3)]  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--masks", default="tensor,causal", help=f"of {', '.join(MASKS)}")
    p.add_argument("--designs", default="two_pass,one_pass")
    args = p.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    q = torch.randn(args.batch, args.seq, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(args.batch, args.seq, 128, device=dev, dtype=torch.bfloat16)
    mask = torch.rand(args.seq, args.seq, device=dev) > 0.9
    out = torch.empty(args.batch, args.seq, args.seq, device=dev, dtype=torch.bfloat16)
    bits = pack_bits(mask)
    t_pack = triton.testing.do_bench(lambda: pack_bits(mask), warmup=25, rep=100) * 1e-3
    print(f"pack_bits (torch ops): {t_pack * 1e6:.1f} us", flush=True)
    rows = [{"design": "pack_bits", "time_s": t_pack}]
    for kind in args.masks.split(","):
        ref = reference(q, k, mask, kind)
        operand = bits if kind.startswith("bits") else mask
        for design in args.designs.split(","):
            for bm, bn, warps, stages in CONFIGS:
                name = f"{design} {kind} BM={bm} BN={bn} w{warps} s{stages}"
                row = {"design": design, "mask": kind, "BM": bm, "BN": bn, "warps": warps,
                       "stages": stages}  # fmt: skip
                try:
                    out.normal_()  # no stale result can pass
                    launch(design, q, k, operand, out, bm, bn, warps, stages, kind)
                    err = (out.double() - ref).abs().max().item()
                    row["max_abs_err"] = err
                    if not err < 2e-2:
                        raise ValueError(f"wrong result: max abs error {err:.3g}")
                    run = functools.partial(launch, design, q, k, operand, out, bm, bn, warps,
                                            stages, kind)  # fmt: skip
                    row["time_s"] = triton.testing.do_bench(run, warmup=25, rep=100) * 1e-3
                except Exception as e:  # noqa: BLE001 - a failing config is a result
                    row["failure"] = f"{type(e).__name__}: {str(e)[:200]}"
                rows.append(row)
                t = row.get("time_s")
                print(f"{name:55s} {t * 1e6 if t else float('nan'):8.1f} us  "
                      f"{row.get('failure', '')}", flush=True)  # fmt: skip
    print("wrote", write_probe(args.out, "attn_probe", {"rows": rows}))


if __name__ == "__main__":
    main()
