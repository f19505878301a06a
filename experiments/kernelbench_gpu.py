"""The GPU mode of the KernelBench runner: one problem at its own shapes, timed.

Eager, ``torch.compile`` default and ``mode="max-autotune-no-cudagraphs"``, the autofuse greedy
plan (``optimize(model, inputs)``) and the tuned one (``optimize(..., trials=T,
time_budget=S)``) are built first, then judged by KernelBench's rule (``allclose`` with
atol = rtol = ``tol`` against eager on ``correct_trials`` input draws, the first the timing
inputs), then timed together in interleaved rounds (the order reversed every other round, min
of rounds; each time ``do_bench`` with its L2 flush, under ``no_grad`` as the benchmark times).
The record is an ``autofuse report`` workload record (``times_us``, ``floor_us``, ``kernels``).

The floor: the problem's minimum bytes (inputs, parameters and buffers read once, outputs
written once) at the measured copy bandwidth, or its FLOPs (``torch.utils.flop_counter``) at the
measured bf16 matmul rate, whichever is longer (for float32 a bound below the real one).

Timer, compiler and optimizer are arguments so the path runs on a CPU with fakes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from experiments.kernelbench_check import compare, eager_steps, first_line, flat, no_dropout
from experiments.kernelbench_problems import (
    BY_STAGE,
    Problem,
    instantiate,
    load_module,
    new_inputs,
)

MODES = ("default", "max-autotune-no-cudagraphs")
COMPILE = tuple(f"torch.compile {m}" for m in MODES)
VARIANTS = ("eager", *COMPILE, "autofuse greedy", "autofuse tuned")
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


@dataclass(frozen=True)
class GpuOptions:
    trials: int = 20
    budget_s: float = 30.0
    rounds: int = 3
    dtype: str = "fp32"
    correct_trials: int = 3
    tol: float = 1e-2
    cache_dir: str | None = None
    stage: str = "shipped"  # the problem's own shapes; a reduced stage for tests


def default_timer(label: str, fn: Callable, args: list) -> float:
    """Seconds per call (``do_bench``: median, L2 flushed between calls)."""
    from autofuse.tune.roofline import seconds

    return seconds(fn, args, rep_ms=100)


def default_compile(model: Any, mode: str) -> Any:
    import torch

    return torch.compile(model, mode=None if mode == "default" else mode)


def default_optimize(model: Any, inputs: list, **options: Any) -> Any:
    import autofuse

    return autofuse.optimize(model, inputs, **options)


def build(model, inputs, opts: GpuOptions, compile_fn, optimize_fn) -> tuple[list, dict, dict]:
    """(name, callable) per variant that built, the errors of those that did not, seconds."""
    import torch

    order: list[tuple[str, Any]] = [("eager", model)]
    errors: dict[str, str] = {}
    build_s: dict[str, float] = {}
    torch._dynamo.reset()
    tuned_opts = {"trials": opts.trials, "time_budget": opts.budget_s, "progress": False}
    if opts.cache_dir:
        tuned_opts["cache_dir"] = opts.cache_dir
    makers = [(label, lambda m=mode: compile_fn(model, m)) for label, mode in zip(COMPILE, MODES)]
    makers += [("autofuse greedy", lambda: optimize_fn(model, inputs)),
               ("autofuse tuned", lambda: optimize_fn(model, inputs, **tuned_opts))]  # fmt: skip
    for label, make in makers:
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                fn = make()
                fn(*inputs)  # compiles (torch.compile is lazy)
            order.append((label, fn))
        except Exception as e:  # noqa: BLE001 - recorded; the other variants still run
            errors[label] = first_line(e)
        build_s[label] = time.perf_counter() - t0
    return order, errors, build_s


def judge(order, module, inputs, opts: GpuOptions, dtype, device) -> dict:
    """KernelBench's rule per variant: every draw's outputs allclose to eager's."""
    import torch

    eager = order[0][1]
    out: dict[str, dict] = {name: {"correct": True, "max_abs_err": 0.0} for name, _ in order[1:]}
    for trial in range(opts.correct_trials):
        xs = inputs if trial == 0 else new_inputs(module, 1000 + trial, dtype, device)
        with torch.no_grad():
            ref = eager(*xs)
            for name, fn in order[1:]:
                try:
                    c = compare(fn(*xs), ref, opts.tol)
                except Exception as e:  # noqa: BLE001 - a variant that fails a draw is wrong
                    c = {"correct": False, "why": first_line(e)}
                rec = out[name]
                rec["correct"] = rec["correct"] and c["correct"]
                rec["max_abs_err"] = max(rec["max_abs_err"], c.get("max_abs_err", math.inf))
                if "why" in c:
                    rec.setdefault("why", c["why"])
    return out


def interleaved(order, inputs, rounds: int, timer) -> dict[str, list[float]]:
    """Every variant timed once per round; odd rounds in reverse order (none always hottest)."""
    import torch

    times: dict[str, list[float]] = {name: [] for name, _ in order}
    with torch.no_grad():
        for r in range(rounds):
            for name, fn in order if r % 2 == 0 else order[::-1]:
                times[name].append(timer(name, fn, inputs))
    return times


