"""``autofuse.load``: a production process runs a cached plan with no tuning (and no optuna)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from autofuse import logs
from autofuse.cache.disk import (
    _read_entry,
    entry_dir,
)
from autofuse.cache.keys import (
    PLAN_FILE,
    CacheMiss,
    CacheMissWarning,
    key_for,
)
from autofuse.settings import cache_home

# ---------------------------------------------------------------------------------------------
# The production entry point
# ---------------------------------------------------------------------------------------------

_WARNED: set[tuple[str, str]] = set()  # (cache dir, key) misses already reported


class EagerFunction:
    """What ``load`` returns on a miss: calls the original function, unchanged."""

    def __init__(self, fn: Callable[..., Any], key: str, reason: str) -> None:
        self.fn = fn
        self.__wrapped__ = fn
        self.cache_key = key
        self.reason = reason
        self.plan = None
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<autofuse eager fallback for {self.__name__} (cache key {self.cache_key})>"


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def load(
    fn: Callable[..., Any],
    example_inputs: Sequence[Any],
    *,
    cache_dir: str | os.PathLike | None = None,
    strict: bool = False,
    options: dict | None = None,
    cuda_graph: bool = False,
) -> Callable[..., Any]:
    """Run ``fn`` with the plan cached for these inputs: no tuning, no optuna.

    ``cuda_graph=True`` replays the plan as one CUDA graph over static input buffers (on CUDA;
    off, with one note, under the interpreter): see ``autofuse/plan/graphs.py``.

    On a miss (or an unusable entry) it returns ``fn`` itself, run in eager, after one warning
    per key; with ``strict=True`` it raises :class:`CacheMiss` instead.
    """
    from autofuse.capture.trace import capture
    from autofuse.runner import OptimizedFunction

    cache_dir = cache_home(cache_dir)
    captured = capture(fn, example_inputs)
    key = key_for(captured, example_inputs, options)
    plan, meta, problem = _read_entry(cache_dir, key)
    if plan is not None and plan.graph.key != captured.graph.key:  # (key: NaN-safe compare)
        plan, problem = None, f"{entry_dir(cache_dir, key) / PLAN_FILE}: holds another graph"
    logs.emit("cache", f"{'hit' if plan is not None else 'miss'}: {_fn_name(fn)} (key {key})")
    if plan is not None:
        opt = OptimizedFunction(captured, plan, fn, cuda_graph=cuda_graph)
        opt.cache_key = key
        opt.cache_metadata = meta
        return opt
    name = _fn_name(fn)
    why = f"the cached entry is unusable: {problem}" if problem else "no cached plan"
    msg = (
        f"autofuse: {why} for {name} (key {key}) in {os.fspath(cache_dir)!r}. Run "
        f"autofuse.optimize({name}, example_inputs, cache_dir={os.fspath(cache_dir)!r}) with "
        "the same inputs (shapes, dtypes, device) and options first to tune and cache a plan."
    )
    if strict:
        raise CacheMiss(msg)
    seen = (os.path.abspath(cache_dir), key)
    if seen not in _WARNED:
        _WARNED.add(seen)
        warnings.warn(msg + f" Running {name} in eager PyTorch.", CacheMissWarning, stacklevel=2)
    return EagerFunction(fn, key, why)
