"""One program through autofuse's front ends, judged against eager.

Forward values, and in ``backward`` mode the gradients of the float inputs as well (the sum of
the float outputs times fixed random cotangents): integer and bool results exactly, floating
results at the dtype's tolerance (``experiments/opinfo_check``'s) and, where that fails,
against a float64 run of the same program: autofuse's largest error from it may be no more
than a few times eager's largest (plus the tolerance), NaNs where eager has them. The bound is
per tensor, not per element: a program that amplifies rounding (a group norm over one element
scales its noise by 1/sqrt(eps)) leaves eager's noise and autofuse's in different elements. An
exception autofuse raises where eager does not is a crash; a run past its time limit a time-out.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from experiments.fuzz.program import Program, compile_program
from experiments.opinfo_check import (
    REFERENCE_FACTOR,
    TOLERANCES,
    CaseTimeout,
    run_case,
    tensor_mismatch,
    with_timeout,
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


def fresh_inputs(make_inputs: Callable[[], list], backward: bool, to64: bool = False) -> list:
    xs = make_inputs()
    if to64:
        xs = [x.double() if x.is_floating_point() else x for x in xs]
    if backward:
        xs = [x.requires_grad_() if x.is_floating_point() else x for x in xs]
    return xs


def run(fn: Callable[..., Any], xs: list, backward: bool) -> Any:
    """(outputs, gradients) of ``fn`` on ``xs`` (gradients () without ``backward``)."""
    got = run_case(fn, tuple(xs), {}, backward)
    return got if backward else (got, ())


def check_program(
    p: Program,
    backward: bool,
    front_ends: Sequence[str],
    timeout_s: float = 120.0,
    compilers: dict[str, Compiler] | None = None,
) -> list[Verdict]:
    """One verdict per front end; raises ``EagerRejected`` where eager fails."""
    compilers = compilers or COMPILERS
    fn, make_inputs = compile_program(p)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = run(fn, fresh_inputs(make_inputs, backward), backward)
    except Exception as e:  # noqa: BLE001 - no valid program: counted, not a failure
        raise EagerRejected(f"{type(e).__name__}: {e}") from e
    cache: dict[str, Any] = {}

    def reference() -> Any:
        if "ref" not in cache:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cache["ref"] = run(fn, fresh_inputs(make_inputs, backward, to64=True), backward)
        return cache["ref"]

    mode = MODES[backward]
    out = []
    for fe in front_ends:
        t0 = time.perf_counter()
        v = _one(compilers[fe], fn, make_inputs, backward, timeout_s, expected, reference)
        out.append(Verdict(fe, mode, *v, seconds=round(time.perf_counter() - t0, 2)))
    return out


def _one(
    compiler: Compiler,
    fn: Callable[..., Any],
    make_inputs: Callable[[], list],
    backward: bool,
    timeout_s: float,
    expected: Any,
    reference: Callable[[], Any],
) -> tuple[str, str, str, str]:
    """(status, phase, error, detail) of one front end."""
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
        why = compare(actual[k], expected[k], lambda k=k: reference()[k])
        if why:
            return "mismatch", phase, "", why
    return "pass", "", "", ""


def compare(actual: Any, expected: Any, reference: Callable[[], Any]) -> str:
    """'' when ``actual`` (a tuple of tensors or None) matches eager's, else the first
    difference."""
    if len(actual) != len(expected):
        return f"{len(actual)} values where eager gives {len(expected)}"
    for k, (a, e) in enumerate(zip(actual, expected)):
        if (a is None) != (e is None):
            return f"value {k}: {type(a).__name__} where eager gives {type(e).__name__}"
        why = "" if e is None else tensor_mismatch(a, e)
        if why and e.dtype.is_floating_point and a.shape == e.shape and a.dtype == e.dtype:
            r = reference_value(reference, k)
            if r is not None and near_reference(a, e, r):
                continue
        if why:
            return f"value {k}: {why}"
    return ""


def reference_value(reference: Callable[[], Any], k: int) -> torch.Tensor | None:
    try:
        r = reference()[k]
    except Exception:  # noqa: BLE001 - no float64 run: the first comparison decides
        return None
    return r if isinstance(r, torch.Tensor) else None


def near_reference(a: torch.Tensor, e: torch.Tensor, r: torch.Tensor) -> bool:
    """autofuse's largest error from the float64 result ``r`` is within REFERENCE_FACTOR of
    eager's largest (plus the dtype's tolerance); NaN and infinity where eager has them."""
    rtol, atol = TOLERANCES.get(e.dtype, TOLERANCES[torch.float32])
    a, e, r = (t.detach().to(torch.float64) for t in (a, e, r))
    if not torch.equal(a.isnan(), e.isnan()) or not torch.equal(a.isinf(), e.isinf()):
        return False
    if not torch.equal(a[a.isinf()], e[e.isinf()]):
        return False
    ok = ~(e.isnan() | e.isinf() | r.isnan() | r.isinf())
    if not ok.any():
        return True
    a, e, r = a[ok], e[ok], r[ok]
    bound = REFERENCE_FACTOR * (e - r).abs().max() + atol + rtol * r.abs().max()
    return bool((a - r).abs().max() <= bound)


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
