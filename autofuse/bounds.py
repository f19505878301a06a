"""Bounds checking of generated kernels in Triton's interpreter (``AUTOFUSE_CHECK_BOUNDS=1``).

Every memory access of an interpreted kernel reaches the interpreter's builder through a few
entry points whatever the kernel wrote: plain pointer loads and stores, block pointers and
tensor descriptors (TMA) all end in ``create_masked_load`` / ``create_masked_store`` (their
padding or boundary masks included), atomics in ``create_atomic_rmw`` / ``create_atomic_cas``.
:func:`install` wraps those, and the grid executor that runs a launch: the launch records the
byte ranges ``[start, end)`` of the tensors it was given (as the interpreter holds them: the
host copies, tuples and descriptor bases included), and each access checks its addresses, under
its mask, against them. The lanes of one access come from one base pointer, so they must all
lie in one buffer: lanes outside it (outside every buffer, or in a neighbouring argument's)
raise :class:`OutOfBoundsAccess` before the access happens, naming the kernel, its source line,
the program, the argument left and the element offsets reached. The check is two reductions
(min, max) per access; the per-lane work is done only to describe an error.

Where this Triton's interpreter lacks an entry point, the mode warns once
(:class:`BoundsCheckWarning`) and kernels run unchecked. On a GPU the same setting builds
kernels with guards instead (``autofuse/kernels/common/guards.py``).
"""

from __future__ import annotations

import inspect
import linecache
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from autofuse.settings import settings


class OutOfBoundsAccess(RuntimeError):
    """A generated kernel's load or store reached memory outside every buffer of its launch."""


class BoundsCheckWarning(UserWarning):
    """``AUTOFUSE_CHECK_BOUNDS`` is set but this Triton's interpreter cannot be checked."""


@dataclass(frozen=True)
class Buffer:
    """One tensor argument of a launch: its name and byte range ``[start, end)``."""

    name: str
    start: int
    end: int
    dtype: str
    numel: int


@dataclass(frozen=True)
class Launch:
    kernel: str
    filename: str
    buffers: tuple[Buffer, ...]


class _State(threading.local):
    launch: Launch | None = None
    pending: Any = None  # the grid executor whose host arguments are being made
    depth: int = 0  # inside a checked entry point (create_load calls create_masked_load)


_STATE = _State()
# entry point -> (kind, index of the pointer argument, index of the mask argument or None)
_ENTRIES = {
    "create_load": ("load", 0, None),
    "create_store": ("store", 0, None),
    "create_masked_load": ("load", 0, 1),
    "create_masked_store": ("store", 0, 2),
    "create_atomic_rmw": ("atomic", 1, 3),
    "create_atomic_cas": ("atomic", 0, None),
}
_REQUIRED = ("create_masked_load", "create_masked_store")
_WARNED: list[str] = []
_TOP = np.iinfo(np.uint64).max


def checking() -> bool:
    return settings().check_bounds


def install(interp: Any = None) -> None:
    """Wrap the access entry points and grid executor of Triton's interpreter (or of
    ``interp``), once; a no-op per access while no checked launch runs."""
    if interp is None:
        from triton.runtime import interpreter as interp
    builder = getattr(interp, "InterpreterBuilder", None)
    executor = getattr(interp, "GridExecutor", None)
    missing = [n for n in _REQUIRED if not hasattr(builder, n)]
    missing += [n for n in ("__call__", "_init_args_hst") if not hasattr(executor, n)]
    if missing:
        _warn_unchecked(f"its interpreter has no {', '.join(missing)}")
        return
    if getattr(executor.__call__, "_autofuse_bounds", False):
        return
    for name, (kind, at, mask_at) in _ENTRIES.items():
        orig = getattr(builder, name, None)
        if orig is not None:
            setattr(builder, name, _checked(orig, kind, at, mask_at))
    _wrap_executor(executor)


def _warn_unchecked(why: str) -> None:
    if not _WARNED and checking():
        _WARNED.append(why)
        warnings.warn(
            f"autofuse: AUTOFUSE_CHECK_BOUNDS is set but this Triton cannot be checked ({why}); "
            "kernels run unchecked",
            BoundsCheckWarning,
            stacklevel=3,
        )


def _checked(orig: Any, kind: str, at: int, mask_at: int | None) -> Any:
    def entry(self, *args, **kwargs):
        state = _STATE
        if state.launch is None or state.depth:
            return orig(self, *args, **kwargs)
        if len(args) <= at:  # a call this check does not know: unchecked
            return orig(self, *args, **kwargs)
        mask = None if mask_at is None else (args[mask_at] if len(args) > mask_at else None)
        check_access(state.launch, kind, args[at], mask, getattr(self, "grid_idx", None))
        state.depth += 1
        try:
            return orig(self, *args, **kwargs)
        finally:
            state.depth -= 1

    entry._autofuse_bounds = True
    return entry


def _wrap_executor(executor: Any) -> None:
    call, init_hst = executor.__call__, executor._init_args_hst

    def __call__(self, *args, **kwargs):
        if not checking():
            return call(self, *args, **kwargs)
        state = _STATE
        outer, state.pending = state.launch, self
        try:
            return call(self, *args, **kwargs)
        except Exception as e:
            oob = bounds_error(e)
            if oob is None or oob is e:
                raise
            raise oob.with_traceback(oob.__traceback__) from None
        finally:
            state.launch, state.pending = outer, None

    def _init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_hst(self, args_dev, kwargs)
        if _STATE.pending is self:
            _STATE.launch = launch_of(self.fn, args_hst, kwargs_hst)
        return args_hst, kwargs_hst

    __call__._autofuse_bounds = True
    executor.__call__ = __call__
    executor._init_args_hst = _init_args_hst


