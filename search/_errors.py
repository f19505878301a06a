"""Exceptions an objective raises to end a trial on purpose."""

from __future__ import annotations


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
