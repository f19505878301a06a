"""The cache and the search as the planner (``plan/planner.py``) is handed them: reuse the plan
an earlier tuning run cached, or tune and cache the winner.

Asking for more trials than a cached plan was tuned with continues that plan's study (kept in
the study storage, by default under ``cache_dir``) up to the new count; ``retune=True`` starts a
fresh study.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from typing import Any

from autofuse import logs
from autofuse.cache.buckets import BucketSpec, bucket_key, note_bucket
from autofuse.cache.calls import call_key, write_call
from autofuse.cache.disk import load_metadata, load_plan, save_plan
from autofuse.cache.keys import DeviceInfo, inputs_device, key_for, key_parts
from autofuse.capture import Captured
from autofuse.files import ensure_writable
from autofuse.partition import Partitioner
from autofuse.plan import Plan
from autofuse.settings import cache_home
from autofuse.tune.record import TuneResult


class CacheStore:
    """The plan cache under ``cache_dir`` as the planner's ``PlanStore`` (``plan/planner.py``):
    a hit is the cached plan with its search record; a cached plan tuned with fewer trials than
    ``options["trials"]`` is a miss whose study the search continues (``options`` say which)."""

    def __init__(self, cache_dir: Any = None) -> None:
        self.cache_dir = cache_home(cache_dir)

    def lookup(
        self, captured: Captured, example_inputs: Sequence[Any], options: dict
    ) -> tuple[Plan, Any] | None:
        key = self.key(captured, example_inputs)
        where = f"{captured.source_name} (key {key[:16]}…) in {self.cache_dir!r}"
        plan = load_plan(self.cache_dir, key)
        if plan is None:
            logs.emit("cache", f"miss: {where}: tuning")
            return None
        meta = load_metadata(self.cache_dir, key) or {}
        study = _continued_study(meta, options, where)
        if study is None:
            return plan, cached_result(plan, meta)
        options.setdefault("study_name", study)
        return None

    def key(self, captured: Captured, example_inputs: Sequence[Any]) -> str:
        """The entry of this graph and inputs."""
        return key_for(captured, example_inputs)

    def check_writable(self) -> None:
        ensure_writable(self.cache_dir, "cache_dir")

    def save(
        self, captured: Captured, example_inputs: Sequence[Any], result: Any, options: dict
    ) -> str:
        return cache_result(
            captured, example_inputs, result, self.cache_dir, options.get("storage")
        )

    def record_call(self, fn: Any, captured: Captured, example_inputs: Sequence[Any]) -> str:
        return record_call(fn, captured, example_inputs, self.cache_dir)


class BucketStore(CacheStore):
    """The plan cache by shape bucket (``cache/buckets.py``): the entry of the bucket of these
        inputs' dynamic sizes (a plan cached at another size of the bucket: the planner builds it for
    this one, ``Planner.fitted``)."""

    def __init__(self, cache_dir: Any, spec: BucketSpec) -> None:
        super().__init__(cache_dir)
        self.spec = spec

    def parts(self, captured: Captured, example_inputs: Sequence[Any]) -> dict:
        return bucket_key(captured, example_inputs, self.spec)[1]

    def key(self, captured: Captured, example_inputs: Sequence[Any]) -> str:
        return bucket_key(captured, example_inputs, self.spec)[0]

    def save(
        self, captured: Captured, example_inputs: Sequence[Any], result: Any, options: dict
    ) -> str:
        key, parts = bucket_key(captured, example_inputs, self.spec)
        cache_result(captured, example_inputs, result, self.cache_dir, options.get("storage"),
                     key, parts)  # fmt: skip
        note_bucket(self.cache_dir, parts)
        return key

    def record_call(self, fn: Any, captured: Captured, example_inputs: Sequence[Any]) -> str:
        ck = call_key(fn, example_inputs)
        write_call(self.cache_dir, ck, self.key(captured, example_inputs), captured)
        return ck or ""


def search(
    captured: Captured,
    example_inputs: Sequence[Any],
    space: Partitioner,
    *,
    retune: bool = False,
    **options: Any,
) -> Any:
    """The planner's ``Searcher``: ``tune`` (``retune``: in a fresh study, not a resumed one,
    unless ``options`` name one), its study storage by default under ``cache_dir``."""
    from autofuse.tune.study import study_name
    from autofuse.tune.tuner import tune

    options["cache_dir"] = cache_home(options.get("cache_dir"))
    if retune and not options.get("study_name"):
        options["study_name"] = study_name(
            captured.source_name, captured.graph.key, f"retune-{time.time_ns()}"
        )
    return tune(captured, example_inputs, space, **options)


def planning(cache_dir: Any = None) -> tuple[CacheStore, Any]:
    """(the cache under ``cache_dir``, the search): what ``Planner.tuned`` is handed."""
    return CacheStore(cache_dir), search


def cache_result(
    captured: Captured,
    example_inputs: Sequence[Any],
    result: Any,
    cache_dir: Any,
    storage: Any = None,
    key: str | None = None,
    parts: dict | None = None,
) -> str:
    """Save a tuning result's plan as the cache entry of this graph and inputs (what
    ``autofuse.load`` finds), ``parts`` its key's parts (default: the exact key's); returns
    its key."""
    key = key or key_for(captured, example_inputs)
    device = DeviceInfo.current(inputs_device(example_inputs))
    meta = {
        "function": captured.source_name,
        "value_s": result.value,
        "source": result.source,
        "trials": result.trials,
        "study": result.study_name,
        "kernel_times_s": {k: v[0] for k, v in result.kernel_times.items()},
        "baselines_s": {  # for speedups in `autofuse cache list / show` and a hit's report
            k: getattr(result, f"{k}_value", None)
            for k in ("greedy", "unfused", "eager", "library")
        },
        "key_parts": parts or key_parts(captured, device),
    }
    if storage is None or isinstance(storage, str):
        meta["storage"] = storage
    save_plan(cache_dir, key, result.plan, meta)
    where = f"{captured.source_name} (key {key[:16]}…) in {str(cache_dir)!r}"
    logs.emit("cache", f"saved: {where} ({result.trials} trials, study {result.study_name})")
    return key


def cached_result(plan: Plan, meta: dict) -> Any:
    """The search record of a cached plan, as its entry keeps it (times, trials, baselines), for
    the report of a cache hit; None where the entry has no times."""
    value, source = meta.get("value_s"), str(meta.get("source") or "modeled")
    times, base = meta.get("kernel_times_s"), meta.get("baselines_s") or {}
    if not isinstance(value, (int, float)) or not isinstance(times, dict):
        return None

    def number(k: str) -> float | None:
        v = base.get(k) if isinstance(base, dict) else None
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    return TuneResult(
        plan, float(value), source, number("greedy"), number("unfused"), number("eager"),
        int(meta.get("trials") or 0), 0, 0.0, library_value=number("library"), cached=True,
        kernel_times={str(k): (float(t), source) for k, t in times.items()
                      if isinstance(t, (int, float))},
        study_name=str(meta.get("study") or ""),
    )  # fmt: skip


def record_call(fn: Any, captured: Captured, example_inputs: Sequence[Any], cache_dir: Any) -> str:
    """Index the cached plan by this call, so ``autofuse.load`` reaches it with no capture;
    returns the call key ("" where the call has none: load captures then)."""
    ck = call_key(fn, example_inputs)
    write_call(cache_home(cache_dir), ck, key_for(captured, example_inputs), captured)
    return ck or ""


def _continued_study(meta: dict, options: dict, where: str) -> str | None:
    """The study to tune on when ``options`` ask for more trials than the cached plan had,
    else None (the cached plan is used as it is)."""
    asked, tuned, study = options.get("trials"), meta.get("trials"), meta.get("study")
    if not asked or not isinstance(tuned, int) or tuned >= asked:
        logs.emit("cache", f"hit: {where} (tuned with {tuned} trials)")
        return None
    same_storage = options.get("storage") == meta.get("storage")
    if isinstance(study, str) and study and same_storage:
        logs.emit("cache", f"hit: {where}: tuned with {tuned} trials; continuing study {study} "
                           f"up to {asked}")  # fmt: skip
        return study
    logs.emit("cache", f"hit: {where} (tuned with {tuned} trials)")
    warnings.warn(
        f"autofuse: reused the plan cached for {where}, tuned with {tuned} trials (fewer than "
        f"the {asked} asked for) by a study that cannot be continued here (not recorded, or in "
        "another storage); pass retune=True to tune it again",
        stacklevel=3,
    )
    return None
