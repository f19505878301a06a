"""A persistent, resumable study driven trial by trial with Optuna's ask/tell."""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real
from typing import Any

import optuna

from ._errors import TrialFailed, TrialPruned
from ._records import (
    DURATION_KEY,
    INTERRUPTED_REASON,
    OWNER_KEY,
    REASON_KEY,
    STORED_STATES,
    TO_OPTUNA,
    TrialRecord,
    TrialState,
    best_of,
    is_better,
    record_from_frozen,
)
from ._samplers import ExhaustiveSampler, SamplerSpec, build_sampler, sampler_spec
from ._space import OptunaTrial, Trial
from ._storage import resolve_storage

Objective = Callable[[Trial], float]
OnTrial = Callable[[TrialRecord, "TrialRecord | None"], None]
EXHAUSTED_KEY = "autofuse.exhausted"
_OptunaState = optuna.trial.TrialState


@dataclass(frozen=True)
class Budget:
    """When ``optimize`` stops: ``trials`` counts every trial of the study (earlier runs too, so
    a resumed run finishes the budget); ``seconds`` is the wall time of one ``optimize`` call.
    The first limit reached wins."""

    trials: int | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if self.trials is None and self.seconds is None:
            raise ValueError("expected a Budget with trials and/or seconds, got neither")
        if self.trials is not None and (not isinstance(self.trials, int) or self.trials < 0):
            raise ValueError(f"expected Budget.trials to be an int >= 0, got {self.trials!r}")
        if self.seconds is not None and not (
            isinstance(self.seconds, Real) and self.seconds >= 0 and math.isfinite(self.seconds)
        ):
            raise ValueError(
                f"expected Budget.seconds to be a finite number >= 0, got {self.seconds!r}"
            )


@dataclass(frozen=True)
class _Outcome:
    state: TrialState
    value: float | None = None
    reason: str | None = None


