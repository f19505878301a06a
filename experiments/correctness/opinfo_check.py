"""One OpInfo sample through ``torch.compile(..., backend="autofuse")``, checked against eager.

A case is (op, dtype, sample index, mode): ``fwd`` runs the op on inputs that do not require
grad (an inference graph); ``bwd`` runs it on inputs that do, then ``torch.autograd.grad`` of
the outputs with fixed random cotangents (a forward and a backward graph). The compiled results
are compared with eager's: integer and bool results exactly; floating results with the dtype's
tolerances, and where that fails, against a float64 reference (the compiled result may be no
more than a few times further from it than eager's own); NaN positions must be equal. Ops whose
output is random are checked for structure, shape and dtype only.

How the backend ran a case comes from the plans it compiled for it
(``autofuse.frontend.dynamo.compiled_graphs``): ``generated`` (every op in generated kernels,
matmuls as library calls, views), ``eager_step`` (at least one op ran as an eager step of a
plan) or ``no_graph`` (Dynamo handed the backend no graph: the op ran in eager).
"""

from __future__ import annotations

import signal
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from autofuse.bounds import bounds_error
from autofuse.frontend.dynamo import compiled_graphs
from autofuse.plan.runtime import KernelBuildWarning

# (rtol, atol) of the first comparison with eager, per floating dtype
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1.3e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
}
FAILING = ("wrong", "oob", "error", "timeout")  # the statuses of a case that did not pass
REFERENCE_FACTOR = 4.0  # the compiled result's error against float64 may be this many times eager's


class CaseTimeout(Exception):
    """The case ran past its time limit."""


@dataclass(frozen=True)
class Outcome:
    """What one case did: ``status`` is one of pass / wrong / oob (a generated kernel's access
    outside its buffers, ``AUTOFUSE_CHECK_BOUNDS``) / error / timeout / skip (the sample fails in
    eager too); ``how`` says how the backend ran it where it passed."""

    status: str
    how: str = ""
    detail: str = ""
    kernels: int = 0
    eager_ops: tuple[str, ...] = ()
    seconds: float = 0.0


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------


def _clone(value: Any) -> Any:
    """A deep copy of a sample's arguments: tensors cloned with their strides (leaves keep
    ``requires_grad``), so eager and the compiled function each get their own."""

    def one(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        with torch.no_grad():
            if torch._debug_has_internal_overlap(t) == 0:
                c = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
                c.copy_(t)
            else:  # an expanded tensor: a dense copy
                c = t.clone()
        return c.requires_grad_(t.requires_grad)

    return pytree.tree_map(one, value)


def _grad_leaves(args: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor) and t.requires_grad]


def differentiable(out: Any) -> list[torch.Tensor]:
    """The floating outputs of ``out`` that carry a gradient."""
    return [
        o
        for o in pytree.tree_leaves(out)
        if isinstance(o, torch.Tensor) and o.requires_grad and o.dtype.is_floating_point
    ]


def _cotangents(outs: list[torch.Tensor], like: Sequence[torch.dtype] = ()) -> list[torch.Tensor]:
    """Fixed random cotangents, rounded to ``like``'s dtypes first where given (the float64
    reference then differentiates with the very cotangents eager's bfloat16 outputs got)."""
    gen = torch.Generator().manual_seed(1234)
    cots = [torch.randn(o.shape, generator=gen, dtype=torch.float32) for o in outs]
    cots = [c.to(like[k]) if k < len(like) else c for k, c in enumerate(cots)]
    return [c.to(device=o.device, dtype=o.dtype) for c, o in zip(cots, outs)]


def run_case(
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    backward: bool,
    like: Sequence[torch.dtype] = (),
) -> Any:
    """``fn(*args, **kwargs)``; with ``backward`` also the gradients of its differentiable
    outputs with respect to the inputs that require grad (None where unused), for cotangents
    rounded to ``like``'s dtypes."""
    out = fn(*args, **kwargs)
    if not backward:
        return out
    leaves = _grad_leaves((args, kwargs))
    outs = differentiable(out)
    if not outs or not leaves:
        return out, ()
    grads = torch.autograd.grad(outs, leaves, _cotangents(outs, like), allow_unused=True)
    return out, tuple(grads)


