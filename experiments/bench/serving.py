"""Serving benchmark: one request at a time at lengths drawn from a realistic distribution.

    python -m experiments.bench.serving --out results/ --device cuda --size realistic --tag serving_<commit>
    python -m experiments.bench.serving --quick                       # a small run (a few lengths)

Models: ``decoder`` (a Llama-style ``LlamaModel`` with one decoder layer) and ``encoder`` (a
BERT-style ``BertModel``), random weights from configs (nothing is downloaded), batch
``--batch`` (default 1). Request lengths: ``--requests`` draws (seeded) from a log-normal
(median ``--median``, ``--sigma``) clipped to ``[--min-len, --max-len]`` (default 16-4096).
Running every distinct length of such a trace through every per-shape mode would take hours of
compiles, so ``--lengths K`` lengths represent it: the midpoints of K equal-count strata of the
sorted trace (each stands for 1/K of the requests; a mode's time per request is their mean).

Modes (each in a fresh Dynamo state, each length's first call compiles it):
- ``eager``: the model as it is.
- ``autofuse_shape``: ``torch.compile(backend=autofuse, dynamic=False)``: one plan per length
  (``--trials`` / ``--time-budget`` tune each); the reference of the regret.
- ``autofuse_bucket``: each request padded to its bucket's upper edge (power-of-two buckets over
  the range by default, ``--buckets`` a list), one static plan per bucket, the output sliced
  back (the decoder is causal, so its first L positions do not see the padding; the encoder
  masks the padding with its attention mask).
- ``autofuse_dynamic``: ``torch.compile(backend=autofuse, dynamic=True)`` on the raw lengths:
  runtime-size loop kernels and one plan per power-of-two bucket of the symbolic sizes (a new
  length in a bucket instantiates the bucket's plan; ``--buckets`` gives the backend the same
  edges as the padded mode).
- ``compile_dynamic`` / ``compile_static``: ``torch.compile`` (``--compile-backend``, default
  Inductor) with ``dynamic=True``, and with ``dynamic=False`` (a recompile per length).
- ``compile_reduce_overhead``: ``torch.compile(mode="reduce-overhead", dynamic=False)``: CUDA
  graphs per length, as autofuse's modes replay them by default (``cuda_graph="auto"``): the
  arm to read autofuse's per-request times against where the host's time dominates.

Per mode: each length's first call (wall seconds, the compile) and its steady time per request
(``triton.testing.do_bench`` median on CUDA, or the injected timer), their ratio at the lengths
whose bucket a length before opened (``new_shape_over_steady``, the median), the output
checked against eager (max relative error), and the number of compiles: Dynamo's (``unique_graphs``) and
autofuse's (graphs the backend compiled into plans), over the warm-up pass and over a second pass
after it (``compiles_after_warmup``: 0 means no recompiles in steady state). The regret of a
mode is its mean time per request over ``autofuse_shape``'s, minus 1. The trace's own counts
(distinct lengths: what a per-shape mode compiles over it; distinct buckets) are recorded too.
JSON to ``<out>/<tag>.json`` (rewritten after every mode) with commit (``AUTOFUSE_COMMIT`` or
git), GPU, torch and triton. On one GPU within a 10-minute limit per command, run one model
per command: ``--models decoder --lengths 8 --budget-s 60``, then ``--models encoder``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODELS = ("decoder", "encoder")
MODES = ("eager", "autofuse_shape", "autofuse_bucket", "autofuse_dynamic", "compile_dynamic",
         "compile_static", "compile_reduce_overhead")  # fmt: skip
Timer = Callable[[Callable[[], Any]], float]

# hidden, layers, heads, kv heads, intermediate, vocab, dtype name
SIZES = {
    "tiny": dict(hidden=32, layers=1, heads=2, kv_heads=2, ffn=64, vocab=64, dtype="float32"),
    "realistic": dict(hidden=2048, layers=1, heads=16, kv_heads=4, ffn=5632, vocab=32000,
                      dtype="bfloat16"),
}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Request lengths and buckets
# ---------------------------------------------------------------------------------------------


def request_lengths(n: int, seed: int, lo: int, hi: int, median: float, sigma: float) -> list[int]:
    """``n`` lengths from a log-normal (``median``, ``sigma``) rounded and clipped to [lo, hi]."""
    rng = random.Random(seed)
    mu = math.log(median)
    return [min(hi, max(lo, round(rng.lognormvariate(mu, sigma)))) for _ in range(n)]


def strata_lengths(trace: list[int], k: int) -> list[int]:
    """The midpoints of ``k`` equal-count strata of the sorted trace (each stands for 1/k of
    the requests), in the order their first request of the stratum arrives."""
    s = sorted(trace)
    picks = [s[min(len(s) - 1, int((i + 0.5) * len(s) / k))] for i in range(k)]
    first = {length: trace.index(length) for length in set(picks)}
    return sorted(picks, key=lambda length: first[length])


def bucket_edges(lo: int, hi: int, given: list[int] | None = None) -> list[int]:
    """Upper edges of the buckets: ``given`` (sorted) or the powers of two above ``lo`` up to
    the first at or above ``hi``."""
    if given:
        edges = sorted(set(given))
        if edges[-1] < hi:
            raise ValueError(f"--buckets: the largest edge {edges[-1]} is below --max-len {hi}")
        return edges
    edge = 1
    while edge <= lo:
        edge *= 2
    edges = [edge]
    while edges[-1] < hi:
        edges.append(edges[-1] * 2)
    return edges


def bucket_of(length: int, edges: list[int]) -> int:
    return next(e for e in edges if e >= length)


# ---------------------------------------------------------------------------------------------
# Models and their requests
# ---------------------------------------------------------------------------------------------


def build_model(kind: str, size: str, device: str, max_len: int, attn: str, seed: int = 0):
    """The ``decoder`` or ``encoder`` model with random weights, in eval mode."""
    import torch
    import transformers as tf

    s = SIZES[size]
    common = dict(hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                  num_attention_heads=s["heads"], intermediate_size=s["ffn"],
                  vocab_size=s["vocab"], max_position_embeddings=max_len)  # fmt: skip
    if kind == "decoder":
        cfg = tf.LlamaConfig(**common, num_key_value_heads=s["kv_heads"], use_cache=False)
        cls = tf.LlamaModel
    elif kind == "encoder":
        cfg = tf.BertConfig(**common, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        cls = tf.BertModel
    else:
        raise ValueError(f"unknown model {kind!r}: expected one of {', '.join(MODELS)}")
    cfg._attn_implementation = attn
    torch.manual_seed(seed)
    kw = {"add_pooling_layer": False} if kind == "encoder" else {}
    return cls(cfg, **kw).to(device=device, dtype=getattr(torch, s["dtype"])).eval()


def request(kind: str, length: int, batch: int, vocab: int, device: str, pad_to: int = 0):
    """The keyword arguments of one request of ``length`` tokens, padded to ``pad_to``."""
    import torch

    g = torch.Generator().manual_seed(length)
    ids = torch.randint(0, vocab, (batch, max(length, pad_to)), generator=g).to(device)
    if kind == "decoder":
        return {"input_ids": ids}  # causal: the padding after the request is never attended
    mask = torch.zeros_like(ids)
    mask[:, :length] = 1
    return {"input_ids": ids, "attention_mask": mask}


# ---------------------------------------------------------------------------------------------
# Modes
# ---------------------------------------------------------------------------------------------


class Counts:
    """Compiles so far: Dynamo's graphs; for the autofuse backend its compiled graphs (one per
    shape a graph is called at), the plans it partitioned (one per bucket for symbolic
    graphs), the bucket plans it instantiated for another shape, and the kernels built."""

    def __init__(self, backend: Any = None) -> None:
        self.backend = backend

    def now(self) -> dict[str, int]:
        from torch._dynamo.utils import counters

        from autofuse.kernels.common.loader import kernels_built

        out = {"dynamo_graphs": int(counters["stats"]["unique_graphs"])}
        if self.backend is not None:
            out["autofuse_graphs"] = len(self.backend.records)
            out["autofuse_plans"] = self.backend.counts["plans"]
            out["autofuse_bucket_instances"] = self.backend.counts["bucket_instances"]
            out["kernels_built"] = kernels_built()
        return out


def make_mode(mode: str, model: Any, a: argparse.Namespace) -> tuple[Callable, Counts, bool]:
    """(the callable of a request's kwargs, its compile counter, whether it pads to buckets)."""
    import torch

    from autofuse.frontend import make_backend

    if mode == "eager":
        return model, Counts(), False
    if mode.startswith("autofuse"):
        opts = {}
        if a.trials:
            opts["trials"] = a.trials
        if a.time_budget:
            opts["time_budget"] = a.time_budget
        if mode == "autofuse_dynamic" and a.buckets:
            opts["buckets"] = a.buckets
        backend = make_backend(**opts)
        dynamic = {"autofuse_dynamic": True}.get(mode, False)
        fn = torch.compile(model, backend=backend, dynamic=dynamic)
        return fn, Counts(backend), mode == "autofuse_bucket"
    if mode in ("compile_dynamic", "compile_static"):
        fn = torch.compile(model, backend=a.compile_backend, dynamic=mode == "compile_dynamic")
        return fn, Counts(), False
    if mode == "compile_reduce_overhead":
        fn = torch.compile(model, backend=a.compile_backend, mode="reduce-overhead", dynamic=False)
        return fn, Counts(), False
    raise ValueError(f"unknown mode {mode!r}: expected one of {', '.join(MODES)}")


def wall_timer(device: str, rep_ms: float) -> Timer:
    """Seconds per request: ``do_bench``'s median on CUDA, the median of calls on CPU."""
    from experiments.bench.bench_models import time_once

    return lambda fn: time_once(fn, device, rep_ms)


def max_rel_err(got: Any, want: Any) -> float:
    g, w = got.detach().double(), want.detach().double()
    return (g - w).abs().max().item() / max(w.abs().max().item(), 1e-6)


# ---------------------------------------------------------------------------------------------
# One model through one mode
# ---------------------------------------------------------------------------------------------


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def run_mode(mode: str, kind: str, model: Any, lengths: list[int], refs: dict[int, Any],
             a: argparse.Namespace, timer: Timer) -> dict:  # fmt: skip
    """Warm-up pass (first call per length: the compile) then the timed steady state, then a
    second pass that counts the compiles after warm-up."""
    import torch

    torch._dynamo.reset()
    fn, counts, pads = make_mode(mode, model, a)
    edges = bucket_edges(a.min_len, a.max_len, a.buckets)
    vocab = SIZES[a.size]["vocab"]

    def inputs(length: int) -> dict:
        pad = bucket_of(length, edges) if pads else 0
        return request(kind, length, a.batch, vocab, a.device, pad)

    def call(length: int, kw: dict) -> Any:
        with torch.no_grad():
            return fn(**kw).last_hidden_state[:, :length]

    rec: dict[str, Any] = {"per_length": {}, "status": "ok"}
    start, before = time.perf_counter(), counts.now()
    for length in lengths:
        if time.perf_counter() - start > a.budget_s:
            rec["status"] = f"partial: --budget-s {a.budget_s} spent"
            break
        kw = inputs(length)  # made outside the timed calls
        t0 = time.perf_counter()
        out = call(length, kw)
        _sync(a.device)
        row = {
            "first_call_s": time.perf_counter() - t0,
            "max_rel_err": max_rel_err(out, refs[length]),
            "bucket_known": any(bucket_of(int(k), edges) == bucket_of(length, edges)
                                for k in rec["per_length"]),
        }  # fmt: skip
        row["request_s"] = timer(lambda length=length, kw=kw: call(length, kw))
        rec["per_length"][str(length)] = row
    warm = counts.now()
    for length in [int(k) for k in rec["per_length"]]:
        call(length, inputs(length))
    after = counts.now()
    rec["compiles"] = {k: warm[k] - before[k] for k in warm}
    rec["compiles_after_warmup"] = {k: after[k] - warm[k] for k in after}
    done = rec["per_length"].values()
    if done and rec["status"] == "ok":
        rec["mean_request_s"] = sum(r["request_s"] for r in done) / len(done)
    rec["worst_rel_err"] = max((r["max_rel_err"] for r in done), default=None)
    known = sorted(r["first_call_s"] / r["request_s"] for r in done if r["bucket_known"])
    # a new length's first call (its compile) over its steady time, where a length of its
    # bucket ran before: the median
    rec["new_shape_over_steady"] = known[len(known) // 2] if known else None
    return rec


def regrets(modes: dict[str, dict], reference: str = "autofuse_shape") -> dict[str, Any]:
    """Per mode: mean time per request over the reference's, minus 1, and the worst length's."""
    ref = modes.get(reference, {})
    if "mean_request_s" not in ref:
        return {}
    out: dict[str, Any] = {}
    for mode, rec in modes.items():
        if mode == reference or "mean_request_s" not in rec:
            continue
        per = {
            k: r["request_s"] / ref["per_length"][k]["request_s"] - 1
            for k, r in rec["per_length"].items()
            if k in ref["per_length"]
        }
        out[mode] = {
            "mean": rec["mean_request_s"] / ref["mean_request_s"] - 1,
            "worst_length": max(per.items(), key=lambda kv: kv[1]) if per else None,
        }
    return out


def run_model(kind: str, lengths: list[int], a: argparse.Namespace, timer: Timer,
              save: Callable[[dict], None] = lambda rec: None) -> dict:  # fmt: skip
    """Every mode of ``--modes`` on one model; a failing mode records its error; ``save`` gets
    the model's record after each mode (a run killed by a time limit keeps what it finished)."""
    import torch

    edges = bucket_edges(a.min_len, a.max_len, a.buckets)
    model = build_model(kind, a.size, a.device, edges[-1], a.attn)  # positions to the last edge
    vocab = SIZES[a.size]["vocab"]
    refs = {}
    with torch.no_grad():
        for length in lengths:
            kw = request(kind, length, a.batch, vocab, a.device)
            refs[length] = model(**kw).last_hidden_state
    modes: dict[str, dict] = {}
    rec = {"modes": modes, "regret_vs_autofuse_shape": {}}
    limits = {"recompile_limit": 100000, "accumulated_recompile_limit": 100000}
    for mode in a.modes:
        try:
            with torch._dynamo.config.patch(**limits):
                modes[mode] = run_mode(mode, kind, model, lengths, refs, a, timer)
        except Exception as e:  # noqa: BLE001 - one mode failing leaves the others to run
            modes[mode] = {"status": f"error: {type(e).__name__}: {e}"[:600],
                           "traceback": traceback.format_exc()[-3000:]}  # fmt: skip
        print(f"{kind:8} {mode:17} {_line(modes[mode])}", flush=True)
        rec["regret_vs_autofuse_shape"] = regrets(modes)
        save(rec)
    return rec


def _line(rec: dict) -> str:
    if "mean_request_s" not in rec:
        return rec["status"]
    c = rec["compiles"]
    return (f"{rec['mean_request_s'] * 1e3:9.3f} ms/request  compiles {c}  after warm-up "
            f"{rec['compiles_after_warmup']}  err {rec['worst_rel_err']:.2g}")  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def _csv(kind: type) -> Callable[[str], list]:
    return lambda s: [kind(x) for x in s.split(",") if x]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "results"))
    p.add_argument("--tag", default="serving")
    p.add_argument("--device", default=None, help="cuda where available, else cpu")
    p.add_argument("--size", default=None, choices=sorted(SIZES),
                   help="realistic on cuda, tiny on cpu")  # fmt: skip
    p.add_argument("--models", type=_csv(str), default=list(MODELS))
    p.add_argument("--modes", type=_csv(str), default=list(MODES))
    p.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--requests", type=int, default=2000, help="trace length (draws)")
    p.add_argument("--lengths", type=int, default=10, help="strata of the trace that are run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-len", type=int, default=16)
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--median", type=float, default=384.0)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--buckets", type=_csv(int), default=None, help="bucket upper edges")
    p.add_argument("--trials", type=int, default=0, help="autofuse tuning trials per plan")
    p.add_argument("--time-budget", type=float, default=0.0, help="autofuse tuning seconds")
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument("--rep-ms", type=float, default=100.0, help="timing per length and mode")
    p.add_argument("--budget-s", type=float, default=300.0, help="warm-up seconds per mode")
    p.add_argument("--quick", action="store_true", help="4 lengths up to 1024, short timing")
    a = p.parse_args(argv)
    return _resolve(p, a)


