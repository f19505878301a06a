"""Attention written the eager way, forward and forward+backward, on one GPU in one run:
eager, torch.compile (default and max-autotune-no-cudagraphs), SDPA with each backend (flash,
efficient, cuDNN, math) and autofuse (``optimize`` for the forward, the ``torch.compile``
backend for forward+backward).

    python -m experiments.bench.attention_bench --out $OUT [--variants causal,padded,...] [--trials 8]

Variants (bf16, B=8, H=32, T=1024, d=128 by default): ``causal`` (GPT-2 / Llama eager:
``q @ kᵀ / sqrt(d)``, a ``tril`` of ones, ``masked_fill(~mask, finfo.min)``, softmax in fp32
and back, ``@ v``), ``padded`` (an additive (B, 1, 1, T) padding mask, some batches padded),
``boolmask`` (a bool (B, 1, T, T) mask), ``window`` (causal within a sliding window, from
aranges), ``gqa`` (8 K/V heads shared by 32 query heads through expand + reshape, causal +
padding additive mask). SDPA gets the same mask (``is_causal`` where the mask is causal).

Writes ``attention_<commit>.json``: per variant and pass, microseconds per call (do_bench
median), TFLOP/s and the fraction of the bf16 matmul rate measured in the same run, the error
against a float64 eager reference, and the ratios autofuse / SDPA's best and autofuse / the
better torch.compile mode.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
import traceback
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from experiments.bench.model_functions import eager_attention, eager_attention_gqa

VARIANTS = ("causal", "padded", "boolmask", "window", "gqa")
WINDOW = 256


def window_of(t: int) -> int:
    """The sliding window: WINDOW keys, or a quarter of a short sequence."""
    return max(1, min(WINDOW, t // 4))


def _softmax_v(scores, v):
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype) @ v


def padded_attention(q, k, v, mask):
    return _softmax_v(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + mask, v)


def bool_mask_attention(q, k, v, keep):
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    return _softmax_v(s.masked_fill(~keep, torch.finfo(s.dtype).min), v)


def window_attention(q, k, v):
    t = q.shape[-2]
    i = torch.arange(t, device=q.device)[:, None]
    j = torch.arange(t, device=q.device)[None, :]
    keep = (j <= i) & (i - j < window_of(t))
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    return _softmax_v(s.masked_fill(~keep, torch.finfo(s.dtype).min), v)


def make(variant: str, b: int, h: int, t: int, d: int, dtype=torch.bfloat16, device="cuda"):
    """(eager-written fn, its args, SDPA call with the same semantics, FLOPs of one forward)."""
    torch.manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, device=device, dtype=dtype)

    q, k, v = r(b, h, t, d), r(b, h, t, d), r(b, h, t, d)
    dense = 4.0 * b * h * t * t * d
    causal_flops = dense * (t + 1) / (2 * t)
    neg = torch.finfo(dtype).min
    if variant == "causal":
        return eager_attention, (q, k, v), lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, is_causal=True), causal_flops  # fmt: skip
    if variant == "padded":
        lens = torch.tensor([t - (n * t) // (2 * b) for n in range(b)], device=device)
        keep = torch.arange(t, device=device)[None, :] < lens[:, None]
        mask = torch.zeros(b, 1, 1, t, device=device, dtype=dtype)
        mask = mask.masked_fill(~keep[:, None, None, :], neg)
        return padded_attention, (q, k, v, mask), lambda q, k, v, m: F.scaled_dot_product_attention(
            q, k, v, attn_mask=m), dense  # fmt: skip
    if variant == "boolmask":
        keep = torch.rand(b, 1, t, t, device=device) < 0.9
        keep[..., 0] = True
        return bool_mask_attention, (q, k, v, keep), lambda q, k, v, m: (
            F.scaled_dot_product_attention(q, k, v, attn_mask=m)), dense  # fmt: skip
    if variant == "window":
        i = torch.arange(t, device=device)[:, None]
        j = torch.arange(t, device=device)[None, :]
        keep = (j <= i) & (i - j < window_of(t))
        visited = float(keep.sum()) / (t * t)
        return window_attention, (q, k, v), lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, attn_mask=keep), dense * visited  # fmt: skip
    if variant == "gqa":
        hk = max(1, h // 4)
        k, v = r(b, hk, t, d), r(b, hk, t, d)
        keep = torch.ones(t, t, dtype=torch.bool, device=device).tril().expand(b, 1, t, t).clone()
        keep[0, ..., t - t // 8 :] = False  # the first sequence's last keys are padding
        mask = torch.zeros(b, 1, t, t, device=device, dtype=dtype).masked_fill(~keep, neg)
        return (
            eager_attention_gqa,
            (q, k, v, mask),
            lambda q, k, v, m: F.scaled_dot_product_attention(
                q, k, v, attn_mask=m, enable_gqa=True
            ),
            causal_flops,
        )
    raise SystemExit(f"unknown variant {variant!r}: expected one of {', '.join(VARIANTS)}")


SDPA_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")
MODES = ("default", "max-autotune-no-cudagraphs")


def _sdpa_with(backend: str, sdpa):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b = getattr(SDPBackend, backend)

    def call(*args):
        with sdpa_kernel([b]):
            return sdpa(*args)

    return call


def _train(fn, args, grad):
    """One forward + backward of ``fn`` (q, k, v require grad; their grads are cleared)."""
    leaves = args[:3]

    def step():
        for x in leaves:
            x.grad = None
        fn(*args).backward(grad)

    return step


def _grads(fn, args, grad):
    _train(fn, args, grad)()
    return [x.grad.clone() for x in args[:3]]


def _build(variant: str, a, fn, args, sdpa, train: bool) -> dict:
    """name -> callable: each backend's forward call of ``fn`` (or the function a train step
    runs)."""
    import autofuse
    from autofuse.tune.results import own_code

    calls = {"eager": fn}
    for b in SDPA_BACKENDS:
        calls[f"sdpa {b.lower()}"] = _sdpa_with(b, sdpa)
    for mode in a.modes:
        p = "forward+backward" if train else "forward"
        if mode != "default" and (
            variant not in a.max_autotune_variants or p not in a.max_autotune_passes
        ):
            continue
        calls[f"torch.compile {mode}"] = torch.compile(
            own_code(fn, f"{mode}-{train}"), mode=None if mode == "default" else mode
        )
    if train:
        calls["autofuse"] = torch.compile(own_code(fn, "af-train"), backend="autofuse")
        if a.trials:  # forward and backward graphs tuned
            opts = {"trials": a.trials, "time_budget": a.time_budget, "progress": False}
            calls["autofuse tuned"] = torch.compile(
                own_code(fn, "af-train-tuned"), backend="autofuse", options=opts
            )
    else:
        calls["autofuse greedy"] = autofuse.optimize(fn, args)
        if a.trials:
            calls["autofuse tuned"] = autofuse.optimize(
                fn, args, trials=a.trials, time_budget=a.time_budget, progress=False
            )
    return calls


def _check(call, args, ref, train, grad) -> tuple[float | None, str | None]:
    from autofuse.tune.results import max_rel_err

    try:
        t0 = time.perf_counter()
        got = _grads(call, args, grad) if train else call(*args)
        torch.cuda.synchronize()
        first, err = time.perf_counter() - t0, max_rel_err(got, ref)
        return first, None if err < 0.05 else f"wrong result: max rel err {err:.3g}"
    except Exception as e:  # noqa: BLE001 - a backend that cannot run this variant
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"


def run_variant(variant: str, a, peak: float) -> dict:
    from triton.testing import do_bench

    fn, args, sdpa, flops = make(variant, a.batch, a.heads, a.seq, a.head_dim)
    rec: dict = {"variant": variant, "shape": [a.batch, a.heads, a.seq, a.head_dim],
                 "fwd_flops": flops, "passes": {}}  # fmt: skip
    for train in (False, True) if variant in a.train_variants else (False,):
        p = "forward+backward" if train else "forward"
        dargs = [x.detach().double().requires_grad_(train and k < 3) if x.is_floating_point()
                 else x for k, x in enumerate(args)]  # fmt: skip
        targs = [x.detach().requires_grad_(train and k < 3) if x.is_floating_point() else x
                 for k, x in enumerate(args)]  # fmt: skip
        grad = torch.randn_like(args[0]) if train else None
        ref = _grads(fn, dargs, grad.double()) if train else fn(*dargs)
        t0 = time.perf_counter()
        calls = _build(variant, a, fn, targs, sdpa, train)
        out = {"build_s": time.perf_counter() - t0, "us": {}, "first_call_s": {}, "errors": {}}
        for name, call in calls.items():
            with _plans(out, name):
                first, why = _check(call, targs, ref, train, grad)
            if why:
                out["errors"][name] = why
                continue
            out["first_call_s"][name] = first
            f = _train(call, targs, grad) if train else (lambda c=call, t=targs: c(*t))
            out["us"][name] = do_bench(f, warmup=25, rep=a.rep_ms, return_mode="median") * 1e3
        fl = flops * (3.5 if train else 1.0)  # backward: 2.5 forwards' products (recompute aside)
        out["tflops"] = {k: fl / (v * 1e-6) / 1e12 for k, v in out["us"].items()}
        out["fraction_of_mm_peak"] = {k: fl / (v * 1e-6) / peak for k, v in out["us"].items()}
        _ratios(out)
        out["autofuse_plans"] = {
            name: [[k.info.kind, k.name, k.config.label()] for k in call.plan.kernels]
            for name, call in calls.items()
            if name.startswith("autofuse") and hasattr(call, "plan")
        }  # the configs the tuner chose
        rec["passes"][p] = out
        print(f"{variant:9s} {p:17s} " + "  ".join(f"{k}={v:.0f}" for k, v in out["us"].items()),
              flush=True)  # fmt: skip
        for k, v in out["errors"].items():
            print(f"{variant:9s} {p:17s} {k}: {v}", flush=True)
    _backward_phase(rec, flops, peak)
    return rec


def _backward_phase(rec: dict, flops: float, peak: float) -> None:
    """The backward alone, per backend timed in both passes: forward+backward minus forward,
    and its TFLOP/s (2.5 forwards' products) and fraction of the measured matmul peak."""
    fwd, both = rec["passes"].get("forward"), rec["passes"].get("forward+backward")
    if not fwd or not both:
        return
    f_us = dict(fwd["us"])
    f_us["autofuse"] = fwd.get("autofuse_best_us", math.nan)
    bwd = {k: v - f_us[k] for k, v in both["us"].items() if k in f_us and v > f_us[k]}
    rec["backward_only"] = {
        "us": bwd,
        "tflops": {k: 2.5 * flops / (v * 1e-6) / 1e12 for k, v in bwd.items()},
        "fraction_of_mm_peak": {k: 2.5 * flops / (v * 1e-6) / peak for k, v in bwd.items()},
    }


@contextlib.contextmanager
def _plans(out: dict, name: str):
    """For the torch.compile backend's call: every graph it compiled (forward, backward) with
    its kernels' kinds and names and its eager steps, and the warnings raised meanwhile (a
    kernel that failed to build and ran in eager says so here)."""
    if not name.startswith("autofuse"):
        yield
        return
    from autofuse.frontend import compiled_graphs

    before = {id(g) for g in compiled_graphs()}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield
    graphs = [
        {"kind": g.kind,
         "kernels": [[k.info.kind, k.name, k.config.label()] for k in g.plan.kernels],
         "eager_ops": {str(op): n for op, n in g.fallback_ops().items()}}
        for g in compiled_graphs() if id(g) not in before
    ]  # fmt: skip
    if graphs:  # a torch.compile call (optimize's calls compile no backend graph)
        key = "autofuse_graphs" if name == "autofuse" else f"{name.replace(' ', '_')}_graphs"
        out[key] = graphs
    warned = out.setdefault("autofuse_warnings", [])
    warned += sorted({f"{name}: {w.category.__name__}: {w.message}"[:300] for w in seen})


def _ratios(out: dict) -> None:
    us = out["us"]
    ours = [v for k, v in us.items() if k.startswith("autofuse")]
    if not ours:
        return
    best = min(ours)
    sdpa = [v for k, v in us.items() if k.startswith("sdpa")]
    comp = [v for k, v in us.items() if k.startswith("torch.compile")]
    out["autofuse_best_us"] = best
    if sdpa:
        out["vs_sdpa_best"] = min(sdpa) / best
    if comp:
        out["vs_best_compile"] = min(comp) / best
    out["vs_eager"] = us["eager"] / best


def main(argv: list[str] | None = None) -> dict:
    from autofuse.tune.roofline import ceilings
    from experiments.bench.bench_models import stamp

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument(
        "--max-autotune-variants",
        default="causal",
        help="variants also compiled with max-autotune (minutes of GEMM autotuning)",
    )
    p.add_argument(
        "--train-variants", default="causal,gqa", help="variants also timed forward+backward"
    )
    p.add_argument("--max-autotune-passes", default="forward,forward+backward")
    p.add_argument("--trials", type=int, default=8, help="autofuse tuning trials (0: greedy)")
    p.add_argument("--time-budget", type=float, default=30.0)
    p.add_argument("--rep-ms", type=float, default=100.0)
    a = p.parse_args(argv)
    a.modes = [m for m in a.modes.split(",") if m]
    a.max_autotune_variants = set(a.max_autotune_variants.split(","))
    a.train_variants = set(a.train_variants.split(","))
    a.max_autotune_passes = set(a.max_autotune_passes.split(","))
    variants = [v for v in a.variants.split(",") if v]
    ceil = ceilings()
    st = stamp("cuda")
    doc: dict = {"stamp": st, "ceilings": ceil, "variants": []}
    path = Path(a.out) / f"attention_{st['commit']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    for v in variants:
        try:
            doc["variants"].append(run_variant(v, a, ceil["bf16_mm_flops_per_s"]))
        except Exception as e:  # noqa: BLE001 - one variant's failure is recorded, not fatal
            doc["variants"].append({"variant": v, "error": traceback.format_exc()[-3000:]})
            print(f"{v}: {type(e).__name__}: {e}", flush=True)
        path.write_text(json.dumps(doc, indent=1, default=str))
    _print_table(doc)
    return doc


def _print_table(doc: dict) -> None:
    print("variant   pass               autofuse_us  sdpa_best_us  vs_sdpa  vs_compile  vs_eager")
    for rec in doc["variants"]:
        for p, out in rec.get("passes", {}).items():
            us = out["us"]
            sdpa = min((v for k, v in us.items() if k.startswith("sdpa")), default=math.nan)
            print(
                f"{rec['variant']:9s} {p:17s} {out.get('autofuse_best_us', math.nan):11.0f} "
                f"{sdpa:13.0f} {out.get('vs_sdpa_best', math.nan):8.2f} "
                f"{out.get('vs_best_compile', math.nan):10.2f} {out.get('vs_eager', math.nan):9.2f}"
            )


if __name__ == "__main__":
    main()
