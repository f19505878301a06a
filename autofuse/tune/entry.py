"""Tune a captured graph, or reuse the plan an earlier tuning run cached; cache the winner."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from autofuse.cache.disk import load_plan, save_plan
from autofuse.cache.keys import DeviceInfo, inputs_device, key_for, key_parts
from autofuse.capture import Captured
from autofuse.partition import Partitioner
from autofuse.plan import Plan
from autofuse.settings import cache_home


def tune_and_cache(
    captured: Captured,
    example_inputs: Sequence[Any],
    space: Partitioner,
    *,
    retune: bool = False,
    example_flat: Sequence[Any] | None = None,
    **options: Any,
) -> tuple[Plan, Any]:
    """The cached plan for this graph and inputs (``(plan, None)``), or a tuned one saved under
    ``cache_dir`` (``(plan, TuneResult)``)."""
    from autofuse.tune.tuner import tune

    cache_dir = options["cache_dir"] = cache_home(options.get("cache_dir"))
    key = key_for(captured, example_inputs)
    if not retune:
        plan = load_plan(cache_dir, key)
        if plan is not None:
            return plan, None
    if retune and not options.get("study_name"):  # a fresh study, not a resumed one
        options["study_name"] = (
            f"autofuse-{captured.source_name}-{captured.graph.key}-{time.time_ns()}"
        )
    result = tune(captured, example_inputs, space, example_flat=example_flat, **options)
    meta = {
        "function": captured.source_name,
        "value_s": result.value,
        "source": result.source,
        "trials": result.trials,
        "kernel_times_s": {k: v[0] for k, v in result.kernel_times.items()},
        "baselines_s": {  # for speedups in `autofuse cache list / show`
            k: getattr(result, f"{k}_value", None) for k in ("greedy", "unfused", "eager")
        },
        "key_parts": key_parts(captured, DeviceInfo.current(inputs_device(example_inputs))),
    }
    save_plan(cache_dir, key, result.plan, meta)
    return result.plan, result
