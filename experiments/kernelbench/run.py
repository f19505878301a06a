"""KernelBench through autofuse: correctness at reduced shapes on a CPU, times at the problems'
own shapes on a GPU.

    python -m experiments.kernelbench [DIR] --level N [--problems 1-20,33] [--mode cpu|gpu]
        [--dtype fp32|bf16] [--out DIR] [--timeout S] [--trials T] [--budget S] [--resume]
        [--variants eager,default,max-autotune,greedy,greedy-library-bias,greedy-own-conv,
         greedy-default-configs,tuned]
        [--records FILE] [--deadline S]

DIR is a KernelBench folder (``KernelBench/level<N>/<n>_<name>.py``; default
``$KERNELBENCH_DIR``, else ``../shared/kernelbench`` beside the project where it exists). Every problem is loaded by path
and run in a child process bounded by ``--timeout`` seconds (a problem that runs over is recorded
as ``timeout`` and the run goes on). Each writes ``<run>/<L>_<n>_<name>.json``; the run folder
(``<out>/L<N>_<mode>_<dtype>``) also holds ``run.json`` (commit, device, torch, triton; on a GPU
the measured ceilings) and ``summary.md``.

- ``--mode cpu`` (``check.py``): shapes reduced by the rule in ``problems.py``
  (batch 2, spatial <= 12, other sizes <= 16, looser stages where the problem's shapes are
  coupled); ``autofuse.optimize`` and ``torch.compile(backend="autofuse")`` against eager
  (level 3 also a training step); kernels, eager steps by op, failures by their first line.
- ``--mode gpu`` (``gpu.py``): the shipped shapes in ``--dtype``; eager, both
  torch.compile modes, autofuse greedy and tuned (``--trials``, ``--budget`` seconds per
  problem) in interleaved rounds; KernelBench's correctness rule (``--tol``, 1e-2); the roofline
  floor. ``--variants`` picks the variants (eager always): ``greedy-library-bias`` adds the
  greedy plan with each convolution's bias in the library call beside the peeled one,
  ``greedy-own-conv`` the greedy plan with every convolution the convolution kind takes in
  autofuse's own kernel (``AUTOFUSE_CONV_KERNEL=kernel``) beside cuDNN's,
  ``greedy-default-configs`` the greedy plan at the kinds' default launch configs
  (``AUTOFUSE_TIME_CONFIGS=0``) beside the one whose configs were timed,
  ``--variants greedy,greedy-library-bias,default`` skips max-autotune and tuning. The records
  hold the cuDNN version and the precision (TF32) flags, the same in every arm.
  ``python -m autofuse report <run>`` reads the folder.

The per-level summary: fraction correct and fully fused (no eager step besides library
convolutions, matmuls, RNNs and SDPA); on a GPU ``fast_1`` (correct and faster than eager), the
fraction faster than the better torch.compile mode and the geomean speedup over it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

from experiments.kernelbench.problems import Problem, discover, parse_numbers
from experiments.kernelbench.worker import Worker, serve

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DIR = ROOT.parent / "shared" / "kernelbench"


def default_dir() -> Path | None:
    """``$KERNELBENCH_DIR``, else ``../shared/kernelbench`` beside the project, if present."""
    env = os.environ.get("KERNELBENCH_DIR")
    for cand in ([Path(env)] if env else []) + [DEFAULT_DIR]:
        if cand.is_dir():
            return cand
    return None


def run_folder(out: str | Path, level: int, mode: str, dtype: str, phase: str = "as-made") -> Path:
    tail = "" if phase == "as-made" else f"_{phase}"
    return Path(out) / f"L{level}_{mode}_{dtype}{tail}"


def worker_cmd(a: argparse.Namespace, folder: Path) -> list[str]:
    """The child that runs this run's problems (``worker.py``)."""
    return [sys.executable, "-m", "experiments.kernelbench", str(a.dir), "--level", str(a.level),
            "--mode", a.mode, "--dtype", a.dtype, "--worker", "--run-dir", str(folder),
            "--trials", str(a.trials), "--budget", str(a.budget), "--rounds", str(a.rounds),
            "--correct-trials", str(a.correct_trials), "--tol", str(a.tol),
            *(["--problems", a.problems] if a.problems else []),
            *(["--variants", a.variants] if a.variants else []),
            "--phase", a.phase, *(["--train"] if a.train else [])]  # fmt: skip


