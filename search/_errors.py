"""Exceptions an objective raises to end a trial on purpose, and the check of a measured
time."""

from __future__ import annotations

import math
from numbers import Real


class _TrialEnd(Exception):
    """Base of the exceptions that end a trial with a recorded reason."""

    def __init__(self, reason: str) -> None:
        if not isinstance(reason, str) or not reason:
            raise TypeError(f"expected a non-empty str reason, got {reason!r}")
        super().__init__(reason)
        self.reason = reason


class TrialFailed(_TrialEnd):
    """Raised by an objective: the trial is recorded as FAIL with ``reason``."""


class TrialPruned(_TrialEnd):
    """Raised by an objective: the trial is recorded as PRUNED with ``reason``."""


def time_problem(value: object, label: str = "time", allow_negative: bool = False) -> str | None:
    """Why ``value`` is not a usable time in seconds (a finite number >= 0; any finite number
    with ``allow_negative``), or None."""
    if not isinstance(value, Real) or isinstance(value, bool):
        return f"expected {label} to be a number of seconds, got {type(value).__name__} {value!r}"
    number = float(value)
    if not math.isfinite(number):
        return f"expected {label} to be finite, got {number!r}"
    if number < 0 and not allow_negative:
        return f"expected {label} to be >= 0 seconds, got {number!r}"
    return None


def check_time(value: object, label: str = "time") -> float:
    """``value`` as a float when it is a finite number of seconds >= 0; otherwise raises
    :class:`TrialFailed` with the reason, so the trial fails instead of recording it."""
    problem = time_problem(value, label)
    if problem is not None:
        raise TrialFailed(problem)
    return float(value)  # type: ignore[arg-type]
