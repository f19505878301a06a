"""What a fuzzed program's float results are judged against: a float64 run of the program, and
eager's own error from it on inputs a few ulps from the program's.

The float64 run is the program's source run with ``torch.float32`` naming float64 and float64 the
default dtype, so that a value the program makes float32 (``x.to(torch.float32)``, an integer
tensor times a Python float) is float64 too; otherwise such a value meets a float64 one and the
run fails (no reference at all).

A second, *wide* run names the 16-bit floats float64 as well: where eager's 16-bit op is itself
off (its CPU float16 ``layer_norm`` of a constant row with ``eps=1e-12``: 0.04 from the bias,
repeated by the first run, which keeps the program's ``.to(torch.float16)``), a result that the
exact program gives is judged against that run too.

Eager's error from the float64 run on the program's own inputs can be 0 by chance where the true
value is a cancellation (a layer_norm gradient through a constant row: terms of rstd * |dy|,
1e3 times the cotangents, summing to 0); its error on ``NEARBY`` draws of inputs each element 1
or 2 ulps away from the program's shows the size of that rounding, which does not hinge on one
draw.
"""

from __future__ import annotations

import contextlib
import types
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from experiments.correctness.opinfo_check import differentiable, run_case
from experiments.fuzz.program import Program, compile_program

NEARBY = 8  # draws of nearby inputs on which eager's own error is measured


class _Float64Torch(types.ModuleType):
    """``torch``, except that ``float32`` names float64 (and, ``wide``, the 16-bit floats)."""

    def __init__(self, name: str, wide: bool = False) -> None:
        super().__init__(name)
        self._names = ("float32", "float16", "bfloat16", "half") if wide else ("float32",)

    def __getattr__(self, name: str) -> Any:
        return torch.float64 if name in self._names else getattr(torch, name)


@contextlib.contextmanager
def float64_default() -> Iterator[None]:
    """float64 as the default dtype (a Python float times an integer tensor is float64)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def float64_program(p: Program, wide: bool = False) -> Callable[..., Any]:
    """``p``'s program with every float32 it names float64 (run it in ``float64_default``);
    ``wide``: its float16 and bfloat16 casts too, so that no value is rounded to 16 bits
    between its ops (the exact program, beside the one rounding where the program says)."""
    fn, _ = compile_program(p, _Float64Torch("torch", wide))
    return fn


def run(fn: Callable[..., Any], xs: list, backward: bool, like: Sequence[torch.dtype] = ()) -> Any:
    """(outputs, gradients) of ``fn`` on ``xs`` (gradients () without ``backward``), the
    cotangents rounded to ``like``'s dtypes; on a GPU synchronized, so that a kernel's fault is
    raised here."""
    got = run_case(fn, tuple(xs), {}, backward, like)
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return got if backward else (got, ())


def fresh_inputs(make_inputs: Callable[[], list], backward: bool, to64: bool = False) -> list:
    xs = make_inputs()
    if to64:
        xs = [x.double() if x.is_floating_point() else x for x in xs]
    if backward:
        xs = [x.requires_grad_() if x.is_floating_point() else x for x in xs]
    return xs


def cotangent_dtypes(outputs: Any) -> list[torch.dtype]:
    """The dtypes of eager's differentiable outputs: the float64 run's cotangents are rounded to
    them, as eager's were."""
    return [o.dtype for o in differentiable(outputs)]


def run_float64(
    fn64: Callable[..., Any], make_inputs: Callable[[], list], backward: bool, like: Sequence
) -> Any:
    """The float64 run of ``fn64`` (see ``float64_program``) on ``make_inputs``' values."""
    with warnings.catch_warnings(), float64_default():
        warnings.simplefilter("ignore")
        return run(fn64, fresh_inputs(make_inputs, backward, to64=True), backward, like)


def nearby(xs: list, draw: int) -> list:
    """``xs`` with each float element moved 1 or 2 ulps up or down (in place: each input keeps
    its strides), by draw ``draw``."""
    gen = torch.Generator().manual_seed(draw)
    for x in xs:
        if x.is_floating_point() and x.numel():
            steps = torch.randint(1, 3, x.shape, generator=gen)
            signs = torch.randint(0, 2, x.shape, generator=gen) * 2 - 1
            scale = 1 + (steps * signs).double() * torch.finfo(x.dtype).eps
            with torch.no_grad():
                x.copy_(x.double() * scale.to(x.device))
    return xs


def largest_error(got: Any, ref: Any) -> float:
    """max |got - ref| where both are finite (0 where none is); 0 for what is no float tensor
    of ``ref``'s shape."""
    if not isinstance(got, torch.Tensor) or not isinstance(ref, torch.Tensor):
        return 0.0
    if not got.dtype.is_floating_point or got.shape != ref.shape:
        return 0.0
    g, r = got.detach().double(), ref.detach().double()
    ok = g.isfinite() & r.isfinite()
    return float((g - r)[ok].abs().max()) if ok.any() else 0.0


def eager_noise(
    fn: Callable[..., Any],
    fn64: Callable[..., Any],
    make_inputs: Callable[[], list],
    backward: bool,
    like: Sequence[torch.dtype],
) -> list[list[float]]:
    """Per phase (outputs, gradients) and value, eager's largest error from the float64 run over
    ``NEARBY`` draws of nearby inputs (a draw eager or the float64 run rejects is left out)."""
    noise: list[list[float]] = [[], []]
    for draw in range(NEARBY):

        def moved(draw: int = draw) -> list:
            return nearby(make_inputs(), draw)

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                e = run(fn, fresh_inputs(moved, backward), backward)
            r = run_float64(fn64, moved, backward, like)
        except Exception:  # noqa: BLE001 - no such run: the other draws decide
            continue
        for k in range(1 + backward):
            errs = [largest_error(a, b) for a, b in zip(e[k], r[k])]
            old = noise[k] + [0.0] * (len(errs) - len(noise[k]))
            noise[k] = [max(x, y) for x, y in zip(old, errs + [0.0] * (len(old) - len(errs)))]
    return noise