def run_child(a: argparse.Namespace, problem: Problem, folder: Path, worker: Worker) -> dict:
    """One problem in the worker process, bounded by ``--timeout``; its record (a time-out or a
    crash recorded as such)."""
    from autofuse.tune.runfiles import read_json, write_json

    path = folder / f"{problem.key}.json"
    if path.exists():
        path.unlink()  # a record left by an earlier run must not pass for this one's
    t0 = time.perf_counter()
    status, log = worker.run(problem.number, a.timeout)
    rec = read_json(path)
    if rec is None or status == "timeout":
        rec = base_record(problem, a.mode, a.dtype)
        error = f"timeout ({a.timeout:g} s)" if status == "timeout" else last_line(log)
        rec.update({"status": status or "crash", "correct": False, "error": error,
                    "log_tail": log[-2000:]})  # fmt: skip
    rec["wall_s"] = time.perf_counter() - t0
    write_json(path, rec)
    return rec


def last_line(log: str | None) -> str:
    lines = [x for x in (log or "").splitlines() if x.strip()]
    return lines[-1][:300] if lines else "no output"


def base_record(problem: Problem, mode: str, dtype: str) -> dict:
    from autofuse.tune.roofline import stamp

    return {"workload": problem.key, "complete": True, "mode": mode, "dtype": dtype,
            "level": problem.level, "number": problem.number, "problem": problem.name,
            "path": problem.path.name, **stamp()}  # fmt: skip


def run_one(a: argparse.Namespace, problem: Problem, folder: Path) -> dict:
    """The child's work: one problem's record, written to the run folder."""
    from autofuse.tune.runfiles import read_json, write_json

    rec = base_record(problem, a.mode, a.dtype)
    try:
        if a.mode == "cpu":
            from experiments.kernelbench.check import check_problem

            rec.update(check_problem(problem, train=True if a.train else None))
        else:
            from experiments.kernelbench.gpu import GpuOptions, parse_variants, time_problem

            opts = GpuOptions(trials=a.trials, budget_s=a.budget, rounds=a.rounds, dtype=a.dtype,
                              correct_trials=a.correct_trials, tol=a.tol,
                              variants=parse_variants(a.variants), phase=a.phase)  # fmt: skip
            ceil = (read_json(folder / "run.json") or {}).get("ceilings") or {}
            rec.update(time_problem(problem, opts, ceil))
            rec["status"] = "ok" if rec["tuned_correct"] else "wrong"
    except Exception as e:  # noqa: BLE001 - the record says why
        rec.update({"status": "error", "correct": False, "error": first_line_of(e),
                    "traceback": traceback.format_exc()[-3000:]})  # fmt: skip
    write_json(folder / f"{problem.key}.json", rec)
    return rec


def first_line_of(e: BaseException) -> str:
    from experiments.kernelbench.check import first_line

    return first_line(e)


def start_run(a: argparse.Namespace, folder: Path) -> None:
    """``run.json``: provenance, the command, and on a GPU the measured ceilings."""
    from autofuse.tune.roofline import stamp
    from autofuse.tune.runfiles import read_json, write_json

    folder.mkdir(parents=True, exist_ok=True)
    doc = read_json(folder / "run.json") or {"stamp": stamp(), "runs": []}
    if a.mode == "gpu" and "ceilings" not in doc:
        from autofuse.tune.roofline import ceilings

        doc["ceilings"] = ceilings()
    doc["runs"].append({"argv": sys.argv[1:], "started": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                       time.gmtime())})  # fmt: skip
    write_json(folder / "run.json", doc)


