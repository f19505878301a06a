"""The fuzz run: random programs through ``autofuse.optimize`` and ``torch.compile(...,
backend="autofuse")`` against eager, failures shrunk to standalone reproductions.

    python -m experiments.fuzz --graphs 200 --seed 0 --out results/fuzz/run0 --backward
    python -m experiments.fuzz --graphs 10000 --seed 1 --out /tmp/fz --shard 2/8
    python -m experiments.fuzz --graphs 200 --seed 0 --out results/fuzz/run0 --resume
    python -m experiments.fuzz --graphs 1000 --seed 3 --out /tmp/fzgpu --device cuda --jobs 4

Graph ``i`` of seed ``S`` is generated from ``S * 1_000_000 + i``: any graph can be generated
again alone. With ``--shard i/n`` the run takes every ``n``-th graph from the ``i``-th and
records under ``<out>/shard<i>of<n>``; ``--jobs n`` runs the ``n`` shards at once
(``jobs.py``) and merges their records. Each program is checked in a child process
(``worker.py``) on ``--device``: ``cpu`` through Triton's interpreter with
``AUTOFUSE_CHECK_BOUNDS=1``; ``cuda`` with real kernels, inputs drawn on the CPU and moved, eager
on the GPU the reference, the bounds mode (guarded debug kernels) only with ``--check-bounds``.
TF32 is off in every arm unless ``--tf32``. A failure is shrunk (at most
``--shrinks-per-class`` of each kind) and written to ``<out>/repros/``.
"""

from __future__ import annotations

import argparse
import collections
import re
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from experiments.correctness.opinfo_sweep import parse_shard
from experiments.fuzz.compare import COMPILERS, Verdict
from experiments.fuzz.generate import generate, op_labels
from experiments.fuzz.jobs import run_jobs, stop
from experiments.fuzz.program import Program, without_dead
from experiments.fuzz.record import (
    append_jsonl,
    failure_kind,
    read_jsonl,
    summarize,
    write_summary,
)
from experiments.fuzz.repro import Target, write_repro
from experiments.fuzz.shrink import shrink
from experiments.fuzz.worker import Worker


def worker_env(args: argparse.Namespace) -> dict[str, str]:
    """The checking process's environment: Triton's interpreter for the CPU only, the bounds
    mode as ``--check-bounds`` says."""
    return {
        "TRITON_INTERPRET": "1" if args.device == "cpu" else "0",
        "AUTOFUSE_CHECK_BOUNDS": "1" if args.check_bounds else "0",
    }


def target(args: argparse.Namespace) -> Target:
    return Target(args.device, args.check_bounds, args.tf32)


def graph_seed(seed: int, i: int) -> int:
    return seed * 1_000_000 + i


def labels(p: Program) -> list[str]:
    return sorted({n for op in p.ops for n in op_labels(op.template)})


class Run:
    """One fuzz run's state: its worker, its output folder, the failures shrunk so far."""

    def __init__(self, args: argparse.Namespace, folder: Path) -> None:
        self.args = args
        self.folder = folder
        self.worker = Worker(folder / "worker.log", worker_env(args), args.device, args.tf32)
        self.shrunk: collections.Counter = collections.Counter()

    def graph(self, i: int) -> dict:
        seed = graph_seed(self.args.seed, i)
        p, rejected = generate(seed, self.args.max_ops, self.args.siblings)
        rec = {"graph": i, "seed": seed, "forms": p.forms(), "ops": labels(p),
               "n_ops": len(p.ops), "rejected_draws": rejected, "eager_rejected": None,
               "verdicts": [], "failures": []}  # fmt: skip
        t0 = time.perf_counter()
        for backward in (False, True)[: 1 + self.args.backward]:
            for fe in self.args.front_ends:
                res = self.worker.check(p, backward, fe, self.args.timeout)
                if res["eager_rejected"] and backward and rec["verdicts"]:
                    rec["backward_eager_rejected"] = res["eager_rejected"]  # forward kept
                    break
                if res["eager_rejected"]:
                    rec.update(eager_rejected=res["eager_rejected"], verdicts=[], failures=[])
                    return rec
                v = Verdict(**res["verdict"])
                rec["verdicts"].append(asdict(v))
                if v.status != "pass":
                    rec["failures"].append(self.failure(i, seed, p, v, rec["failures"]))
        rec["seconds"] = round(time.perf_counter() - t0, 2)
        if rec["failures"]:
            rec["program"] = p.to_json()
        return rec

    def failure(self, i: int, seed: int, p: Program, v: Verdict, earlier: list[dict]) -> dict:
        """The failure's record; shrunk and written as a reproduction unless a failure of the
        same kind was shrunk often enough (or this graph's other front end failed alike)."""
        f = {"graph": i, "seed": seed, **{k: getattr(v, k) for k in
             ("front_end", "mode", "status", "phase", "error", "detail")}}  # fmt: skip
        kind = failure_kind(f)
        alike = [e for e in earlier if failure_kind(e) == kind]
        if alike and alike[0].get("repro"):
            return {
                **f,
                **{k: alike[0][k] for k in ("repro", "min_ops", "min_size", "min_program")},
            }
        small, last = without_dead(p), v  # unshrunk: what no output reads left out
        if v.status != "timeout" and self.shrunk[kind] < self.args.shrinks_per_class:
            self.shrunk[kind] += 1
            small, last, f["shrunk"] = self.shrink(p, v)
        name = f"g{i:06d}_{v.front_end}_{v.mode}_{v.status}.py"
        path = write_repro(self.folder / "repros" / name, small, last,
                           f"graph {i} of seed {self.args.seed} (program seed {seed})",
                           target(self.args))  # fmt: skip
        f.update(repro=str(path.relative_to(self.folder)), min_ops=labels(small),
                 min_size=len(small.ops), min_program=small.to_json())  # fmt: skip
        return f

    def shrink(self, p: Program, v: Verdict) -> tuple[Program, Verdict, dict]:
        last = [v]

        def fails(c: Program) -> bool:
            res = self.worker.check(c, v.mode == "backward", v.front_end, self.args.timeout)
            got = Verdict(**res["verdict"]) if res["verdict"] else None
            if got is not None and got.signature() == v.signature():
                last[0] = got
                return True
            return False

        s = shrink(p, fails, self.args.shrink_budget, self.args.shrink_checks)
        info = {k: getattr(s, k) for k in ("checks", "accepted", "seconds", "complete")}
        return s.program, last[0], info


