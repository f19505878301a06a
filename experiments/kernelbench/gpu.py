"""The GPU mode of the KernelBench runner: one problem at its own shapes, timed.

Eager, ``torch.compile`` default and ``mode="max-autotune-no-cudagraphs"``, the autofuse greedy
plan (``optimize(model, inputs)``) and the tuned one (``optimize(..., trials=T,
time_budget=S)``), and where asked (``GpuOptions.variants``, ``--variants``) the greedy plan with
each convolution's bias kept in the library call (``AUTOFUSE_CONV_BIAS=library`` while it is
built, judged and timed: the other arm of the peeled bias) and the greedy plan with every
convolution the convolution kind takes in autofuse's own kernel (``AUTOFUSE_CONV_KERNEL=kernel``:
the kernel against cuDNN, ``own_conv_speedup``) and the greedy plan at the kinds' default
configs (``AUTOFUSE_TIME_CONFIGS=0``: ``timed_configs_speedup``) are built first, then judged by KernelBench's rule (``allclose`` with
atol = rtol = ``tol`` against eager on ``correct_trials`` input draws, the first the timing
inputs), then timed together in interleaved rounds (the order reversed every other round, min
of rounds; each time ``do_bench`` with its L2 flush, under ``no_grad`` as the benchmark times).
The record is an ``autofuse report`` workload record (``times_us``, ``floor_us``, ``kernels``);
the verdicts (``fast_1``, ``speedup_vs_best_compile``, ...) are the tuned plan's, or the greedy
one's where tuning is not asked (``headline`` says which). It holds the cuDNN version and the
precision flags (TF32 for cuBLAS and cuDNN, the float32 matmul precision): read before the first
variant is built and checked after every build, check and timing; a variant that changed them
is named in ``precision_changed`` and the flags are put back, so every arm runs under the same.

The floor: the problem's minimum bytes (inputs, parameters and buffers read once, outputs
written once) at the measured copy bandwidth, or its FLOPs (``torch.utils.flop_counter``) at the
measured bf16 matmul rate, whichever is longer (for float32 a bound below the real one).

Timer, compiler and optimizer are arguments so the path runs on a CPU with fakes.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from experiments.kernelbench.check import (
    compare,
    eager_steps,
    first_line,
    flat,
    float64_outputs,
    in_float64,
    judged_by_float64,
    no_dropout,
)
from experiments.kernelbench.problems import (
    BY_STAGE,
    Problem,
    instantiate,
    load_module,
    new_inputs,
)

MODES = ("default", "max-autotune-no-cudagraphs")
COMPILE = tuple(f"torch.compile {m}" for m in MODES)
LIBRARY_BIAS = "autofuse greedy, conv bias in library"
OWN_CONV = "autofuse greedy, own conv kernel"
RULE_CONFIGS = "autofuse greedy, default configs"
VARIANTS = ("eager", *COMPILE, "autofuse greedy", LIBRARY_BIAS, OWN_CONV, RULE_CONFIGS,
            "autofuse tuned")  # fmt: skip
DEFAULT_VARIANTS = tuple(v for v in VARIANTS if v not in (LIBRARY_BIAS, OWN_CONV, RULE_CONFIGS))
SHORT_NAMES = dict(zip(("eager", "default", "max-autotune", "greedy", "greedy-library-bias",
                        "greedy-own-conv", "greedy-default-configs", "tuned"), VARIANTS))  # fmt: skip
# the settings an arm is built, judged and timed under (read again on entry and on exit)
ARM_SETTINGS = {
    LIBRARY_BIAS: ("AUTOFUSE_CONV_BIAS", "library"),
    OWN_CONV: ("AUTOFUSE_CONV_KERNEL", "kernel"),
    RULE_CONFIGS: ("AUTOFUSE_TIME_CONFIGS", "0"),
}
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def parse_variants(text: str) -> tuple[str, ...]:
    """``--variants`` (short names, comma-separated; empty: the default set) -> variant names in
    the runner's order, eager always among them (every check and speedup is against it)."""
    if not text.strip():
        return DEFAULT_VARIANTS
    names = {t.strip() for t in text.split(",") if t.strip()}
    unknown = sorted(names - set(SHORT_NAMES))
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; known: {', '.join(SHORT_NAMES)}")
    wanted = {SHORT_NAMES[n] for n in names} | {"eager"}
    return tuple(v for v in VARIANTS if v in wanted)


def headline(variants: tuple[str, ...]) -> str:
    """The autofuse variant the verdicts judge: tuned where asked, else greedy."""
    return "autofuse tuned" if "autofuse tuned" in variants else "autofuse greedy"


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
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    phase: str = "as-made"  # as-made (training mode, forward), eval (inference), train (a step)


PHASES = ("as-made", "eval", "train")


