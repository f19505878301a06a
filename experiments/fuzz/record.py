"""The fuzz run's record: one JSON line per graph (``graphs.jsonl``, appended as each graph
finishes, so a killed run keeps what it did and ``--resume`` skips it) and a summary
(``summary.json``) rewritten from those lines after every graph."""

from __future__ import annotations

import collections
import functools
import json
import os
import platform
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

import torch

from experiments.fuzz.compare import MODES, STATUSES
from experiments.fuzz.program import Program, value_flags


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a killed run
            continue
    return out


def append_jsonl(path: Path, rec: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def git_commit() -> str:
    """``AUTOFUSE_COMMIT`` where set (a checkout without ``.git``), else git's HEAD when the
    run wrote its first summary (a checkout that moves on during the run changes no record)."""
    return os.environ.get("AUTOFUSE_COMMIT") or git_head()


@functools.lru_cache(maxsize=1)
def git_head() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


@functools.lru_cache(maxsize=4)
def device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"{platform.processor() or platform.machine()} (Triton's interpreter)"


def versions(device: str = "cpu") -> dict:
    """The commit and the versions the run used, and the device's name."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"commit": git_commit(), "torch": torch.__version__, "triton": triton_version,
            "cuda": torch.version.cuda, "cudnn": cudnn, "python": platform.python_version(),
            "device": device, "device_name": device_name(device)}  # fmt: skip


def _counter_table(records: Sequence[dict], key: str) -> dict[str, dict[str, int]]:
    """Per op form (or op): graphs that used it, and those of them with a failure."""
    used: collections.Counter = collections.Counter()
    failing: collections.Counter = collections.Counter()
    for r in records:
        names = set(r.get(key, ()))
        used.update(names)
        if r.get("failures"):
            failing.update(names)
    return {n: {"graphs": used[n], "failing": failing[n]} for n in sorted(used)}


def summarize(records: Sequence[dict], config: dict, seconds: float, done_now: int) -> dict:
    checked = [r for r in records if not r.get("eager_rejected")]
    seeds = [r["seed"] for r in records]
    timed = [r["seconds"] for r in checked if r.get("seconds")]
    checks = {m: {s: 0 for s in STATUSES} for m in MODES}
    for r in checked:
        for v in r["verdicts"]:
            checks[v["mode"]][v["status"]] += 1
    failures = [f for r in records for f in r.get("failures", ())]
    graphs_with = collections.Counter(
        s for r in checked for s in {v["status"] for v in r["verdicts"]} if s != "pass"
    )
    return {
        "config": config,
        **versions(config.get("device", "cpu")),
        "tf32": "on" if config.get("tf32") else "off",
        "check_bounds": config.get("check_bounds", True),
        "graphs_tried": len(records),
        "graphs_checked": len(checked),
        "eager_rejected_graphs": len(records) - len(checked),
        "backward_eager_rejected_graphs": sum(
            bool(r.get("backward_eager_rejected")) for r in checked
        ),
        "rejected_op_draws": sum(r.get("rejected_draws", 0) for r in records),
        "graphs_with_mismatch": graphs_with["mismatch"],
        "graphs_with_crash": graphs_with["crash"],
        "graphs_with_timeout": graphs_with["timeout"],
        "checks": checks,
        "seconds_this_run": round(seconds),
        "graphs_per_minute": round(60 * done_now / seconds, 2) if done_now else None,
        "graphs_per_minute_recorded": round(60 * len(timed) / sum(timed), 2) if timed else None,
        "op_forms": _counter_table(checked, "forms"),
        "ops": _counter_table(checked, "ops"),
        "graph_seed_range": [min(seeds), max(seeds)] if seeds else [],
        "failures": failures,
        "classes": classes(failures),
    }


def failure_kind(f: dict) -> tuple[str, ...]:
    """Failures of one kind are shrunk a few times only: the mode, status, phase, exception
    type and (for a crash) the start of its message, numbers left out."""
    return (f["mode"], *failure_class(f))


def failure_class(f: dict) -> tuple[str, ...]:
    """(status, phase, exception type, message start) of a failure, either mode."""
    detail = f["detail"].replace("BackendCompilerFailed: backend='autofuse' raised: ", "")
    detail = detail.split(" Set TORCHDYNAMO_VERBOSE")[0]
    message = re.sub(r"\d+", "N", detail)[:60] if f["status"] == "crash" else ""
    return (f["status"], f["phase"], f["error"], message)


def classes(failures: Sequence[dict]) -> list[dict]:
    """Failures grouped by status, phase, exception and message, and whether the minimal
    program holds an empty tensor (size-0) or a dim of size 1 (size-1); the smallest
    reproduction of each group."""
    programs = {(f["graph"], f["mode"]): f["min_program"] for f in failures if "min_program" in f}
    groups: dict[tuple, list[dict]] = collections.defaultdict(list)
    for f in failures:
        prog = programs.get((f["graph"], f["mode"]))
        flags = value_flags(Program.from_json(prog)) if prog else ()
        groups[(*failure_class(f), *flags)].append(f)
    out = []
    for key, fs in sorted(groups.items()):
        best = min(fs, key=lambda f: (f.get("min_size", 99), f["graph"]))
        out.append({"status": key[0], "phase": key[1], "error": key[2], "flags": list(key[4:]),
                    "count": len(fs), "graphs": len({f["graph"] for f in fs}),
                    "modes": sorted({f["mode"] for f in fs}),
                    "front_ends": sorted({f["front_end"] for f in fs}),
                    "repro": best.get("repro"), "min_ops": best.get("min_ops"),
                    "first_graphs": sorted({f["graph"] for f in fs})[:10],
                    "detail": best["detail"][:200]})  # fmt: skip
    return out


def write_summary(path: Path, summary: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=1))
    os.replace(tmp, path)
