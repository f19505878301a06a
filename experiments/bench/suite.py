"""GPU benchmark driver: tunes each workload of the suite and times it against eager and
torch.compile (default and max-autotune-no-cudagraphs) in the same run.

    python -m experiments.bench.suite --out results/ --workloads pointwise,softmax --trials 40

Writes ``<tag>.json`` (ceilings plus one record per workload, rewritten after each workload so a
killed run keeps what it finished) and ``<tag>.csv``, stamped with commit, GPU, torch and
triton versions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import traceback
import warnings
from pathlib import Path

import torch

import autofuse
from autofuse.kernels import config_label
from autofuse.tune.results import flat_outputs, max_rel_err, own_code
from autofuse.tune.roofline import ceilings, min_bytes, seconds, stamp
from experiments.bench.workloads import BY_NAME, SUITE


def write_probe(out: str | Path, name: str, doc: dict) -> Path:
    """``doc`` with the run's stamp as ``<out>/<name>_<commit>.json``."""
    st = stamp()
    path = Path(out) / f"{name}_{st['commit']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"stamp": st, **doc}, indent=1))
    return path


def run_one(w, ceil, trials, budget, cache_dir, modes, n_rounds: int = 4) -> dict:
    inputs = w.inputs()
    ref_inputs = [t.double() if t.is_floating_point() else t for t in inputs]
    ref = w.fn(*ref_inputs)
    outputs = flat_outputs(w.fn(*inputs))
    rec: dict = {"workload": w.name, "kind": w.kind, **stamp()}
    rec["min_bytes"] = min_bytes(inputs, outputs)
    rec["flops"] = w.flops(inputs)
    floor = max(
        rec["min_bytes"] / ceil["copy_bytes_per_s"], rec["flops"] / ceil["bf16_mm_flops_per_s"]
    )
    rec["floor_s"] = floor
    times: dict = {}
    errs: dict = {}
    errs["eager"] = max_rel_err(w.fn(*inputs), ref)
    compiled = []
    torch._dynamo.reset()
    for mode in modes:
        t0 = time.perf_counter()
        # each mode compiles its own copy of the function's code: dynamo keeps its compiled
        # code per code object, and every mode must stay callable until the timing rounds
        c = torch.compile(own_code(w.fn, mode), mode=None if mode == "default" else mode)
        out = c(*inputs)
        rec[f"compile_s_{mode}"] = time.perf_counter() - t0
        errs[f"torch.compile {mode}"] = max_rel_err(out, ref)
        compiled.append((f"torch.compile {mode}", c))
    # a kernel that failed to build runs in eager with a warning: the record must say so
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        greedy = autofuse.optimize(w.fn, inputs)
        errs["autofuse greedy"] = max_rel_err(greedy(*inputs), ref)
        rec["greedy_build_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        tuned = autofuse.optimize(w.fn, inputs, trials=trials, time_budget=budget,
                                  cache_dir=cache_dir, progress=False)  # fmt: skip
        rec["tuning_s"] = time.perf_counter() - t0
        errs["autofuse tuned"] = max_rel_err(tuned(*inputs), ref)
    rec["warnings"] = sorted({f"{x.category.__name__}: {x.message}" for x in seen})
    # every variant, torch.compile's included, timed in the same interleaved rounds after all
    # compiling and tuning (clocks and thermals drift over a run: GEMM workloads timed before
    # and after a tuning session differ by several percent); min of rounds, and the order
    # alternates between rounds, so no variant is always timed hottest
    order = [("eager", w.fn), *compiled, ("autofuse greedy", greedy), ("autofuse tuned", tuned)]
    rounds: dict = {name: [] for name, _ in order}
    for r in range(n_rounds):
        for name, f in order if r % 2 == 0 else order[::-1]:
            rounds[name].append(seconds(f, inputs, rep_ms=100))
    for name, ts in rounds.items():
        times[name] = min(ts)  # every variant gets the same number of samples
    rec["interleaved_rounds_s"] = rounds
    rec["median_times_s"] = {name: statistics.median(ts) for name, ts in rounds.items()}
    tr = tuned.tuning
    rec["trials"] = tr.trials
    rec["failed_trials"] = tr.failed
    rec["pruned_trials"] = tr.pruned
    rec["tuned_kernels"] = [
        {"name": k.name, "config": config_label(k.config),
         "time_s": tr.kernel_times.get(k.name, (None,))[0]} for k in tuned.plan.kernels
    ]  # fmt: skip
    rec["greedy_kernels"] = [
        {"name": k.name, "config": config_label(k.config)} for k in greedy.plan.kernels
    ]
    rec["tuned_fallbacks"] = [s.reason for s in tuned.plan.fallbacks]
    # the search kept the greedy plan: the two callables run the same kernels and configs, and
    # their timings differ only by noise
    rec["same_plan_as_greedy"] = [(k.source, k.config) for k in tuned.plan.kernels] == [
        (k.source, k.config) for k in greedy.plan.kernels
    ]
    rec["times_s"] = times
    rec["max_rel_err_vs_fp64"] = errs
    rec["fraction_of_floor"] = {k: floor / v for k, v in times.items()}
    best_compile = (
        min(v for k, v in times.items() if k.startswith("torch.compile")) if modes else None
    )
    if best_compile:
        rec["speedup_tuned_vs_best_compile"] = best_compile / times["autofuse tuned"]
    rec["speedup_tuned_vs_greedy"] = times["autofuse greedy"] / times["autofuse tuned"]
    rec["speedup_tuned_vs_eager"] = times["eager"] / times["autofuse tuned"]
    rec["report"] = tuned.report()
    return rec