def grad_mode(opts: GpuOptions) -> Any:
    """Autograd on for a training step's variants, off for the forward phases."""
    import torch

    return torch.set_grad_enabled(opts.phase == "train")


def train_call(model: Any, fn: Callable, weights: list) -> Callable:
    """``fn``'s training step on ``model``: the forward, the backward of ``sum(out * w)``
    (``weights`` fixed), its outputs and every parameter's gradient (zeroed first)."""

    def call(*inputs: Any) -> list:
        model.zero_grad(set_to_none=True)
        out = fn(*inputs)
        sum(((o.to(w.dtype) * w).sum() for o, w in zip(flat(out), weights))).backward()
        return [*flat(out), *(p.grad for p in model.parameters() if p.grad is not None)]

    return call


def precision_flags() -> dict:
    """The settings that decide fp32 convolution and matmul precision on a GPU."""
    import torch

    return {
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "cudnn.deterministic": torch.backends.cudnn.deterministic,
    }


def library_versions() -> dict:
    """cuDNN's and CUDA's versions (None without them), beside ``stamp()``'s torch and triton."""
    import torch

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"cudnn": cudnn, "cuda": torch.version.cuda}


class PrecisionGuard:
    """The precision flags as they were at the start; :meth:`check` after each step of a
    variant records a variant that changed them and puts them back."""

    def __init__(self) -> None:
        self.start = precision_flags()
        self.changed: dict[str, dict] = {}

    def check(self, label: str) -> None:
        now = precision_flags()
        if now == self.start:
            return
        self.changed.setdefault(label, now)
        import torch

        torch.set_float32_matmul_precision(self.start["float32_matmul_precision"])
        torch.backends.cuda.matmul.allow_tf32 = self.start["cuda.matmul.allow_tf32"]
        for key in ("allow_tf32", "benchmark", "deterministic"):
            setattr(torch.backends.cudnn, key, self.start[f"cudnn.{key}"])


@contextmanager
def arm(label: str) -> Iterator[None]:
    """The settings a variant runs under (:data:`ARM_SETTINGS`: ``AUTOFUSE_CONV_BIAS=library``
    for the library-bias arm, ``AUTOFUSE_CONV_KERNEL=kernel`` for the own-convolution arm;
    read again on entry and on exit), nothing for the others."""
    if label not in ARM_SETTINGS:
        yield
        return
    from autofuse.settings import reload_settings

    name, value = ARM_SETTINGS[label]
    before = os.environ.get(name)
    os.environ[name] = value
    reload_settings()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
        reload_settings()


def default_timer(label: str, fn: Callable, args: list) -> float:
    """Seconds per call (``do_bench``: median, L2 flushed between calls)."""
    from autofuse.tune.roofline import seconds

    return seconds(fn, args, rep_ms=100)


def default_compile(model: Any, mode: str) -> Any:
    import torch

    return torch.compile(model, mode=None if mode == "default" else mode)


def backend_optimize(model: Any, inputs: list, **options: Any) -> Any:
    """autofuse through torch.compile (forward and backward graphs), ``options`` as the
    backend's."""
    import torch

    return torch.compile(model, backend="autofuse", options=options or None)


def default_optimize(model: Any, inputs: list, **options: Any) -> Any:
    import autofuse

    return autofuse.optimize(model, inputs, **options)


def build(model, inputs, opts: GpuOptions, compile_fn, optimize_fn,
          guard: PrecisionGuard | None = None, wrap: Callable | None = None,
          ) -> tuple[list, dict, dict]:  # fmt: skip
    """(name, callable) per variant that built, the errors of those that did not, seconds;
    ``wrap(fn)``: what each variant's callable becomes (a training step)."""
    import torch

    order: list[tuple[str, Any]] = [("eager", wrap(model) if wrap is not None else model)]
    errors: dict[str, str] = {}
    build_s: dict[str, float] = {}
    torch._dynamo.reset()
    tuned_opts = {"trials": opts.trials, "time_budget": opts.budget_s, "progress": False}
    if opts.cache_dir:
        tuned_opts["cache_dir"] = opts.cache_dir
    if opts.phase == "train":  # a training step: autofuse as torch.compile's backend
        optimize_fn = backend_optimize
    makers = [(label, lambda m=mode: compile_fn(model, m)) for label, mode in zip(COMPILE, MODES)]
    makers += [("autofuse greedy", lambda: optimize_fn(model, inputs)),
               (LIBRARY_BIAS, lambda: optimize_fn(model, inputs)),
               (OWN_CONV, lambda: optimize_fn(model, inputs)),
               (RULE_CONFIGS, lambda: optimize_fn(model, inputs)),
               ("autofuse tuned", lambda: optimize_fn(model, inputs, **tuned_opts))]  # fmt: skip
    for label, make in makers:
        if label not in opts.variants:
            continue
        t0 = time.perf_counter()
        try:
            with grad_mode(opts), arm(label):
                fn = make()
                fn = wrap(fn) if wrap is not None else fn
                fn(*inputs)  # compiles (torch.compile is lazy)
            order.append((label, fn))
        except Exception as e:  # noqa: BLE001 - recorded; the other variants still run
            errors[label] = first_line(e)
        build_s[label] = time.perf_counter() - t0
        if guard is not None:
            guard.check(label)
    return order, errors, build_s


