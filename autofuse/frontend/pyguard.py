"""What a make_fx capture bakes in from Python, and the check that it still holds.

``optimize(f, ...)`` traces ``f`` once: every Python value ``f`` reads besides its arguments (a
module-level float, a closure's cell, a helper function it calls) is read at capture and fixed
in the plan. :func:`python_guard` records those values (the globals named by ``f``'s code and
by the code of the Python functions it calls, and its closure cells), and
:meth:`PythonGuard.changed` says on a call whether one of them was rebound since; such a call
runs through the backend path, whose Dynamo guards see the new value (and recompile for it).
:func:`side_effects` names the Python calls with effects (``print``) that a plan does not
repeat: they ran once, at capture.
"""

from __future__ import annotations

import dis
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

_SCALARS = (bool, int, float, complex, str, bytes, type(None))
_EFFECTS = frozenset({"print", "input", "open", "breakpoint", "exec", "eval"})
_DEPTH = 4  # helper functions followed this many calls deep


@dataclass(frozen=True)
class _Read:
    where: str  # "global 'scale'" / "closure 'k' of f"
    get: Callable[[], Any]
    value: Any  # a scalar or a tuple of them: compared by value; anything else: by identity
    by_value: bool

    def holds(self) -> bool:
        try:
            now = self.get()
        except (NameError, KeyError, ValueError):  # unbound since: the backend path says so
            return False
        if not self.by_value:
            return now is self.value
        return type(now) is type(self.value) and _same(now, self.value)


@dataclass(frozen=True)
class PythonGuard:
    """The Python values a capture read, as they were then."""

    reads: tuple[_Read, ...]

    def changed(self) -> str | None:
        """The first value rebound since the capture (its description), else None."""
        for r in self.reads:
            if not r.holds():
                return r.where
        return None


def python_guard(fn: Any) -> PythonGuard | None:
    """The guard of the values ``fn`` (a function, or a module's ``forward``) reads from Python
    besides its arguments; None where it reads none that can change."""
    reads: dict[tuple[int, str], _Read] = {}
    for owner, name, get in _reads(_function(fn), set(), 0):
        try:
            value = get()
        except (NameError, KeyError, ValueError):
            continue
        if isinstance(value, types.ModuleType):
            continue  # torch, math: an attribute read through one is not followed
        by_value = _scalar(value)
        reads.setdefault((id(owner), name), _Read(name, get, value, by_value))
    return PythonGuard(tuple(reads.values())) if reads else None


def side_effects(fn: Any) -> tuple[str, ...]:
    """Builtins with Python side effects that ``fn`` (or a helper it calls) names."""
    found: set[str] = set()
    for f in _functions(_function(fn), set(), 0):
        found |= {n for n in _global_names(f.__code__) if n in _EFFECTS}
    return tuple(sorted(found))


def _function(fn: Any) -> types.FunctionType | None:
    import torch

    if isinstance(fn, torch.nn.Module):
        fn = type(fn).forward
    fn = getattr(fn, "__func__", fn)  # a bound method
    return fn if isinstance(fn, types.FunctionType) else None


def _functions(fn, seen: set[int], depth: int) -> Iterator[types.FunctionType]:
    """``fn`` and the Python functions it calls through its globals and cells, once each."""
    if fn is None or id(fn) in seen or depth > _DEPTH or _library(fn):
        return
    seen.add(id(fn))
    yield fn
    for _, _, get in _direct_reads(fn):
        try:
            value = get()
        except (NameError, KeyError, ValueError):
            continue
        yield from _functions(_function(value), seen, depth + 1)


def _reads(fn, seen: set[int], depth: int) -> Iterator[tuple[Any, str, Callable[[], Any]]]:
    for f in _functions(fn, seen, depth):
        yield from _direct_reads(f)


def _direct_reads(fn: types.FunctionType) -> Iterator[tuple[Any, str, Callable[[], Any]]]:
    g = fn.__globals__
    for name in _global_names(fn.__code__):
        if name in g:
            yield g, f"global {name!r} of {fn.__qualname__}", _getter(g, name)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        yield cell, f"closure variable {name!r} of {fn.__qualname__}", _cell_getter(cell)


def _getter(g: dict, name: str) -> Callable[[], Any]:
    return lambda: g[name]


def _cell_getter(cell: Any) -> Callable[[], Any]:
    return lambda: cell.cell_contents


def _global_names(code: types.CodeType) -> set[str]:
    """Names ``code`` (and the code nested in it: comprehensions, lambdas) loads as globals."""
    out = {
        i.argval
        for i in dis.get_instructions(code)
        if i.opname in ("LOAD_GLOBAL", "LOAD_NAME") and isinstance(i.argval, str)
    }
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _global_names(c)
    return out


def _library(fn: types.FunctionType) -> bool:
    """A function of torch or of another installed library: its globals are its own."""
    mod = getattr(fn, "__module__", "") or ""
    return mod.split(".")[0] in ("torch", "triton", "numpy", "autofuse", "functools", "typing")


def _scalar(value: Any) -> bool:
    if isinstance(value, _SCALARS):
        return True
    return isinstance(value, tuple) and all(_scalar(v) for v in value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float):
        return a.hex() == b.hex() if a == a else b != b  # -0.0 apart from 0.0, NaN itself
    if isinstance(a, tuple):
        return len(a) == len(b) and all(type(x) is type(y) and _same(x, y) for x, y in zip(a, b))
    return a == b