def _alarm(_signum: int, _frame: Any) -> None:
    raise CaseTimeout()


def with_timeout(seconds: float, thunk: Callable[[], Any]) -> Any:
    """``thunk()`` interrupted by ``CaseTimeout`` after ``seconds`` (main thread only)."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return thunk()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------------------------------------
# Comparing
# ---------------------------------------------------------------------------------------------


def _to64(value: Any) -> Any:
    def one(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.dtype in (
            torch.float16,
            torch.bfloat16,
            torch.float32,
        ):
            return t.detach().to(torch.float64).requires_grad_(t.requires_grad)
        return t

    return pytree.tree_map(one, value)


def tensor_mismatch(actual: torch.Tensor, expected: torch.Tensor) -> str:
    """'' when ``actual`` matches ``expected`` (exact for integers and bools), else why not."""
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)} != eager's {tuple(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype} != eager's {expected.dtype}"
    if actual.is_complex() or expected.is_complex():
        actual, expected = (
            torch.view_as_real(t.detach().resolve_conj().resolve_neg()) for t in (actual, expected)
        )
    rtol, atol = TOLERANCES.get(expected.dtype, (0.0, 0.0))
    try:
        torch.testing.assert_close(
            actual.detach(), expected.detach(), rtol=rtol, atol=atol, equal_nan=True
        )
    except AssertionError as e:
        return " ".join(str(e).split())[:300]
    return ""


def _near_reference(actual: torch.Tensor, expected: torch.Tensor, ref: Any) -> bool:
    """The compiled result is no more than REFERENCE_FACTOR times further from the float64
    reference than eager's (plus the dtype's tolerance), NaNs in eager's places."""
    if not isinstance(ref, torch.Tensor) or ref.shape != actual.shape:
        return False
    a, e, r = (t.detach().to(torch.float64) for t in (actual, expected, ref))
    if not torch.equal(a.isnan(), e.isnan()):
        return False
    finite = ~e.isnan()
    a, e, r = a[finite], e[finite], r[finite]
    if not torch.equal(a.isinf() & (a == e), a.isinf()):
        return False
    rtol, atol = TOLERANCES[expected.dtype]
    bound = REFERENCE_FACTOR * (e - r).abs() + atol + rtol * r.abs()
    ok = (a - r).abs() <= bound
    return bool(ok.all()) or bool(((a == e) | ok).all())


def compare(actual: Any, expected: Any, reference: Callable[[], Any] | None) -> str:
    """'' when the compiled results match eager's, else the first difference."""
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    if a_spec != e_spec:
        return f"result structure {a_spec} != eager's {e_spec}"
    ref_leaves: list[Any] | None = None
    for k, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        if isinstance(e, torch.Tensor) != isinstance(a, torch.Tensor):
            return f"output {k}: {type(a).__name__} where eager has {type(e).__name__}"
        if not isinstance(e, torch.Tensor):
            if not _same_value(a, e):
                return f"output {k}: {a!r} != eager's {e!r}"
            continue
        why = tensor_mismatch(a, e)
        if not why or not e.dtype.is_floating_point or reference is None:
            if why:
                return f"output {k}: {why}"
            continue
        if ref_leaves is None:
            ref_leaves = _reference_leaves(reference, len(e_leaves))
        if not _near_reference(a, e, ref_leaves[k] if ref_leaves else None):
            return f"output {k}: {why}"
    return ""


def _reference_leaves(reference: Callable[[], Any], n: int) -> list[Any]:
    try:
        leaves = pytree.tree_leaves(reference())
    except Exception:  # noqa: BLE001 - no float64 reference: the first comparison decides
        return []
    return leaves if len(leaves) == n else []


def _same_value(a: Any, e: Any) -> bool:
    if isinstance(e, float) and isinstance(a, float):
        return a == e or (a != a and e != e) or abs(a - e) <= 1e-6 * max(1.0, abs(e))
    try:
        return bool(a == e)
    except Exception:  # noqa: BLE001 - values that do not compare: equal by type
        return type(a) is type(e)