def judge(order, module, inputs, opts: GpuOptions, dtype, device,
          guard: PrecisionGuard | None = None, step64: Callable | None = None) -> dict:  # fmt: skip
    """KernelBench's rule per variant: every draw's outputs allclose to eager's; a variant
    that fails it is judged against ``step64(xs)`` (the same forward or training step in
    float64 eager, ``float64_forward`` / ``float64_step``:
    ``check.judged_by_float64``, as the CPU mode judges), passing where each output and
    gradient is no more than ``REFERENCE_FACTOR`` times further from it than eager's is."""

    eager = order[0][1]
    out: dict[str, dict] = {name: {"correct": True, "max_abs_err": 0.0} for name, _ in order[1:]}
    for trial in range(opts.correct_trials):
        xs = inputs if trial == 0 else new_inputs(module, 1000 + trial, dtype, device)
        ref64: list = []  # made at the first failing variant of this draw
        with grad_mode(opts):
            ref = eager(*xs)
            for name, fn in order[1:]:
                try:
                    with arm(name):
                        got = fn(*xs)
                    c = compare(got, ref, opts.tol, scaled=opts.phase == "train")
                    if not c["correct"] and step64 is not None:
                        ref64 = ref64 or [step64(xs)]
                        judged = judged_by_float64(got, ref, ref64[0], opts.tol)
                        c = c if judged is None else {**judged, "max_abs_err": c["max_abs_err"]}
                except Exception as e:  # noqa: BLE001 - a variant that fails a draw is wrong
                    c = {"correct": False, "why": first_line(e)}
                if guard is not None:
                    guard.check(name)
                _merge(out[name], c)
    return out


def _merge(rec: dict, c: dict) -> None:
    rec["correct"] = rec["correct"] and c["correct"]
    rec["max_abs_err"] = max(rec["max_abs_err"], c.get("max_abs_err", math.inf))
    if "why" in c:
        rec.setdefault("why", c["why"])
    if c.get("judged_by_float64"):
        rec["judged_by_float64"] = True
        rec["worst_error_ratio"] = max(rec.get("worst_error_ratio", 0.0), c["worst_error_ratio"])


def float64_step(model: Any, weights: list) -> Callable:
    """``xs -> the training step (train_call) in float64 eager`` (``check.in_float64``: on a
    float64 copy of the module; None where it does not run so)."""
    import torch

    def step(m64: Any, x64: list) -> list:
        with torch.enable_grad():
            w64 = [w.double() for w in weights]
            return [t.detach().clone() for t in train_call(m64, m64, w64)(*x64)]

    return lambda xs: in_float64(model, xs, step)


def float64_forward(model: Any) -> Callable:
    """``xs -> the forward's outputs in float64 eager`` (``check.float64_outputs``): the
    reference a forward variant that fails the rule against eager is judged by, in fp32 and
    bf16 alike (eager's own rounding is then the yardstick, not the tolerance)."""
    return lambda xs: float64_outputs(model, xs)


