"""Tables of KernelBench runs (``experiments.kernelbench``): per level the fraction correct and
fully fused, and on a GPU ``fast_1``, the fraction faster than the better torch.compile mode and
the geomean speedup over it; then one row per problem.

    python -m experiments.kernelbench.summary RUN_DIR [RUN_DIR ...] --out summary.md
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from pathlib import Path

from autofuse.tune.runfiles import read_json
from experiments.kernelbench.gpu import LIBRARY_BIAS, OWN_CONV, RULE_CONFIGS


def records(folders: list[Path]) -> list[dict]:
    out = []
    for folder in folders:
        for p in sorted(Path(folder).glob("L*_*.json")):
            rec = read_json(p)
            if rec and "level" in rec and "number" in rec:
                out.append(rec)
    return sorted(out, key=lambda r: (r["level"], r.get("dtype", ""), r["number"]))


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def level_stats(recs: list[dict]) -> dict:
    """The per-level figures (see the module docstring) over ``recs`` (one level, one mode)."""
    n = len(recs)
    gpu = [r for r in recs if r.get("mode") == "gpu"]
    stats = {"problems": n,
             "correct": sum(is_correct(r) for r in recs) / n if n else None,
             "wrong": sum(r.get("status") == "wrong" for r in recs),
             "errors": sum(r.get("status") in ("error", "crash", "timeout") for r in recs)}  # fmt: skip
    if any(r.get("mode") == "cpu" for r in recs):
        stats["fully_fused"] = sum(bool(r.get("fully_fused")) for r in recs) / n if n else None
    if gpu:
        speedups = [r["speedup_vs_best_compile"] for r in gpu if r.get("speedup_vs_best_compile")]
        stats.update({
            "fast_1": sum(bool(r.get("fast_1")) for r in gpu) / len(gpu),
            "faster_than_best_compile": sum(bool(r.get("faster_than_best_compile"))
                                            for r in gpu) / len(gpu),
            "geomean_vs_best_compile": geomean(speedups),
            "geomean_over": len(speedups),
        })  # fmt: skip
    return stats


def is_correct(rec: dict) -> bool:
    return rec.get("tuned_correct", False) if rec.get("mode") == "gpu" else bool(
        rec.get("correct") is True)  # fmt: skip


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _num(x: float | None, nd: int = 3) -> str:
    return "-" if x is None else f"{x:.{nd}g}"


def line(rec: dict) -> str:
    """One problem in a line (the run's progress)."""
    head = f"{rec['workload']:<60} {rec.get('status', '?'):<8}"
    if rec.get("mode") == "gpu" and "times_us" in rec:
        t = rec["times_us"]
        return head + " " + " ".join(f"{k}={_num(v['us'], 4)}us" for k, v in t.items()) + (
            f" vs_best_compile={_num(rec.get('speedup_vs_best_compile'))}")  # fmt: skip
    extra = f" kernels={rec.get('kernels', '-')} unfused={rec.get('unfused_ops', {})}"
    return head + extra + (f" error={rec['error']}" if rec.get("error") else "")


def failure(rec: dict) -> str:
    if rec.get("error"):
        return rec["error"]
    for key in ("optimize", "compile", "train"):
        sub = rec.get(key) or {}
        if not sub.get("correct", True):
            return f"{key}: " + (sub.get("error") or sub.get("why") or
                                 f"max abs err {_num(sub.get('max_abs_err'))}")  # fmt: skip
    return ""


def cpu_rows(recs: list[dict]) -> list[str]:
    out = ["| problem | stage | correct (optimize / compile / train) | kernels | eager steps "
           "(not library) | failure |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in recs:
        marks = "/".join("-" if k not in r else "ok" if r[k].get("correct") else "FAIL"
                         for k in ("optimize", "compile", "train"))  # fmt: skip
        unfused = ", ".join(f"{k} x{v}" for k, v in (r.get("unfused_ops") or {}).items())
        out.append(f"| {r['workload']} | {r.get('stage', '-')} | {marks} | "
                   f"{r.get('kernels', '-')} | {unfused} | {failure(r)[:120]} |")  # fmt: skip
    return out


def gpu_rows(recs: list[dict]) -> list[str]:
    cols = ["eager", "torch.compile default", "torch.compile max-autotune-no-cudagraphs",
            "autofuse greedy", "autofuse tuned"]  # fmt: skip
    heads = ["eager", "compile default", "compile max-autotune", "greedy", "tuned"]
    if any(LIBRARY_BIAS in r.get("times_us", {}) for r in recs):
        cols.insert(4, LIBRARY_BIAS)
        heads.insert(4, "greedy, bias in library")
    if any(OWN_CONV in r.get("times_us", {}) for r in recs):
        cols.insert(cols.index("autofuse tuned"), OWN_CONV)
        heads.insert(heads.index("tuned"), "greedy, own conv")
    if any(RULE_CONFIGS in r.get("times_us", {}) for r in recs):
        cols.insert(cols.index("autofuse tuned"), RULE_CONFIGS)
        heads.insert(heads.index("tuned"), "greedy, default configs")
    out = ["| problem | dtype | " + " | ".join(f"{h} µs" for h in heads) +
           " | floor µs | correct | fast_1 | vs best compile |",
           "|---|---|" + "---|" * (len(cols) + 4)]  # fmt: skip
    for r in recs:
        t = r.get("times_us", {})
        times = " | ".join(_num(t.get(c, {}).get("us"), 4) for c in cols)
        out.append(f"| {r['workload']} | {r.get('dtype')} | {times} | {_num(r.get('floor_us'), 4)}"
                   f" | {'yes' if r.get('tuned_correct') else 'NO'} | "
                   f"{'yes' if r.get('fast_1') else 'no'} | "
                   f"{_num(r.get('speedup_vs_best_compile'))} |")  # fmt: skip
    return out


def render(recs: list[dict]) -> str:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in recs:
        groups[(r["level"], r.get("mode", "cpu"), r.get("dtype", "fp32"))].append(r)
    first = recs[0] if recs else {}
    out = ["# KernelBench through autofuse", "",
           ", ".join(f"{k} {first[k]}" for k in ("commit", "gpu", "torch", "triton", "date")
                     if k in first), ""]  # fmt: skip
    out += ["| level | mode | dtype | problems | correct | wrong | errors / time-outs | fully fused"
            " | fast_1 | faster than best compile | geomean vs best compile |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for (level, mode, dtype), rs in sorted(groups.items()):
        s = level_stats(rs)
        out.append(f"| {level} | {mode} | {dtype} | {s['problems']} | {_pct(s['correct'])} | "
                   f"{s['wrong']} | {s['errors']} | {_pct(s.get('fully_fused'))} | "
                   f"{_pct(s.get('fast_1'))} | {_pct(s.get('faster_than_best_compile'))} | "
                   f"{_num(s.get('geomean_vs_best_compile'))} |")  # fmt: skip
    for (level, mode, dtype), rs in sorted(groups.items()):
        out += ["", f"## Level {level}, {mode}, {dtype}", ""]
        out += gpu_rows(rs) if mode == "gpu" else cpu_rows(rs)
    return "\n".join(out) + "\n"


def write_summary(folders: list[Path], path: Path) -> Path:
    path.write_text(render(records(folders)))
    return path


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m experiments.kernelbench.summary")
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    print(write_summary(a.runs, a.out))


if __name__ == "__main__":
    main()