def _resolve(p: argparse.ArgumentParser, a: argparse.Namespace) -> argparse.Namespace:
    import torch

    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    a.size = a.size or ("realistic" if a.device == "cuda" else "tiny")
    if a.quick:
        a.lengths, a.max_len, a.rep_ms = min(a.lengths, 4), min(a.max_len, 1024), 25.0
    for name, values, known in (("--models", a.models, MODELS), ("--modes", a.modes, MODES)):
        unknown = [v for v in values if v not in known]
        if unknown:
            p.error(f"{name}: unknown {', '.join(unknown)} (expected some of {', '.join(known)})")
    if not 0 < a.min_len <= a.max_len:
        p.error("--min-len and --max-len: need 0 < min <= max")
    if a.lengths < 1 or a.requests < a.lengths:
        p.error("--lengths: need 1 <= --lengths <= --requests")
    try:
        bucket_edges(a.min_len, a.max_len, a.buckets)
    except ValueError as e:
        p.error(str(e))
    return a


def main(argv: list[str] | None = None, timer: Timer | None = None) -> dict:
    """Runs the benchmark; ``timer`` (seconds per call of a callable) replaces the clock."""
    from autofuse.tune.roofline import stamp

    a = parse_args(argv)
    trace = request_lengths(a.requests, a.seed, a.min_len, a.max_len, a.median, a.sigma)
    lengths = strata_lengths(trace, a.lengths)
    edges = bucket_edges(a.min_len, a.max_len, a.buckets)
    result: dict[str, Any] = {
        "stamp": stamp(),
        "args": {k: v for k, v in vars(a).items()},
        "trace": {
            "requests": len(trace),
            "distinct_lengths": len(set(trace)),
            "bucket_edges": edges,
            "distinct_buckets": len({bucket_of(n, edges) for n in trace}),
            "quantiles": {q: sorted(trace)[int(q * (len(trace) - 1))] for q in (0, 0.5, 0.9, 1)},
            "run_lengths": lengths,
        },
        "timer": "injected" if timer else ("do_bench median" if a.device == "cuda" else "wall"),
        "models": {},
    }
    timer = timer or wall_timer(a.device, a.rep_ms)
    out = Path(a.out) / f"{a.tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    def save(kind: str, rec: dict) -> None:
        result["models"][kind] = rec
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1, default=str))
        tmp.replace(out)

    for kind in a.models:
        save(kind, run_model(kind, lengths, a, timer, lambda rec, kind=kind: save(kind, rec)))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