def interleaved(order, inputs, rounds: int, timer, guard: PrecisionGuard | None = None,
                grad: bool = False) -> dict[str, list[float]]:  # fmt: skip
    """Every variant timed once per round; odd rounds in reverse order (none always hottest);
    autograd on where ``grad`` (training steps)."""
    import torch

    times: dict[str, list[float]] = {name: [] for name, _ in order}
    with torch.set_grad_enabled(grad):
        for r in range(rounds):
            for name, fn in order if r % 2 == 0 else order[::-1]:
                with arm(name):
                    times[name].append(timer(name, fn, inputs))
                if guard is not None:
                    guard.check(name)
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
    if opts.phase == "eval":
        model.eval()
    with torch.no_grad():
        outputs = flat(model(*inputs))
    wrap = None
    if opts.phase == "train":
        torch.manual_seed(1)
        weights = [torch.randn_like(o.float()) for o in outputs]
        wrap = lambda fn: train_call(model, fn, weights)  # noqa: E731
    guard = PrecisionGuard()
    order, errors, build_s = build(model, inputs, opts, compile_fn, optimize_fn, guard, wrap)
    step64 = float64_step(model, weights) if wrap is not None else float64_forward(model)
    checks = judge(order, module, inputs, opts, dtype, device, guard, step64)
    rounds = interleaved(order, inputs, opts.rounds, timer, guard, opts.phase == "train")
    times = {name: {"us": min(ts) * 1e6, "source": "measured"} for name, ts in rounds.items()}
    for name in opts.variants:
        if name not in times:
            times[name] = {"us": None, "source": f"failed: {errors.get(name, 'not built')}"}
    rec: dict[str, Any] = {"workload": problem.key, "complete": True, "mode": "gpu",
                           "level": problem.level, "number": problem.number,
                           "problem": problem.name, "dtype": opts.dtype, "phase": opts.phase,
                           **stamp(),
                           **library_versions(), "precision": guard.start,
                           "precision_changed": guard.changed, "variants": list(opts.variants),
                           "headline": headline(opts.variants),
                           "shapes_changed": changed, "times_us": times,
                           "tuned_source": "measured", "errors": errors, "build_s": build_s,
                           "correct": {k: v["correct"] for k, v in checks.items()},
                           "checks": checks, "tolerance": opts.tol,
                           "interleaved_rounds_us": {k: [t * 1e6 for t in v]
                                                     for k, v in rounds.items()}}  # fmt: skip
    rec.update(floor_of(model, inputs, outputs, ceil))
    rec["ceilings"] = ceil
    rec.update(plan_fields(dict(order).get(rec["headline"])))
    rec["tuning_s"] = build_s.get("autofuse tuned")
    rec.update(verdicts(rec))
    best_us = times[rec["headline"]]["us"]
    rec["fraction_of_floor"] = rec["floor_us"] / best_us if best_us else None
    return rec


def plan_fields(tuned: Any) -> dict:
    """The tuned plan's kernels (``autofuse report``'s partition) and its eager steps."""
    from autofuse.report import summarize

    plan = getattr(tuned, "plan", None)
    if plan is None:
        return {"kernels": [], "eager_ops": {}, "trials": None, "measured": []}
    tuning = getattr(tuned, "tuning", None)
    rows = summarize(plan, getattr(tuning, "kernel_times", None)).rows
    return {
        "kernels": [{"kernel": r.name, "kind": r.kind, "ops": list(r.ops), "config": r.config,
                     "time_us": None if r.time_s is None else r.time_s * 1e6,
                     "source": r.time_source} for r in rows],
        "eager_ops": dict(sorted(eager_steps(plan).items())),
        "trials": getattr(tuning, "trials", None),
        "measured": measured_choices(plan),
    }  # fmt: skip


def measured_choices(plan: Any) -> list[str]:
    """The plan-level choices timed end to end (layouts, fused library calls), as the steps'
    reasons state them: ``measured: <why> -> <chosen>``."""
    found: list[str] = []
    for step in plan.steps:
        reason = getattr(step, "reason", None) or ""
        part = reason[reason.find("measured: ") :] if "measured: " in reason else None
        if part is not None and part not in found:
            found.append(part)
    return found


def _beside_greedy(t: dict, ok: dict, arm: str) -> tuple[float, float] | None:
    """(the greedy plan's µs, ``arm``'s µs) where both ran and both were correct."""
    greedy, other = t.get("autofuse greedy"), t.get(arm)
    if greedy and other and ok.get("autofuse greedy") and ok.get(arm):
        return greedy, other
    return None


def verdicts(rec: dict) -> dict:
    """fast_1 (the headline autofuse variant correct and faster than eager; ``tuned_*`` keys
    name it whether tuned or greedy), the better compile mode, the speedups, and the peeled
    bias against the bias in the library call (greedy both) where both arms ran."""
    t = {k: v["us"] for k, v in rec["times_us"].items()}
    ok = rec["correct"]
    compiles = [(t[c], c) for c in COMPILE if t.get(c) and ok.get(c, False)]
    best_us, best = min(compiles) if compiles else (None, None)
    name = rec.get("headline", "autofuse tuned")
    tuned = t.get(name)
    tuned_ok = bool(ok.get(name)) and tuned is not None
    library, own, rule = (_beside_greedy(t, ok, a) for a in (LIBRARY_BIAS, OWN_CONV, RULE_CONFIGS))
    return {
        "peeled_bias_speedup": library[1] / library[0] if library else None,
        # > 1: autofuse's convolution kernel beat the library call (cuDNN), epilogues fused
        "own_conv_speedup": own[0] / own[1] if own else None,
        # > 1: the greedy plan's timed configs beat the kinds' default configs
        "timed_configs_speedup": rule[1] / rule[0] if rule else None,
        "best_compile": best,
        "tuned_correct": tuned_ok,
        "fast_1": tuned_ok and t.get("eager") is not None and tuned < t["eager"],
        "speedup_vs_eager": t["eager"] / tuned if tuned_ok and t.get("eager") else None,
        "speedup_vs_best_compile": best_us / tuned if tuned_ok and best_us else None,
        "faster_than_best_compile": bool(tuned_ok and best_us and tuned < best_us),
    }
