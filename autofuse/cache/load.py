"""``autofuse.load``: a production process runs a cached plan with no tuning (and no optuna)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from autofuse import logs
from autofuse.cache.buckets import bucket_key, bucket_specs
from autofuse.cache.calls import call_key_why, captured_from, note_unkeyed, read_call, write_call
from autofuse.cache.disk import (
    entry_dir,
    read_entry,
)
from autofuse.cache.keys import (
    PLAN_FILE,
    CacheMiss,
    CacheMissWarning,
    key_for,
)
from autofuse.capture import trace
from autofuse.capture.state import buffers_kept
from autofuse.plan.planner import Planner
from autofuse.plan.steps import Plan
from autofuse.runner import OptimizedFunction
from autofuse.settings import cache_home

# ---------------------------------------------------------------------------------------------
# The production entry point
# ---------------------------------------------------------------------------------------------

HINT_TRIALS = 20  # the search a miss's hint asks for (any trials= caches the winner)
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


def _load_by_call(cache_dir: Any, ck: str | None, fn: Any, cuda_graph: bool) -> Any:
    """The entry the call index names for ``ck``, ready to run (None: capture instead)."""
    record = read_call(cache_dir, ck)
    if record is None:
        return None

    key = record["plan_key"]
    plan, meta, _ = read_entry(cache_dir, key)
    if plan is None or plan.graph.key != record["graph_key"]:
        return None
    try:
        captured = captured_from(record, plan.graph)
    except Exception:  # noqa: BLE001 - an index record this torch cannot read: capture
        return None
    logs.emit("cache", f"hit: {_fn_name(fn)} (key {key}, by call, no capture)")
    opt = OptimizedFunction(captured, plan, fn, cuda_graph=cuda_graph)
    opt.cache_key = key
    opt.cache_metadata = meta
    return opt


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
    retrace: bool = False,
) -> Callable[..., Any]:
    """Run ``fn`` with the plan cached for these inputs: no tuning, no optuna.

    ``cuda_graph=True`` replays the plan as one CUDA graph over static input buffers (on CUDA;
    off, with one note, under the interpreter): see ``autofuse/plan/graphs.py``.

    The plan is found from the call itself (``autofuse/cache/calls.py``: the function's code,
    the inputs' shapes, dtypes and strides, the device and versions) with no capture when an
    earlier tuning or load recorded that call; otherwise (or with ``retrace=True``) ``fn`` is
    captured and its graph's key looked up; where no entry has that key, the entries cached by
    shape bucket (``optimize(..., dynamic=..., trials=...)``, ``cache/buckets.py``) for a graph
    of its structure are looked up, and the bucket's plan is built for these sizes.

    On a miss (or an unusable entry) it returns ``fn`` itself, run in eager, after one warning
    per key; with ``strict=True`` it raises :class:`CacheMiss` instead.
    """
    cache_dir = cache_home(cache_dir)
    ck, why = (None, None) if retrace else call_key_why(fn, example_inputs, options)
    if why is not None:
        note_unkeyed(fn, why)
    fast = _load_by_call(cache_dir, ck, fn, cuda_graph)
    if fast is not None:
        return fast
    captured, why = _capture(fn, example_inputs)
    if captured is None:  # optimize runs it on the backend path: no plan to load
        hint = (
            "optimize() runs such code through the torch.compile backend path, whose plans are "
            "not cached for load: call torch.compile(fn, backend='autofuse') in this process"
        )
        return _missed(fn, "", why, hint, strict, os.path.abspath(cache_dir))
    entries = Entries(cache_dir, _fn_name(fn))
    hit = Planner(captured.graph).first_fit(entries.offered(captured, example_inputs, options))
    if hit is not None:
        entry = hit.tuning
        if entry.by_bucket:
            logs.emit("cache", f"hit: {_fn_name(fn)} (key {entry.key}, by bucket)")
        else:
            write_call(cache_dir, ck, entry.key, captured)
        opt = OptimizedFunction(captured, hit.plan, fn, cuda_graph=cuda_graph)
        opt.cache_key = entry.key
        opt.cache_metadata = entry.meta
        return opt
    key, buckets = entries.key, entries.buckets
    why, hint = _miss_text(_fn_name(fn), key, entries.problem, cache_dir)
    if buckets:
        why += (f"; {buckets} shape bucket(s) of its graph are cached, none holding these "
                "sizes (with these dtypes, layouts and static sizes)")  # fmt: skip
    return _missed(fn, key, why, hint, strict, os.path.abspath(cache_dir))


def _capture(fn: Any, example_inputs: Sequence[Any]) -> tuple[Any, str | None]:
    """(captured, None), or (None, why) where ``fn`` cannot be captured as one plan."""
    try:
        with buffers_kept(fn):  # capturing a module in train mode moves no statistics
            return trace.capture(fn, example_inputs), None
    except trace.TraceUnsupported as e:
        return None, f"{_fn_name(fn)} cannot be captured as one plan ({e})"


@dataclass(frozen=True)
class Entry:
    """A cached entry offered to the planner: its key, its metadata, whether it is a shape
    bucket's (its plan made at another size of the bucket)."""

    key: str
    meta: dict
    by_bucket: bool


class Entries:
    """The cache under ``cache_dir`` as ``load`` offers it to the planner for a captured call
    (``Planner.first_fit`` takes the first plan that runs the graph): the entry of the call's
    key, then those of the shape buckets indexed for its graph's structure
    (``cache/buckets.py``). After the offer: ``key`` (the exact key), ``problem`` (why its
    entry is unusable; None for a plain miss) and ``buckets`` (the bucket specs indexed)."""

    def __init__(self, cache_dir: Any, name: str) -> None:
        self.cache_dir, self.name = cache_dir, name
        self.key, self.problem, self.buckets = "", None, 0

    def offered(self, captured: Any, example_inputs: Sequence[Any],
                options: dict | None) -> Iterator[tuple[Plan, Entry]]:  # fmt: skip
        self.key = key = key_for(captured, example_inputs, options)
        plan, meta, self.problem = read_entry(self.cache_dir, key)
        if plan is not None and plan.graph.key != captured.graph.key:  # (key: NaN-safe compare)
            plan = None
            self.problem = f"{entry_dir(self.cache_dir, key) / PLAN_FILE}: holds another graph"
        logs.emit("cache", f"{'hit' if plan is not None else 'miss'}: {self.name} (key {key})")
        if plan is not None:
            yield plan, Entry(key, meta, False)
        specs = bucket_specs(self.cache_dir, captured.graph)
        self.buckets = len(specs)
        for spec in specs:
            bkey, _ = bucket_key(captured, example_inputs, spec, options)
            plan, meta, _ = read_entry(self.cache_dir, bkey)
            if plan is not None:
                yield plan, Entry(bkey, meta, True)


def _miss_text(name: str, key: str, problem: str | None, cache_dir: Any) -> tuple[str, str]:
    """Why a miss of entry ``key`` ran ``name`` in eager, and how to fill the entry."""
    why = f"the cached entry is unusable: {problem}" if problem else "no cached plan"
    why = f"{why} for {name} (key {key}) in {os.fspath(cache_dir)!r}"
    hint = (
        f"Run autofuse.optimize({name}, example_inputs, trials={HINT_TRIALS}, "
        f"cache_dir={os.fspath(cache_dir)!r}) with the same inputs (shapes, dtypes, device) and "
        "options first: a search (trials=) tunes and caches a plan (without trials, optimize "
        "builds the greedy plan and caches nothing)."
    )
    return why, hint


def _missed(fn: Any, key: str, why: str, hint: str, strict: bool, where: str) -> Any:
    """A miss: :class:`CacheMiss` with ``strict``, else ``fn`` in eager after one warning."""
    msg = f"autofuse: {why}. {hint}"
    if strict:
        raise CacheMiss(msg)
    if (where, key or why) not in _WARNED:
        _WARNED.add((where, key or why))
        name = _fn_name(fn)
        warnings.warn(msg + f" Running {name} in eager PyTorch.", CacheMissWarning, stacklevel=3)
    return EagerFunction(fn, key, why)