def _front_ends(text: str) -> list[str]:
    names = [t for t in text.split(",") if t]
    bad = [n for n in names if n not in COMPILERS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"--front-ends {text!r}: unknown {', '.join(bad) or '(none given)'} "
            f"(known: {', '.join(COMPILERS)})"
        )
    return names


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m experiments.fuzz", description=__doc__.split("\n")[0]
    )
    p.add_argument("--graphs", type=int, required=True, help="graphs of the run (all shards)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="folder of the run's record")
    p.add_argument("--backward", action="store_true", help="also gradients (a second check)")
    p.add_argument("--front-ends", type=_front_ends, default=list(COMPILERS))
    p.add_argument("--shard", type=parse_shard, default=(0, 1), help="i/n: every n-th graph from i")
    p.add_argument("--resume", action="store_true", help="continue the run recorded in --out")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per check")
    p.add_argument("--max-ops", type=int, default=7, help="ops per program at most")
    p.add_argument("--siblings", type=float, default=0.0,
                   help="probability of a sibling view as the last op (see generate.add_sibling)")  # fmt: skip
    p.add_argument(
        "--device",
        type=_device,
        default="cpu",
        help="cpu (Triton's interpreter) or cuda / cuda:i (real kernels)",
    )
    p.add_argument(
        "--tf32",
        action="store_true",
        help="TF32 on for eager's float32 matmuls (off in every arm by default)",
    )
    p.add_argument(
        "--check-bounds",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="AUTOFUSE_CHECK_BOUNDS for the checks (default: on for cpu; off for "
        "cuda, where it builds guarded debug kernels)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="run the graphs as this many shards at once, records merged",
    )
    p.add_argument("--shrinks-per-class", type=int, default=3)
    p.add_argument("--shrink-budget", type=float, default=300.0, help="seconds per shrink")
    p.add_argument("--shrink-checks", type=int, default=300, help="checks per shrink")
    args = p.parse_args(argv)
    for name in ("graphs", "max_ops", "timeout", "jobs"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.jobs > 1 and args.shard != (0, 1):
        p.error("--jobs runs the shards itself: give --jobs or --shard, not both")
    if args.check_bounds is None:
        args.check_bounds = args.device == "cpu"
    return args


def _device(text: str) -> str:
    if text == "cpu" or re.fullmatch(r"cuda(:\d+)?", text):
        return text
    raise argparse.ArgumentTypeError(f"--device {text!r}: cpu, cuda or cuda:i")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device != "cpu" and not torch.cuda.is_available():
        sys.exit(f"--device {args.device}: no CUDA device here")
    if args.jobs > 1:
        return run_jobs(args, list(sys.argv[1:] if argv is None else argv))
    i0, n = args.shard
    folder = args.out / f"shard{i0}of{n}" if n > 1 else args.out
    log = folder / "graphs.jsonl"
    records = read_jsonl(log)
    if records and not args.resume:
        sys.exit(f"--out {args.out}: holds a run already ({log}); pass --resume or another --out")
    folder.mkdir(parents=True, exist_ok=True)
    done = {r["graph"] for r in records}
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    run, t0, now = Run(args, folder), time.perf_counter(), 0
    previous = signal.signal(signal.SIGTERM, stop)  # a killed run still ends its child
    try:
        for i in range(i0, args.graphs, n):
            if i in done:
                continue
            rec = run.graph(i)
            records.append(rec)
            append_jsonl(log, rec)
            now += 1
            summary = summarize(records, config, time.perf_counter() - t0, now)
            write_summary(folder / "summary.json", summary)
            bad = [f"{f['front_end']}/{f['mode']}: {f['status']} {f['error']}"
                   for f in rec["failures"]]  # fmt: skip
            print(f"graph {i}: {'eager rejected' if rec['eager_rejected'] else bad or 'pass'}",
                  flush=True)  # fmt: skip
    finally:
        run.worker.close()
        signal.signal(signal.SIGTERM, previous)  # a caller in the same process keeps its own
    write_summary(
        folder / "summary.json", summarize(records, config, time.perf_counter() - t0, now)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
