"""One program through autofuse's front ends, judged against eager.

Forward values, and in ``backward`` mode the gradients of the float inputs as well (the sum of
the float outputs times fixed random cotangents). Integer and bool results exactly; float
results at the dtype's tolerance (``experiments/correctness/opinfo_check``'s), no tighter than the
tolerance of a 16-bit type the program passes through (a float32 result of a float16 value
carries float16's rounding). Where that fails, against a float64 run of the same program
(``reference.py``): autofuse's largest error from it may be no more than a few times eager's
largest, here or on inputs a few ulps away (plus the tolerance), NaNs where eager has them (or
the float64 run's finite value where eager's NaN is its own overflow); the bound is per tensor,
not per element (a group norm over one element scales rounding noise by 1/sqrt(eps), in other
elements in eager than in autofuse). An integer or bool result may differ only where eager's differs from the float64
run's (a comparison that rounding tips). An exception autofuse raises where eager does not is
a crash; a run past its time limit a time-out.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from experiments.correctness.opinfo_check import (
    REFERENCE_FACTOR,
    TOLERANCES,
    CaseTimeout,
    with_timeout,
)
from experiments.fuzz.program import Program, compile_program
from experiments.fuzz.reference import (
    cotangent_dtypes,
    eager_noise,
    float64_program,
    fresh_inputs,
    run,
    run_float64,
)

Compiler = Callable[[Callable[..., Any], list], Callable[..., Any]]
STATUSES = ("pass", "mismatch", "crash", "timeout")
MODES = ("forward", "backward")


def _optimize(fn: Callable[..., Any], inputs: list) -> Callable[..., Any]:
    import autofuse

    return autofuse.optimize(fn, inputs)


def _compile(fn: Callable[..., Any], inputs: list) -> Callable[..., Any]:
    return torch.compile(fn, backend="autofuse", dynamic=False)


COMPILERS: dict[str, Compiler] = {"optimize": _optimize, "compile": _compile}


@dataclass(frozen=True)
class Verdict:
    """How one front end did on one program in one mode: ``status`` pass / mismatch / crash /
    timeout; ``phase`` forward or backward (where the first difference was); ``error`` the
    exception's type for a crash."""

    front_end: str
    mode: str
    status: str
    phase: str = ""
    error: str = ""
    detail: str = ""
    seconds: float = 0.0

    def signature(self) -> tuple[str, ...]:
        """What "fails the same way" keeps while a failure is shrunk."""
        return (self.front_end, self.mode, self.status, self.phase, self.error)


class EagerRejected(Exception):
    """Eager itself fails on the program: it is no test of autofuse."""


def check_program(
    p: Program,
    backward: bool,
    front_ends: Sequence[str],
    timeout_s: float = 120.0,
    compilers: dict[str, Compiler] | None = None,
    device: str = "cpu",
) -> list[Verdict]:
    """One verdict per front end; raises ``EagerRejected`` where eager fails. The inputs are
    drawn on the CPU and moved to ``device``, where eager (the float64 reference too) and
    autofuse run."""
    compilers = compilers or COMPILERS
    fn, make_on = compile_program(p)

    def make_inputs() -> list:
        return make_on(device)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = run(fn, fresh_inputs(make_inputs, backward), backward)
    except Exception as e:  # noqa: BLE001 - no valid program: counted, not a failure
        raise EagerRejected(f"{type(e).__name__}: {e}") from e
    cache: dict[str, Any] = {}
    fn64, like = float64_program(p), cotangent_dtypes(expected[0])

    def reference(wide: bool = False) -> Any:
        key = "wide" if wide else "ref"
        if key not in cache:
            prog = float64_program(p, wide=True) if wide else fn64
            cache[key] = run_float64(prog, make_inputs, backward, like)
        return cache[key]

    def noise() -> list[list[float]]:
        if "noise" not in cache:
            cache["noise"] = eager_noise(fn, fn64, make_inputs, backward, like)
        return cache["noise"]

    mode, floor = MODES[backward], lowest_precision(p)
    out = []
    for fe in front_ends:
        t0 = time.perf_counter()
        judge = (expected, reference, noise, floor)
        v = _one(compilers[fe], fn, make_inputs, backward, timeout_s, judge)
        out.append(Verdict(fe, mode, *v, seconds=round(time.perf_counter() - t0, 2)))
    return out


