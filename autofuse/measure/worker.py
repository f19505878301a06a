"""The measurement worker process behind :class:`autofuse.measure.Isolated`.

Protocol on one duplex pipe: the worker sends ``("ready", pid)`` once its measurer is built (or
``("error", reason)``); then for each job ``(kind, id, payload)`` it answers ``("started", id)``
at once and ``("result", id, value)`` when done. ``kind`` is ``"measure"`` (payload: a
Candidate; value: a Measurement) or ``"eager"`` (payload: a standalone graph of one eager op;
value: seconds). ``("stop",)`` ends it. After a CUDA error the worker exits (code 3): the
process's CUDA context is unusable.

This module imports no Triton at the top (``main`` does, first thing in the child), so the
environment (``TRITON_INTERPRET``, ``AUTOFUSE_*``) is in place before Triton is imported there.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from autofuse.measure.candidate import Measurement, describe_error, is_fatal
from autofuse.measure.cost_model import CostModel
from autofuse.measure.timer import GPUTimer

FATAL_EXIT = 3
_NAMED = ("cost_model", "gpu")


def check_spec(spec: Any) -> None:
    """Raise ValueError / TypeError for a spec the worker could not build (checked in the
    parent, so a bad spec fails at once rather than in every job)."""
    if isinstance(spec, tuple):
        if len(spec) != 2 or not isinstance(spec[0], str) or not isinstance(spec[1], dict):
            raise ValueError(f"measurer spec must be (name, kwargs), got {spec!r}")
        if spec[0] not in _NAMED and ":" not in spec[0]:
            raise ValueError(
                f"unknown measurer {spec[0]!r}: use 'cost_model', 'gpu' or 'module:factory'"
            )
        return
    if not hasattr(spec, "measure"):
        raise TypeError(f"{spec!r} is neither a (name, kwargs) spec nor a measurer")
    import pickle

    pickle.dumps(spec)


def build(spec: Any) -> Any:
    if not isinstance(spec, tuple):
        return spec
    name, kwargs = spec
    if name == "cost_model":
        return CostModel(**kwargs)
    if name == "gpu":
        return GPUTimer(**kwargs)
    mod, _, attr = name.partition(":")
    return getattr(importlib.import_module(mod), attr)(**kwargs)


def _warm_imports() -> None:
    import torch  # noqa: F401
    import triton  # noqa: F401
    import triton.language  # noqa: F401

    from autofuse.plan import runtime  # noqa: F401


def main(conn: Any, spec: Any, env: dict[str, str]) -> None:
    os.environ.update(env)
    try:
        _warm_imports()
        measurer = build(spec)
    except BaseException as e:  # noqa: BLE001
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return

    source = getattr(measurer, "source", "measured")
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "stop":
            return
        kind, job, payload = msg
        conn.send(("started", job))
        fatal = False
        try:
            if kind == "measure":
                result = measurer.measure(payload)
                fatal = is_fatal(result.failure)
            elif kind == "eager":
                out = payload.outputs[0]
                if hasattr(measurer, "eager_time_of"):
                    result = float(measurer.eager_time_of(payload))
                else:
                    result = float(CostModel().eager_time(payload, out))
            else:
                result = Measurement.failed(f"unknown job kind {kind!r}", source)
        except Exception as e:  # noqa: BLE001
            reason = describe_error(e)
            fatal = is_fatal(reason)
            result = Measurement.failed(f"worker error: {reason}", source)
        conn.send(("result", job, result))
        if fatal:
            conn.close()
            os._exit(FATAL_EXIT)