def write_csv(path: Path, rows: list[dict]) -> None:
    cols = ["workload", "eager", "torch.compile default", "torch.compile max-autotune-no-cudagraphs",
            "autofuse greedy", "autofuse tuned"]  # fmt: skip
    lines = ["workload,floor_us," + ",".join(f"{c}_us" for c in cols[1:]) + ",tuned_frac_of_floor,"
             "speedup_vs_best_compile,speedup_vs_greedy,max_rel_err_tuned,trials,tuning_s"]  # fmt: skip
    for r in rows:
        if "error" in r:
            lines.append(f"{r['workload']},ERROR")
            continue
        t = r["times_s"]
        vals = [f"{t[c] * 1e6:.2f}" if c in t else "" for c in cols[1:]]
        lines.append(",".join([r["workload"], f"{r['floor_s'] * 1e6:.2f}", *vals,
                               f"{r['fraction_of_floor']['autofuse tuned']:.3f}",
                               f"{r.get('speedup_tuned_vs_best_compile', float('nan')):.3f}",
                               f"{r['speedup_tuned_vs_greedy']:.3f}",
                               f"{r['max_rel_err_vs_fp64']['autofuse tuned']:.2e}",
                               str(r["trials"]), f"{r['tuning_s']:.1f}"]))  # fmt: skip
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "results"))
    p.add_argument("--workloads", default=",".join(w.name for w in SUITE))
    p.add_argument("--trials", type=int, default=40)
    p.add_argument("--budget", type=float, default=90.0, help="tuning seconds per workload")
    p.add_argument("--modes", default="default,max-autotune-no-cudagraphs")
    p.add_argument("--cache-dir", default="/tmp/autofuse_cache")
    p.add_argument("--tag", default="bench")
    p.add_argument("--rounds", type=int, default=4, help="interleaved timing rounds")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ceil = ceilings()
    doc = {"stamp": stamp(), "ceilings": ceil, "workloads": []}
    print(f"ceilings: copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
          f"bf16 mm {ceil['bf16_mm_flops_per_s'] / 1e12:.0f} TFLOP/s", flush=True)  # fmt: skip
    modes = [m for m in a.modes.split(",") if m]
    rows = []
    for name in a.workloads.split(","):
        w = BY_NAME[name]
        try:
            rec = run_one(w, ceil, a.trials, a.budget, a.cache_dir, modes, a.rounds)
        except Exception as e:  # noqa: BLE001 - one failing workload must not lose the others
            rec = {"workload": name, "error": f"{type(e).__name__}: {e}",
                   "traceback": traceback.format_exc(), **stamp()}  # fmt: skip
        doc["workloads"].append(rec)
        (out / f"{a.tag}.json").write_text(json.dumps(doc, indent=2, default=str))
        rows.append(rec)
        write_csv(out / f"{a.tag}.csv", rows)
        if "error" in rec:
            print(f"{name}: ERROR {rec['error']}", flush=True)
            continue
        t = rec["times_s"]
        print(f"{name:18s} " + " ".join(f"{k}={v * 1e6:.1f}us" for k, v in t.items())
              + f" floor={rec['floor_s'] * 1e6:.1f}us tuned/floor={rec['fraction_of_floor']['autofuse tuned']:.2f}"
              + f" err={rec['max_rel_err_vs_fp64']['autofuse tuned']:.2e}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