def _one(
    compiler: Compiler,
    fn: Callable[..., Any],
    make_inputs: Callable[[], list],
    backward: bool,
    timeout_s: float,
    judge: tuple,
) -> tuple[str, str, str, str]:
    """(status, phase, error, detail) of one front end; ``judge`` is (eager's results, the
    float64 run's, eager's error on nearby inputs, the floor dtype) (the last three as
    ``compare`` takes them, the runs as thunks)."""
    expected, reference, noise, floor = judge
    from autofuse.plan.runtime import KernelBuildWarning

    torch._dynamo.reset()

    def go() -> Any:
        compiled = compiler(fn, fresh_inputs(make_inputs, False))
        return run(compiled, fresh_inputs(make_inputs, backward), backward)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            warnings.simplefilter("error", KernelBuildWarning)
            actual = with_timeout(timeout_s, go)
    except CaseTimeout:
        return "timeout", "", "", f"over {timeout_s:.0f} s"
    except Exception as e:  # noqa: BLE001 - anything autofuse raises where eager did not
        if "CaseTimeout" in repr(e):  # raised inside Triton's interpreter, which wraps it
            return "timeout", "", "", f"over {timeout_s:.0f} s"
        return "crash", "", root_type(e), " ".join(f"{type(e).__name__}: {e}".split())[:400]
    finally:
        torch._dynamo.reset()
    for k, phase in enumerate(MODES[: 1 + backward]):
        why = compare(
            actual[k],
            expected[k],
            lambda k=k: reference()[k],
            floor,
            lambda k=k: noise()[k],
            lambda k=k: reference(wide=True)[k],
        )
        if why:
            return "mismatch", phase, "", why
    return "pass", "", "", ""


def lowest_precision(p: Program) -> torch.dtype | None:
    """The 16-bit float type a program's values pass through, if any (bfloat16 before
    float16): every float result of it is compared at that type's tolerance at least."""
    text = " ".join([s.dtype for s in p.inputs] + [op.template for op in p.ops])
    for name in ("bfloat16", "float16"):
        if name in text:
            return getattr(torch, name)
    return None


def tolerance(dtype: torch.dtype, floor: torch.dtype | None) -> tuple[float, float]:
    """(rtol, atol) of ``dtype``, no tighter than ``floor``'s for a float type."""
    own = TOLERANCES.get(dtype, (0.0, 0.0))
    if floor is None or not dtype.is_floating_point:
        return own
    low = TOLERANCES[floor]
    return max(own[0], low[0]), max(own[1], low[1])


def mismatch(a: torch.Tensor, e: torch.Tensor, tol: tuple[float, float]) -> str:
    """'' where ``a`` matches eager's ``e`` (exactly for integers and bools), else why not."""
    if a.shape != e.shape:
        return f"shape {tuple(a.shape)} != eager's {tuple(e.shape)}"
    if a.dtype != e.dtype:
        return f"dtype {a.dtype} != eager's {e.dtype}"
    try:
        torch.testing.assert_close(a.detach(), e.detach(), rtol=tol[0], atol=tol[1], equal_nan=True)
    except AssertionError as x:
        return " ".join(str(x).split())[:300]
    return ""


def compare(
    actual: Any,
    expected: Any,
    reference: Callable[[], Any],
    floor: torch.dtype | None = None,
    noise: Callable[[], list[float]] | None = None,
    wide: Callable[[], Any] | None = None,
) -> str:
    """'' when ``actual`` (a tuple of tensors or None) matches eager's, else the first
    difference. An integer or bool result may differ from eager's only where eager's differs
    from the float64 run's (a comparison or cast of a float that rounding tips either way).
    ``noise`` gives, per value, eager's largest error from the float64 run on nearby inputs
    (``reference.eager_noise``): a float result may be as far off as that too. ``wide``, the
    run without the program's 16-bit roundings (``float64_program(p, wide=True)``), judges a
    float result the first run does not pass: autofuse as near the exact program as eager."""
    if len(actual) != len(expected):
        return f"{len(actual)} values where eager gives {len(expected)}"

    def noisy(k: int) -> float:
        errs = noise() if noise is not None else []
        return errs[k] if k < len(errs) else 0.0

    for k, (a, e) in enumerate(zip(actual, expected)):
        if (a is None) != (e is None):
            return f"value {k}: {type(a).__name__} where eager gives {type(e).__name__}"
        tol = tolerance(e.dtype, floor) if e is not None else (0.0, 0.0)
        why = "" if e is None else mismatch(a, e, tol)
        if why and a.shape == e.shape and a.dtype == e.dtype:
            refs = (
                (reference, wide)
                if wide is not None and e.dtype.is_floating_point
                else (reference,)
            )
            for ref, err in zip(refs, (noisy(k), 0.0)):
                r = reference_value(ref, k)
                if r is not None and r.shape == e.shape and near_reference(a, e, r, tol, err):
                    why = ""
                    break
        if why:
            return f"value {k}: {why}"
    return ""


