"""The untuned (greedy) plan of each workload timed with whichever ``autofuse`` is importable, so
two source trees can be compared on one card: run it once per tree, each in its own process,
with the same workloads (taken from this tree's ``experiments``) and the same timer.

    git archive <old commit> autofuse | tar -x -C old/
    PYTHONPATH=old:$PWD python -m experiments.probes.plan_ab --arm old --out $OUT/ab_old.json
    python -m experiments.probes.plan_ab --arm new --out $OUT/ab_new.json

Workloads: ``--sets suite,models`` (the public suite and the model-style functions, bf16) and
``--kb DIR --problems 2,6`` (KernelBench level 2, fp32, TF32 off for cuBLAS and on for cuDNN as
torch's defaults, the same in every arm). Each record holds eager's time (the drift anchor
between the two processes), the plan's time, the plan's build seconds and its largest error
against eager; the file is rewritten after each workload, so a killed run keeps what it did.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch


def bench_timer(fn: Callable[[], object], reps: int = 7) -> float:
    """Median µs of ``fn``: CUDA's ``triton.testing.do_bench`` (L2 flushed) on a GPU, else wall
    time of ``reps`` calls (the CPU path only shows the tool runs)."""
    if torch.cuda.is_available():
        import triton.testing

        return 1e3 * triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times)


def suite_cases(names: list[str], device: str) -> list[tuple[str, Callable, Callable[[], tuple]]]:
    """(name, fn, inputs factory) for the public suite and / or the model-style functions."""
    from experiments.bench.model_functions import MODEL_FUNCTIONS
    from experiments.bench.workloads import SUITE

    sets = {"suite": SUITE, "models": MODEL_FUNCTIONS}
    unknown = set(names) - set(sets)
    if unknown:
        raise ValueError(f"--sets: unknown {sorted(unknown)} (known: {sorted(sets)})")
    return [
        (f"{s}:{w.name}", w.fn, lambda w=w: w.inputs(device=device, dtype=torch.bfloat16))
        for s in names
        for w in sets[s]
    ]


def kb_cases(kb_dir: str, problems: list[int], device: str) -> list[tuple]:
    """(name, module in eval mode, inputs factory) for KernelBench level-2 problems at their
    shipped shapes, fp32 (read by ``experiments/kernelbench/problems.py``)."""
    from experiments.kernelbench import problems as kb

    try:
        found = {p.number: p for p in kb.discover(kb_dir, 2, set(problems))}
    except FileNotFoundError:
        found = {}
    out = []
    for n in problems:
        if n not in found:
            raise ValueError(f"--problems: no level-2 problem {n} under {kb_dir}")
        mod, _ = kb.load_module(found[n], kb.BY_STAGE["shipped"])
        torch.manual_seed(0)
        model = mod.Model(*mod.get_init_inputs()).to(device).eval()
        out.append((f"L2_{n}", model, lambda mod=mod: tuple(kb.new_inputs(mod, 0, device=device))))
    return out


def max_error(got: object, want: object) -> float:
    """Largest absolute difference over the (possibly nested) outputs, as float32."""
    if torch.is_tensor(want):
        return float((got.float() - want.float()).abs().max()) if want.numel() else 0.0
    return max((max_error(g, w) for g, w in zip(got, want)), default=0.0)


def one_case(
    name: str,
    fn: Callable,
    make_inputs: Callable[[], tuple],
    cache_dir: str,
    timer: Callable = bench_timer,
) -> dict:
    """Eager's and the greedy plan's times for one workload, its build seconds and error."""
    import autofuse

    torch.manual_seed(0)
    inputs = make_inputs()
    with torch.no_grad():
        want = fn(*inputs)
        eager_us = timer(lambda: fn(*inputs))
        t0 = time.perf_counter()
        plan = autofuse.optimize(fn, inputs, cache_dir=cache_dir)
        build_s = time.perf_counter() - t0
        got = plan(*inputs)
        plan_us = timer(lambda: plan(*inputs))
    return {
        "workload": name,
        "eager_us": round(eager_us, 2),
        "plan_us": round(plan_us, 2),
        "build_s": round(build_s, 2),
        "max_abs_err": max_error(got, want),
    }


def _from_repo(path: Path) -> str:
    """``path`` relative to this checkout (``autofuse``, ``ab_old/autofuse``), not a local path."""
    root = Path(__file__).resolve().parents[2]
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return path.name


def stamp(arm: str) -> dict:
    import triton

    import autofuse

    cuda = torch.cuda.is_available()
    return {
        "arm": arm,
        "commit": os.environ.get("AUTOFUSE_COMMIT", "unknown"),
        "autofuse_from": _from_repo(Path(autofuse.__file__).parent),
        "gpu": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arm", required=True, help="a name for this source tree (old, new, ...)")
    p.add_argument("--out", required=True, help="the JSON record file")
    p.add_argument("--sets", default="", help="suite,models")
    p.add_argument("--kb", default="", help="KernelBench folder (holds level2/)")
    p.add_argument("--problems", default="", help="level-2 problem numbers, comma-separated")
    p.add_argument("--deadline", type=float, default=1e9, help="seconds; no new workload after")
    a = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cases = suite_cases([s for s in a.sets.split(",") if s], device)
    if a.problems:
        cases += kb_cases(a.kb, [int(n) for n in a.problems.split(",")], device)
    record = {"stamp": stamp(a.arm), "records": []}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as cache_dir:
        for name, fn, make in cases:
            if time.monotonic() - t0 > a.deadline:
                break
            try:
                rec = one_case(name, fn, make, cache_dir)
            except Exception as e:  # one workload's failure is a record, not the run's end
                rec = {
                    "workload": name,
                    "error": f"{type(e).__name__}: {e}",
                    "trace": traceback.format_exc(limit=4),
                }
            record["records"].append(rec)
            print(json.dumps(rec)[:200], flush=True)
            Path(a.out).write_text(json.dumps(record, indent=1))
    return record


if __name__ == "__main__":
    main()