def write_records(folder: Path, path: Path) -> None:
    """Every record of the run folder, and its ``run.json``, in one JSON file (rewritten after
    each problem, so a run stopped at any point leaves one file with everything done so far)."""
    from autofuse.tune.runfiles import read_json, write_json

    recs = [read_json(f) for f in sorted(folder.glob("L*.json"))]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"run": read_json(folder / "run.json"), "records": [r for r in recs if r]})


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.mode == "cpu":
        # kernels run in Triton's interpreter (set before triton loads), their pointwise blocks
        # up to 16384 elements there (autofuse/settings.py: AUTOFUSE_INTERPRETER_BLOCK)
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("AUTOFUSE_INTERPRETER_BLOCK", "16384")
    wanted = parse_numbers(a.problems)
    problems = discover(a.dir, a.level, wanted)
    if a.worker:
        by_number = {p.number: p for p in problems}
        serve(lambda n: "traceback" not in run_one(a, by_number[n], Path(a.run_dir)))
        return 0
    if not problems:
        raise SystemExit(f"kernelbench: no level-{a.level} problem matches {a.problems!r}")
    folder = run_folder(a.out, a.level, a.mode, a.dtype, a.phase)
    start_run(a, folder)
    from experiments.kernelbench.summary import line, write_summary

    worker = Worker(worker_cmd(a, folder))
    began = time.monotonic()
    try:
        for problem in problems:
            if a.resume and (folder / f"{problem.key}.json").is_file():
                continue
            if a.deadline and time.monotonic() - began > a.deadline:
                print(f"kernelbench: --deadline {a.deadline:g} s passed; stopping before "
                      f"{problem.key} (--resume goes on)", flush=True)  # fmt: skip
                break
            rec = (
                run_child(a, problem, folder, worker) if a.timeout else run_one(a, problem, folder)
            )
            print(line(rec), flush=True)
            if a.records:
                write_records(folder, Path(a.records))
    finally:
        worker.stop()
    md = write_summary([folder], folder / "summary.md")
    print(md.read_text(), flush=True)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.kernelbench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("dir", nargs="?", default=None, help="a KernelBench folder")
    p.add_argument("--level", type=int, required=True, choices=(1, 2, 3))
    p.add_argument("--problems", default="", help="numbers and ranges, e.g. 1-20,33 (all)")
    p.add_argument("--mode", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                   help="gpu mode: the problems' dtype (fp32 as shipped)")  # fmt: skip
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "results" / "kernelbench"))
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds per problem (default 300 cpu, 900 gpu; 0: in this process)")  # fmt: skip
    p.add_argument("--trials", type=int, default=20, help="gpu: tuned trials per problem")
    p.add_argument("--budget", type=float, default=30.0, help="gpu: tuning seconds per problem")
    p.add_argument("--rounds", type=int, default=3, help="gpu: interleaved timing rounds")
    p.add_argument("--correct-trials", type=int, default=3, help="gpu: input draws checked")
    p.add_argument("--tol", type=float, default=1e-2, help="gpu: atol = rtol (KernelBench)")
    p.add_argument("--variants", default="",
                   help="gpu: comma-separated, of eager, default, max-autotune, greedy, "
                   "greedy-library-bias, greedy-own-conv, greedy-default-configs, tuned "
                   "(default: all but the three greedy-* arms)")  # fmt: skip
    p.add_argument("--train", action="store_true", help="cpu: a training step (level 3 always)")
    p.add_argument(
        "--phase",
        choices=("as-made", "eval", "train"),
        default="as-made",
        help="gpu: the module as made (training mode, forward), eval (inference) or "
        "a training step (forward and backward, autofuse as the backend)",
    )
    p.add_argument("--resume", action="store_true", help="skip problems with a record")
    p.add_argument(
        "--records",
        default="",
        help="one JSON file holding every record, rewritten after each problem",
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=0.0,
        help="seconds: start no new problem after this long (0: no limit)",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", default="", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.dir = Path(a.dir) if a.dir else default_dir()
    if a.dir is None:
        p.error(f"give a KernelBench folder (none at {DEFAULT_DIR})")
    if a.timeout is None:
        a.timeout = 300.0 if a.mode == "cpu" else 900.0
    if a.mode == "cpu" and a.dtype != "fp32":
        p.error("--dtype applies to --mode gpu (the CPU check runs float32)")
    if a.variants:
        from experiments.kernelbench.gpu import parse_variants

        if a.mode == "cpu":
            p.error("--variants applies to --mode gpu")
        try:
            parse_variants(a.variants)
        except ValueError as e:
            p.error(f"--variants: {e}")
    return a