def bounds_error(e: BaseException | None) -> OutOfBoundsAccess | None:
    """The :class:`OutOfBoundsAccess` that ``e`` is or was caused by (the interpreter wraps a
    kernel's exception in its own), else None."""
    seen = 0
    while e is not None and seen < 16:
        if isinstance(e, OutOfBoundsAccess):
            return e
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


def launch_of(fn: Any, args: Any, kwargs: dict[str, Any]) -> Launch:
    """The buffers a launch of ``fn`` passes: each tensor argument's bytes, as a view."""
    try:
        named = inspect.getcallargs(fn, *args, **kwargs)
    except TypeError:
        named = {f"arg{i}": a for i, a in enumerate(args)} | dict(kwargs)
    buffers: list[Buffer] = []
    for name, value in named.items():
        _collect(name, value, buffers)
    code = getattr(fn, "__code__", None)
    filename = code.co_filename if code is not None else ""
    return Launch(getattr(fn, "__name__", "kernel"), filename, tuple(buffers))


def _collect(name: str, value: Any, out: list[Buffer]) -> None:
    if isinstance(value, tuple):
        for k, v in enumerate(value):
            _collect(f"{name}[{k}]", v, out)
        return
    if not hasattr(value, "data_ptr") and hasattr(value, "base") and hasattr(value, "strides"):
        _collect(f"{name}.base", value.base, out)  # a tensor descriptor
        return
    if not hasattr(value, "data_ptr"):
        return
    t = value.base if type(value).__name__ == "TensorWrapper" else value
    if t.numel() == 0:
        return
    span = sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0) + 1
    start = t.data_ptr()
    dtype = str(getattr(value, "dtype", t.dtype)).replace("torch.", "")
    out.append(Buffer(name, start, start + span * t.element_size(), dtype, t.numel()))


def _itemsize(ptrs: Any) -> int:
    ty = ptrs.dtype
    while hasattr(ty, "element_ty"):
        ty = ty.element_ty
    return max(1, int(getattr(ty, "primitive_bitwidth", 8)) // 8)


def check_access(launch: Launch, kind: str, ptrs: Any, mask: Any, program: Any = None) -> None:
    """Raise :class:`OutOfBoundsAccess` unless every address of ``ptrs`` under ``mask`` (an
    interpreter handle, or None: every lane) lies in one buffer of ``launch``: the lanes of one
    access come from one base pointer, so lanes in a second buffer overran the first."""
    addr = np.asarray(ptrs.data)
    m = None if mask is None else np.asarray(mask if isinstance(mask, np.ndarray) else mask.data)
    if m is not None:
        if m.dtype != np.bool_:
            m = m != 0
        if m.shape != addr.shape:
            m = np.broadcast_to(m, addr.shape)
        if m.all():
            m = None
    if addr.size == 0:
        return
    size = _itemsize(ptrs)
    if m is None:
        lo, hi = int(addr.min()), int(addr.max()) + size
    else:  # reductions under the mask: no copy of the active lanes
        lo = int(addr.min(where=m, initial=_TOP))
        if lo == _TOP:
            return  # no active lane
        hi = int(addr.max(where=m, initial=0)) + size
    for b in launch.buffers:
        if b.start <= lo and hi <= b.end:
            return
    active = addr.ravel() if m is None else addr[m]
    raise OutOfBoundsAccess(_message(launch, kind, active, size, program))


def _inside(addr: Any, b: Buffer, size: int) -> Any:
    return (addr >= np.uint64(b.start)) & (addr <= np.uint64(b.end - size))


def _home(launch: Launch, addr: Any, size: int) -> Buffer | None:
    """The buffer most of an access's lanes lie in, else the one closest to them."""
    counts = [(int(_inside(addr, b, size).sum()), b) for b in launch.buffers]
    n, best = max(counts, key=lambda c: c[0], default=(0, None))
    if n:
        return best
    lo, hi = int(addr.min()), int(addr.max())
    return min(launch.buffers, key=lambda b: max(b.start - lo, hi - b.end + 1, 0), default=None)


def _message(launch: Launch, kind: str, addr: Any, size: int, program: Any) -> str:
    verb = {"load": "loads from", "store": "stores to", "atomic": "updates"}[kind]
    head = (
        f"autofuse: kernel {launch.kernel} {verb} memory outside its buffer "
        f"(AUTOFUSE_CHECK_BOUNDS){f', program {tuple(program)}' if program is not None else ''}"
        f"{_source_line(launch.filename)}"
    )
    b = _home(launch, addr, size)
    if b is None:
        return f"{head}: the launch has no buffer (addresses {int(addr.min()):#x}..)"
    bad = addr[~_inside(addr, b, size)]
    first, last = (int(bad.min()) - b.start) // size, (int(bad.max()) - b.start) // size
    into = [x.name for x in launch.buffers if x is not b and _inside(bad, x, size).any()]
    where = f"into argument(s) {', '.join(into)}" if into else "outside every buffer"
    return (
        f"{head}: {bad.size} of {addr.size} active lanes leave argument {b.name!r} ({b.dtype}, "
        f"{b.numel} elements; {size}-byte elements at offsets [0, {(b.end - b.start) // size})), "
        f"reaching element offsets [{first}, {last}] of it, {where}; the launch's buffers: "
        + ", ".join(x.name for x in launch.buffers)
    )


def _source_line(filename: str) -> str:
    """`` at line N: <code>`` of the innermost frame running the kernel's source, if any."""
    frame = sys._getframe(1)
    while frame is not None:
        if filename and frame.f_code.co_filename == filename:
            code = linecache.getline(filename, frame.f_lineno).strip()
            return f", at line {frame.f_lineno}: {code}" if code else f", at line {frame.f_lineno}"
        frame = frame.f_back
    return ""
