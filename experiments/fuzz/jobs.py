"""Several shards of one fuzz run at once (``--jobs n``): ``python -m experiments.fuzz ...
--shard k/n`` started ``n`` times (each with its own checking child, its output in
``<out>/shard<k>of<n>.log``), waited for, and their records merged into ``<out>/summary.json``
(a failure's reproduction named by its shard's folder). On a CUDA host with several visible
GPUs, shard ``k`` (and its checking child) sees only the ``k mod count``-th
(``CUDA_VISIBLE_DEVICES``); with one, all shards share it. The same by hand:

    for k in 0 1 2 3; do python -m experiments.fuzz ... --shard $k/4 & done; wait
    python -c "from experiments.fuzz.jobs import merge; merge(Path(OUT), 4, {})"
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from experiments.fuzz.record import read_jsonl, summarize, write_summary

ROOT = Path(__file__).resolve().parents[2]


def stop(signum: int, _frame: object) -> None:
    """SIGTERM as an exit, so that ``finally`` blocks end the children this process started."""
    raise SystemExit(128 + signum)


def child_argv(argv: list[str], k: int, n: int) -> list[str]:
    """The command line of shard ``k`` of ``n``: ``argv`` without ``--jobs``."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--jobs":
            skip = True
        elif not a.startswith("--jobs="):
            out.append(a)
    return [*out, "--shard", f"{k}/{n}"]


def gpu_env(device: str, k: int) -> dict[str, str]:
    """Shard ``k``'s ``CUDA_VISIBLE_DEVICES``: one of several visible GPUs in turn (nothing
    for the CPU, a GPU named by index, or a single GPU)."""
    if device != "cuda":
        return {}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v for v in visible.split(",") if v] if visible else None
    if ids is None:
        ids = [str(i) for i in range(torch.cuda.device_count())]
    return {"CUDA_VISIBLE_DEVICES": ids[k % len(ids)]} if len(ids) > 1 else {}


def run_jobs(args: argparse.Namespace, argv: list[str]) -> int:
    """The ``args.jobs`` shards in parallel child processes; their records merged."""
    n = args.jobs
    args.out.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []
    t0 = time.perf_counter()
    previous = signal.signal(signal.SIGTERM, stop)
    stopped: SystemExit | None = None
    codes = [0]
    try:
        for k in range(n):
            env = {**os.environ, **gpu_env(args.device, k)}
            env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
            with open(args.out / f"shard{k}of{n}.log", "ab") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "experiments.fuzz", *child_argv(argv, k, n)],
                    stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                ))  # fmt: skip
        codes = [p.wait() for p in procs]
    except SystemExit as e:  # stopped (a time limit): the shards' records so far are merged
        stopped = e
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait()
        signal.signal(signal.SIGTERM, previous)  # a caller in the same process keeps its own
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    merge(args.out, n, config, time.perf_counter() - t0)
    if stopped is not None:
        raise stopped
    return max(codes)


def merge(out: Path, n: int, config: dict, seconds: float = 0.0) -> dict:
    """The records of ``out``'s ``n`` shards as one summary, written to ``out/summary.json``."""
    records = []
    for k in range(n):
        for r in read_jsonl(out / f"shard{k}of{n}" / "graphs.jsonl"):
            for f in r.get("failures", ()):
                if f.get("repro"):
                    f["repro"] = f"shard{k}of{n}/{f['repro']}"
            records.append(r)
    records.sort(key=lambda r: r["graph"])
    summary = summarize(records, config, seconds or 1.0, len(records) if seconds else 0)
    write_summary(out / "summary.json", summary)
    return summary