def floor_of(model, inputs, outputs, ceil: dict) -> dict:
    """Minimum bytes, FLOPs and the floor in µs (see the module docstring)."""
    import torch

    from autofuse.tune.roofline import floor_s, min_bytes

    state = [*model.parameters(), *model.buffers()]
    nbytes = min_bytes([*inputs, *state], outputs)
    flops = 0.0
    try:
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as fc, torch.no_grad():
            model(*inputs)
        flops = float(fc.get_total_flops())
    except Exception:  # noqa: BLE001 - no FLOP count: the memory floor alone
        flops = 0.0
    return {"min_bytes": nbytes, "flops": flops, "floor_us": floor_s(nbytes, flops, ceil) * 1e6}


def time_problem(problem: Problem, opts: GpuOptions, ceil: dict, device: str = "cuda",
                 timer=default_timer, compile_fn=default_compile,
                 optimize_fn=default_optimize) -> dict:  # fmt: skip
    """The GPU record of one problem (an ``autofuse report`` workload record)."""
    import torch

    from autofuse.tune.roofline import stamp

    dtype = getattr(torch, DTYPES[opts.dtype])
    module, changed = load_module(problem, BY_STAGE[opts.stage])
    model, inputs = instantiate(module, 0, dtype, device)
    no_dropout(model)  # random masks cannot match eager's
    with torch.no_grad():
        outputs = flat(model(*inputs))
    order, errors, build_s = build(model, inputs, opts, compile_fn, optimize_fn)
    checks = judge(order, module, inputs, opts, dtype, device)
    rounds = interleaved(order, inputs, opts.rounds, timer)
    times = {name: {"us": min(ts) * 1e6, "source": "measured"} for name, ts in rounds.items()}
    for name in VARIANTS:
        if name not in times:
            times[name] = {"us": None, "source": f"failed: {errors.get(name, 'not built')}"}
    rec: dict[str, Any] = {"workload": problem.key, "complete": True, "mode": "gpu",
                           "level": problem.level, "number": problem.number,
                           "problem": problem.name, "dtype": opts.dtype, **stamp(),
                           "shapes_changed": changed, "times_us": times,
                           "tuned_source": "measured", "errors": errors, "build_s": build_s,
                           "correct": {k: v["correct"] for k, v in checks.items()},
                           "checks": checks, "tolerance": opts.tol,
                           "interleaved_rounds_us": {k: [t * 1e6 for t in v]
                                                     for k, v in rounds.items()}}  # fmt: skip
    rec.update(floor_of(model, inputs, outputs, ceil))
    rec["ceilings"] = ceil
    tuned = dict(order).get("autofuse tuned")
    rec.update(plan_fields(tuned))
    rec["tuning_s"] = build_s.get("autofuse tuned")
    rec.update(verdicts(rec))
    tuned_us = times["autofuse tuned"]["us"]
    rec["fraction_of_floor"] = rec["floor_us"] / tuned_us if tuned_us else None
    return rec


def plan_fields(tuned: Any) -> dict:
    """The tuned plan's kernels (``autofuse report``'s partition) and its eager steps."""
    from autofuse.report import summarize

    plan = getattr(tuned, "plan", None)
    if plan is None:
        return {"kernels": [], "eager_ops": {}, "trials": None}
    tuning = getattr(tuned, "tuning", None)
    rows = summarize(plan, getattr(tuning, "kernel_times", None)).rows
    return {
        "kernels": [{"kernel": r.name, "kind": r.kind, "ops": list(r.ops), "config": r.config,
                     "time_us": None if r.time_s is None else r.time_s * 1e6,
                     "source": r.time_source} for r in rows],
        "eager_ops": dict(sorted(eager_steps(plan).items())),
        "trials": getattr(tuning, "trials", None),
    }  # fmt: skip


def verdicts(rec: dict) -> dict:
    """fast_1 (tuned correct and faster than eager), the better compile mode, the speedups."""
    t = {k: v["us"] for k, v in rec["times_us"].items()}
    ok = rec["correct"]
    compiles = [(t[c], c) for c in COMPILE if t.get(c) and ok.get(c, False)]
    best_us, best = min(compiles) if compiles else (None, None)
    tuned = t.get("autofuse tuned")
    tuned_ok = bool(ok.get("autofuse tuned")) and tuned is not None
    return {
        "best_compile": best,
        "tuned_correct": tuned_ok,
        "fast_1": tuned_ok and t.get("eager") is not None and tuned < t["eager"],
        "speedup_vs_eager": t["eager"] / tuned if tuned_ok and t.get("eager") else None,
        "speedup_vs_best_compile": best_us / tuned if tuned_ok and best_us else None,
        "faster_than_best_compile": bool(tuned_ok and best_us and tuned < best_us),
    }