class Study:
    """A minimizing study in persistent storage; open it again by name to resume."""

    def __init__(self, study: optuna.Study, spec: SamplerSpec) -> None:
        self._study = study
        self.spec = spec
        self.name: str = study.study_name

    @classmethod
    def open(
        cls,
        name: str,
        *,
        storage: str | None = None,
        cache_dir: str | os.PathLike[str] = ".autofuse_cache",
        sampler: str | SamplerSpec = "tpe",
    ) -> Study:
        """Create the study ``name`` or resume it; trials left RUNNING by a dead process on
        this host are recorded as FAIL with reason "interrupted (process died)"."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"expected a non-empty str study name, got {name!r}")
        spec = sampler_spec(sampler)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        resolved = resolve_storage(storage, cache_dir)
        study = optuna.create_study(
            study_name=name, storage=resolved, direction="minimize", load_if_exists=True
        )
        _fail_dead_trials(study)
        study.sampler = build_sampler(spec, seed_offset=len(study.get_trials(deepcopy=False)))
        return cls(study, spec)

    def enqueue(self, params: dict[str, Any]) -> None:
        """Evaluate ``params`` before any sampled point, unless an identical point is already
        enqueued or was tried. Parameters the objective asks for but ``params`` lacks are
        sampled."""
        if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
            raise TypeError(f"expected a dict with str keys, got {params!r}")
        self._study.enqueue_trial(dict(params), skip_if_exists=True)

    def optimize(
        self, objective: Objective, budget: Budget, on_trial: OnTrial | None = None
    ) -> TrialRecord | None:
        """Run trials until ``budget`` is spent (or an exhaustive search has tried every
        point); ``on_trial(record, best_so_far)`` runs after each. Returns the best record."""
        if not isinstance(budget, Budget):
            raise TypeError(f"expected a search.Budget, got {type(budget).__name__}")
        started = time.monotonic()
        best = self.best
        while self._budget_left(budget, started) and not self._exhausted():
            record = self._run_trial(objective)
            if is_better(record, best):
                best = record
            if on_trial is not None:
                on_trial(record, best)
        return self.best

    @property
    def trials(self) -> list[TrialRecord]:
        """Every started trial (enqueued ones not yet run are left out), by number."""
        frozen = self._study.get_trials(deepcopy=False, states=STORED_STATES)
        return [record_from_frozen(t) for t in sorted(frozen, key=lambda t: t.number)]

    @property
    def best(self) -> TrialRecord | None:
        """The COMPLETE trial with the lowest value, or None."""
        return best_of(self.trials)

    def _budget_left(self, budget: Budget, started: float) -> bool:
        if budget.seconds is not None and time.monotonic() - started >= budget.seconds:
            return False
        if budget.trials is None:
            return True
        # RUNNING trials here belong to other processes sharing the study: count them too.
        return len(self._study.get_trials(deepcopy=False, states=STORED_STATES)) < budget.trials

    def _exhausted(self) -> bool:
        sampler = self._study.sampler
        if not isinstance(sampler, ExhaustiveSampler):
            return False
        if sampler.exhausted:
            self._study.set_user_attr(EXHAUSTED_KEY, True)
            return True
        if not self._study.user_attrs.get(EXHAUSTED_KEY, False):
            return False
        # Exhausted by an earlier run: only enqueued points are left to evaluate.
        return not self._study.get_trials(deepcopy=False, states=(_OptunaState.WAITING,))

    def _run_trial(self, objective: Objective) -> TrialRecord:
        trial = self._study.ask()
        trial.set_user_attr(OWNER_KEY, _owner())
        handle = OptunaTrial(trial)
        start = time.perf_counter()
        try:
            outcome = _evaluate(objective, handle)
        except BaseException as exc:  # KeyboardInterrupt, SystemExit: record, then re-raise
            self._finish(
                trial, _Outcome(TrialState.FAIL, reason=f"interrupted ({type(exc).__name__})"), None
            )
            raise
        duration = time.perf_counter() - start
        self._finish(trial, outcome, duration)
        return TrialRecord(
            number=trial.number,
            state=outcome.state,
            params=handle.params,
            value=outcome.value,
            reason=outcome.reason,
            duration_s=duration,
            notes=dict(handle.notes),
        )

    def _finish(self, trial: optuna.trial.Trial, outcome: _Outcome, duration: float | None) -> None:
        trial.set_user_attr(DURATION_KEY, duration)
        if outcome.reason is not None:
            trial.set_user_attr(REASON_KEY, outcome.reason)
        if outcome.state is TrialState.COMPLETE:
            self._study.tell(trial, outcome.value)
        else:
            self._study.tell(trial, state=TO_OPTUNA[outcome.state])


def _evaluate(objective: Objective, trial: OptunaTrial) -> _Outcome:
    """Run the objective; every Exception becomes a FAIL/PRUNED outcome with a reason."""
    try:
        value = objective(trial)
    except TrialFailed as exc:
        return _Outcome(TrialState.FAIL, reason=exc.reason)
    except TrialPruned as exc:
        return _Outcome(TrialState.PRUNED, reason=exc.reason)
    except optuna.TrialPruned as exc:
        return _Outcome(TrialState.PRUNED, reason=str(exc) or "pruned")
    except Exception as exc:
        return _Outcome(TrialState.FAIL, reason=f"{type(exc).__name__}: {exc}")
    return _outcome_of_value(value)


def _outcome_of_value(value: object) -> _Outcome:
    if not isinstance(value, Real) or isinstance(value, bool):
        return _Outcome(
            TrialState.FAIL,
            reason=f"expected the objective to return a float, got {type(value).__name__}",
        )
    number = float(value)
    if not math.isfinite(number):
        return _Outcome(TrialState.FAIL, reason="non-finite value")
    return _Outcome(TrialState.COMPLETE, value=number)


def _owner() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _owner_alive(owner: object) -> bool:
    """Whether the process that started a RUNNING trial may still be running it.

    A trial with no owner record, or owned by a dead process on this host, is dead. Owners on
    other hosts cannot be checked and are assumed alive."""
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int):
        return False
    if owner.get("host") != socket.gethostname():
        return True
    return _pid_alive(owner["pid"])


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    if os.name != "posix":
        return True  # no safe liveness probe; leave the trial alone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _fail_dead_trials(study: optuna.Study) -> None:
    """Record trials left RUNNING by dead processes as FAIL "interrupted (process died)"."""
    for frozen in study.get_trials(deepcopy=False, states=(_OptunaState.RUNNING,)):
        if _owner_alive(frozen.user_attrs.get(OWNER_KEY)):
            continue
        try:
            study._storage.set_trial_user_attr(frozen._trial_id, REASON_KEY, INTERRUPTED_REASON)
            study._storage.set_trial_user_attr(frozen._trial_id, DURATION_KEY, None)
            study.tell(frozen.number, state=_OptunaState.FAIL, skip_if_finished=True)
        except RuntimeError:
            continue  # finished by its owner meanwhile