def reference_value(reference: Callable[[], Any], k: int) -> torch.Tensor | None:
    try:
        r = reference()[k]
    except Exception:  # noqa: BLE001 - no float64 run: the first comparison decides
        return None
    return r if isinstance(r, torch.Tensor) else None


def near_reference(
    a: torch.Tensor, e: torch.Tensor, r: torch.Tensor, tol: tuple[float, float], noise: float = 0.0
) -> bool:
    """Floats: autofuse's largest error from the float64 result ``r`` is within
    REFERENCE_FACTOR of eager's largest (here, or ``noise``: on nearby inputs), plus the
    tolerance; NaN only where eager or ``r`` has NaN (eager's float16 ``layer_norm`` of one
    element gives -5.7e-6, not 0, so its ``fmod(v, v)`` is a number where the exact 0 / 0 is
    NaN: fuzz graph 7182 of seed 7), and infinity where eager has it. Where eager's NaN
    or infinity stands for a finite ``r`` (an overflow of eager's own: a float16 intermediate
    eager rounds, which autofuse, like Inductor, keeps in float32), autofuse may give that
    value instead, or its infinity where the result's dtype cannot hold it (eager's float16
    ``copysign`` gradient of ``x / 3e-39``: inf / inf where the float64 value, 3.3e38, is inf
    in float16).
    Integers and bools: autofuse differs from eager only where eager differs from ``r``."""
    if not e.dtype.is_floating_point:
        return not ((a != e) & (e == r.to(e.dtype))).any()
    rtol, atol = tol
    held = r.detach().to(e.dtype).to(torch.float64)  # r as the result's dtype holds it
    a, e, r = (t.detach().to(torch.float64) for t in (a, e, r))
    if (a.isnan() & ~e.isnan() & ~r.isnan()).any():  # a NaN the exact program has too passes
        return False
    overflow = e.isinf() & r.isfinite() & a.isfinite()  # eager's own overflow, a number here
    spared = (e.isnan() & ~a.isnan()) | overflow  # judged against r
    # where eager's NaN stands for a value past the result dtype's range: its infinity
    rounded = spared & a.isinf() & (a == held)
    if (spared & ~rounded & ~(a.isfinite() & r.isfinite())).any():
        return False
    a_inf, e_inf = a.isinf() & ~rounded, e.isinf() & ~overflow
    if not torch.equal(a_inf, e_inf) or not torch.equal(a[a_inf], e[e_inf]):
        return False
    ok = e.isfinite() & r.isfinite()
    judged = ok | (spared & ~rounded)
    if not judged.any():
        return True
    eager_err = max(float((e - r)[ok].abs().max()) if ok.any() else 0.0, noise)
    bound = REFERENCE_FACTOR * eager_err + atol + rtol * float(r[judged].abs().max())
    if ok.any() and float((a - r)[ok].abs().max()) > bound:
        return False
    return spared_near(a, e, r, ok, judged & ~ok, bound)


def spared_near(
    a: torch.Tensor,
    e: torch.Tensor,
    r: torch.Tensor,
    ok: torch.Tensor,
    spared: torch.Tensor,
    bound: float,
) -> bool:
    """Where eager has no value (its NaN or overflow), autofuse's error from ``r`` is within
    ``bound``, or within REFERENCE_FACTOR of eager's largest *relative* error elsewhere times
    ``r`` there: an ill-conditioned program's error scales with its values (fuzz graph 9037 of
    seed 7: eager's gradient is 4e-3 off the float64 one at 1e33 and NaN at 2e35, where
    autofuse's is 4e-4 off)."""
    if not spared.any():
        return True
    err = (a - r)[spared].abs()
    scale = float(r[ok].abs().max()) if ok.any() else 0.0
    if scale > 0:  # eager's error relative to the values' scale (not per element: a 0 there)
        rel = float((e - r)[ok].abs().max()) / scale
        err = err - REFERENCE_FACTOR * rel * r[spared].abs()
    return float(err.max()) <= bound


def root_type(e: BaseException) -> str:
    """The type of the innermost cause (Dynamo wraps a backend's exception in its own)."""
    seen = set()
    while (e.__cause__ or e.__context__) is not None and id(e) not in seen:
        seen.add(id(e))
        inner = e.__cause__ or e.__context__
        if type(e).__name__ not in ("BackendCompilerFailed", "InternalTorchDynamoError"):
            break
        e = inner  # type: ignore[assignment]
    return type(e).__name__
