"""The tuner's side of the search library: parameter and study names, the measurer, the
callback that draws the progress bar and logs each trial.

Parameter names are for people (optuna-dashboard, ``AUTOFUSE_LOGS=search``) and stable for a
graph, so a resumed study finds them again: ``fuse:mul→add`` per partition edge (see
``Partitioner.edge_names``) and ``kernel:mul#3+add#4+sigmoid#5`` per fusion group (the launch
config of the kernel those ops share; node ids keep two groups of the same ops apart).
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

import search
from autofuse import logs
from autofuse.measure import CostModel, GPUTimer, Isolated

STUDY_VERSION = "v2"  # bumped when parameter names change: an old study is never mixed in
_MAX_PARAM = 160  # Optuna stores parameter names in 512 characters; keep them readable


def group_param(graph: Any, group: frozenset[int]) -> str:
    """The config parameter of the kernel for ``group``: its ops with their node ids."""
    ops = [f"{graph[i].op}#{i}" for i in sorted(group)]
    name = "kernel:" + "+".join(ops)
    if len(name) <= _MAX_PARAM:
        return name
    digest = hashlib.sha1(",".join(map(str, sorted(group))).encode()).hexdigest()[:8]
    return f"kernel:{'+'.join(ops[:3])}+…+{'+'.join(ops[-2:])} ({len(ops)} ops, {digest})"


def study_name(source_name: str, graph_key: str, device: str) -> str:
    return f"autofuse-{STUDY_VERSION}-{source_name}-{graph_key}-{device.replace(' ', '_')}"


def default_measurer(verify: bool = True, isolate: bool | float = False) -> Any:
    """GPU timer on CUDA machines, else the analytical cost model (labelled 'modeled'); with
    ``isolate`` (True, or a time-out in seconds) either runs in a worker process."""
    import torch

    gpu = torch.cuda.is_available()
    if isolate:
        return isolated(("gpu" if gpu else "cost_model", {"verify": verify}), isolate)
    return GPUTimer(verify=verify) if gpu else CostModel(verify=verify)


def isolated(inner: Any, isolate: bool | float) -> Any:
    """``inner`` (a measurer object or spec) run in a worker process: a measurement that hangs
    past the time-out (``isolate`` seconds; True: 60 s) is killed and scores as failed. A
    measurer that cannot be sent to a worker (not picklable) raises ``TypeError`` here."""
    if isinstance(inner, Isolated):
        return inner
    timeout = 60.0 if isolate is True else float(isolate)
    try:
        return Isolated(inner, timeout_s=timeout)
    except Exception as e:  # noqa: BLE001 - pickling errors come in many types
        raise TypeError(
            f"isolate=True: the measurer {inner!r} cannot run in a worker process "
            f"(it must be picklable): {type(e).__name__}: {e}"
        ) from e


def describe_trial(record: search.TrialRecord, best: search.TrialRecord | None) -> str:
    """One line per trial, in µs: ``trial 7: 12.3µs (best 11µs) fuse:mul→add=True ...``."""
    format_us = logs.us
    if record.state is search.TrialState.COMPLETE:
        source = record.notes.get("source", "")
        what = f"{format_us(record.value)}{f' ({source})' if source else ''}"
    else:
        what = f"{record.state.value.lower()}: {record.reason}"
    params = " ".join(f"{k}={v}" for k, v in record.params.items())
    best_s = format_us(best.value) if best is not None else "-"
    return f"trial {record.number}: {what} (best {best_s}) {params}"


class OnTrial:
    """``Study.optimize``'s callback: the progress bar (if any) and the ``search`` log."""

    def __init__(self, study: search.Study, total: int | None, progress: bool, desc: str):
        self.bar = study.progress_bar(total, desc, file=sys.stderr) if progress else None

    def __call__(self, record: search.TrialRecord, best: search.TrialRecord | None) -> None:
        if logs.enabled("search"):
            logs.emit("search", describe_trial(record, best))
        if self.bar is not None:
            self.bar(record, best)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