def structure_only(actual: Any, expected: Any) -> str:
    """For ops with random outputs: the same structure, shapes and dtypes."""
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    if a_spec != e_spec:
        return f"result structure {a_spec} != eager's {e_spec}"
    for k, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        if isinstance(e, torch.Tensor) and (
            not isinstance(a, torch.Tensor) or a.shape != e.shape or a.dtype != e.dtype
        ):
            return f"output {k}: shape/dtype differ from eager's"
    return ""


# ---------------------------------------------------------------------------------------------
# How the backend ran it
# ---------------------------------------------------------------------------------------------


def graph_mark() -> Any:
    """The newest graph the backend has compiled (None before any): :func:`graphs_since` takes
    those after it. ``compiled_graphs()`` keeps the last 512, so a count would stop moving."""
    graphs = compiled_graphs()
    return graphs[-1] if graphs else None


def graphs_since(mark: Any) -> list[Any]:
    """The graphs compiled after ``mark`` (all those kept, where it has dropped out)."""
    graphs = compiled_graphs()
    for i in range(len(graphs) - 1, -1, -1):
        if graphs[i] is mark:
            return graphs[i + 1 :]
    return graphs


def how_it_ran(mark: Any) -> tuple[str, int, tuple[str, ...]]:
    """(generated / eager_step / no_graph, kernels, eager ops) of the plans compiled since
    ``mark`` (:func:`graph_mark`) was taken."""
    graphs = graphs_since(mark)
    if not graphs:
        return "no_graph", 0, ()
    kernels, eager = 0, []
    for cg in graphs:
        kernels += len(cg.plan.kernels)
        g = cg.plan.graph
        eager += [
            str(g[s.node].attr("target", g[s.node].op))
            for s in cg.plan.fallbacks
            if g[s.node].kind != "matmul" and g[s.node].op != "getitem"
        ]
    return ("eager_step" if eager else "generated"), kernels, tuple(sorted(set(eager)))


def judge(
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    backward: bool,
    random_output: bool,
    actual: Any,
    expected: Any,
) -> str:
    """'' when the compiled results pass, else the first difference (against eager's, then
    against a float64 reference run with eager's cotangents)."""
    if random_output:
        return structure_only(actual, expected)
    like = [o.dtype for o in differentiable(expected[0])] if backward else []
    return compare(
        actual, expected, lambda: run_case(fn, *_to64(_clone((args, kwargs))), backward, like)
    )


def check_case(
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    backward: bool,
    random_output: bool,
    timeout_s: float,
) -> Outcome:
    """Run one case in eager and compiled, and judge it."""
    t0 = time.perf_counter()
    try:
        torch.manual_seed(0)
        expected = run_case(fn, *_clone((args, kwargs)), backward)
    except Exception as e:  # noqa: BLE001 - a sample eager rejects is not a case
        return Outcome("skip", detail=f"eager: {type(e).__name__}: {str(e)[:200]}")
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="autofuse", dynamic=False)
    first = graph_mark()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", KernelBuildWarning)
            torch.manual_seed(0)
            actual = with_timeout(
                timeout_s, lambda: run_case(compiled, *_clone((args, kwargs)), backward)
            )
    except CaseTimeout:
        return Outcome("timeout", detail=f"over {timeout_s:.0f} s", seconds=timeout_s)
    except Exception as e:  # noqa: BLE001 - every other failure is an error of the case
        if "CaseTimeout" in repr(e):  # raised inside Triton's interpreter, which wraps it
            return Outcome("timeout", detail=f"over {timeout_s:.0f} s", seconds=timeout_s)
        oob = bounds_error(e)
        e = oob or e
        line = " ".join(f"{type(e).__name__}: {e}".split())[: 600 if oob else 300]
        return Outcome("oob" if oob else "error", detail=line, seconds=time.perf_counter() - t0)
    how, kernels, eager = how_it_ran(first)
    why = judge(fn, args, kwargs, backward, random_output, actual, expected)
    status = "wrong" if why else "pass"
    return Outcome(status, how, why, kernels, eager, time.perf_counter() - t0)
