"""Read-only records of trials, built from Optuna's frozen trials."""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna

# User-attribute keys this package writes on each trial; notes never use this prefix.
ATTR_PREFIX = "autofuse."
REASON_KEY = "autofuse.reason"
DURATION_KEY = "autofuse.duration_s"
OWNER_KEY = "autofuse.owner"
INTERRUPTED_REASON = "interrupted (process died)"
# A trial asked for after another worker took the budget's last slot; never run, not counted.
BUDGET_SPENT_REASON = "budget spent by other workers"


class TrialState(enum.Enum):
    """State of a trial, as recorded in the study."""

    COMPLETE = "COMPLETE"
    FAIL = "FAIL"
    PRUNED = "PRUNED"
    RUNNING = "RUNNING"

    @property
    def is_finished(self) -> bool:
        return self is not TrialState.RUNNING


_FROM_OPTUNA = {
    optuna.trial.TrialState.COMPLETE: TrialState.COMPLETE,
    optuna.trial.TrialState.FAIL: TrialState.FAIL,
    optuna.trial.TrialState.PRUNED: TrialState.PRUNED,
    optuna.trial.TrialState.RUNNING: TrialState.RUNNING,
}
TO_OPTUNA = {ours: theirs for theirs, ours in _FROM_OPTUNA.items()}
STORED_STATES = tuple(_FROM_OPTUNA)  # every state but WAITING (enqueued, not started yet)


@dataclass(frozen=True)
class TrialRecord:
    """One trial: its parameters, outcome and the notes the objective attached."""

    number: int
    state: TrialState
    params: dict[str, Any]
    value: float | None
    reason: str | None
    duration_s: float | None
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StudyCounts:
    """How many trials of a study are in each state (trials released unrun because other
    workers spent the budget are left out)."""

    complete: int
    failed: int
    pruned: int
    running: int

    @property
    def total(self) -> int:
        """Every trial counted against ``Budget.trials``."""
        return self.complete + self.failed + self.pruned + self.running


def counts_of(records: Iterable[TrialRecord]) -> StudyCounts:
    """Count ``records`` by state, leaving out trials released unrun."""
    states = [r.state for r in records if r.reason != BUDGET_SPENT_REASON]
    return StudyCounts(
        complete=states.count(TrialState.COMPLETE),
        failed=states.count(TrialState.FAIL),
        pruned=states.count(TrialState.PRUNED),
        running=states.count(TrialState.RUNNING),
    )


def notes_of(user_attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The objective's notes: user attributes without this package's own keys."""
    return {k: v for k, v in user_attrs.items() if not k.startswith(ATTR_PREFIX)}


def record_from_frozen(trial: optuna.trial.FrozenTrial) -> TrialRecord:
    """Build a record from a stored Optuna trial (WAITING trials are not accepted)."""
    if trial.state not in _FROM_OPTUNA:
        raise ValueError(
            f"expected a trial in one of {[s.name for s in STORED_STATES]}, "
            f"got trial {trial.number} in state {trial.state.name}"
        )
    state = _FROM_OPTUNA[trial.state]
    attrs = trial.user_attrs
    return TrialRecord(
        number=trial.number,
        state=state,
        params=dict(trial.params),
        value=trial.value if state is TrialState.COMPLETE else None,
        reason=attrs.get(REASON_KEY),
        duration_s=_duration_of(trial, state),
        notes=notes_of(attrs),
    )


def _duration_of(trial: optuna.trial.FrozenTrial, state: TrialState) -> float | None:
    if DURATION_KEY in trial.user_attrs:
        return trial.user_attrs[DURATION_KEY]
    if state is TrialState.RUNNING or trial.duration is None:
        return None
    return trial.duration.total_seconds()


def best_of(records: Iterable[TrialRecord]) -> TrialRecord | None:
    """The COMPLETE record with the lowest value (earliest on ties), or None."""
    complete = [
        r
        for r in records
        if r.state is TrialState.COMPLETE and r.value is not None and math.isfinite(r.value)
    ]
    if not complete:
        return None
    return min(complete, key=lambda r: (r.value, r.number))


def is_better(record: TrialRecord, best: TrialRecord | None) -> bool:
    """True when ``record`` is COMPLETE and strictly better than ``best``."""
    if record.state is not TrialState.COMPLETE or record.value is None:
        return False
    return best is None or best.value is None or record.value < best.value
