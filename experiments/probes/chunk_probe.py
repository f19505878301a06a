"""Probe: does running ``softmax(masked_fill(q @ k^T / sqrt(d), mask))`` as cuBLAS bmm + a fused
softmax kernel in chunks of the batch, the score matrix of one chunk in a reused scratch buffer
that fits the L2 cache, beat running each kernel once over the whole batch? A standalone
measurement, not part of the compiler; its answer decides whether plans grow batch chunking.

    python -m experiments.probes.chunk_probe --out $OUT
"""

from __future__ import annotations

import argparse
import math

import torch
import triton
import triton.language as tl

from experiments.bench.suite import write_probe

LOG2E = 1.4426950408889634


@triton.jit
def masked_softmax(s_ptr, mask_ptr, out_ptr, S, qk_scale, XB: tl.constexpr, R: tl.constexpr):
    rows = tl.program_id(0) * XB + tl.arange(0, XB)[:, None]
    cols = tl.arange(0, R)[None, :]
    s = tl.load(s_ptr + rows * R + cols).to(tl.float32) * qk_scale
    dead = tl.load(mask_ptr + (rows % S) * R + cols).to(tl.int1)
    s = tl.where(dead, float("-inf"), s)
    m = tl.max(s, 1)[:, None]
    p = tl.exp2(s - m)
    p = p * (1.0 / tl.sum(p, 1)[:, None])
    tl.store(out_ptr + rows * R + cols, p.to(out_ptr.dtype.element_ty))


def softmax_launch(scores, mask, out, xb: int = 2, warps: int = 4) -> None:
    b, s, n = scores.shape
    scale = LOG2E / math.sqrt(128)
    masked_softmax[(b * s // xb,)](scores, mask, out, s, scale, XB=xb, R=n, num_warps=warps)


def run(q, kt, mask, out, scratch, chunk: int) -> None:
    for i in range(0, q.shape[0], chunk):
        sc = scratch[:chunk]
        torch.bmm(q[i : i + chunk], kt[i : i + chunk], out=sc)
        softmax_launch(sc, mask, out[i : i + chunk])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results")
    args = p.parse_args()
    torch.manual_seed(0)
    b, s, d = 32, 2048, 128
    q = torch.randn(b, s, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, s, d, device="cuda", dtype=torch.bfloat16)
    kt = k.transpose(1, 2)
    mask = torch.rand(s, s, device="cuda") > 0.9
    out = torch.empty(b, s, s, device="cuda", dtype=torch.bfloat16)
    scratch = torch.empty(b, s, s, device="cuda", dtype=torch.bfloat16)
    ref = torch.softmax(
        ((q.double() @ kt.double()) / math.sqrt(d)).masked_fill(mask, -math.inf), -1
    )
    rows = []
    for chunk in (32, 16, 8, 4, 2, 1):
        out.normal_()
        run(q, kt, mask, out, scratch, chunk)
        err = (out.double() - ref).abs().max().item()
        t = triton.testing.do_bench(lambda c=chunk: run(q, kt, mask, out, scratch, c), rep=200)
        rows.append({"chunk": chunk, "scratch_bytes": chunk * s * s * 2, "time_s": t * 1e-3,
                     "max_abs_err": err})  # fmt: skip
        print(f"chunk {chunk:2d} ({chunk * s * s * 2 / 2**20:6.1f} MiB scratch): "
              f"{t * 1e3:7.1f} us  err {err:.2e}", flush=True)  # fmt: skip
    t_bmm = triton.testing.do_bench(lambda: torch.bmm(q, kt, out=scratch), rep=200)
    t_sm = triton.testing.do_bench(lambda: softmax_launch(scratch, mask, out), rep=200)
    rows.append({"bmm_alone_s": t_bmm * 1e-3, "softmax_alone_s": t_sm * 1e-3})
    print(f"bmm alone {t_bmm * 1e3:.1f} us, softmax kernel alone {t_sm * 1e3:.1f} us")
    print("wrote", write_probe(args.out, "chunk_probe", {"rows": rows}))


if __name__ == "__main__":
    main()
