"""A persistent, resumable study driven trial by trial with Optuna's ask/tell."""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real
from typing import Any

import optuna

from ._errors import TrialFailed, TrialPruned, time_problem
from ._locks import NoLock, StorageLock
from ._open import create_or_load
from ._owners import fail_dead_trials, owner_alive, this_owner
from ._progress import ProgressBar
from ._records import (
    BUDGET_SPENT_REASON,
    DURATION_KEY,
    OWNER_KEY,
    REASON_KEY,
    STORED_STATES,
    TO_OPTUNA,
    StudyCounts,
    TrialRecord,
    TrialState,
    best_of,
    counts_of,
    is_better,
    record_from_frozen,
)
from ._samplers import ExhaustiveSampler, SamplerSetting, SamplerSpec, resolve_sampler
from ._space import OptunaTrial, Trial
from ._storage import StorageSetting, storage_lock, storage_target

Objective = Callable[[Trial], float]
OnTrial = Callable[[TrialRecord, "TrialRecord | None"], None]
EXHAUSTED_KEY = "autofuse.exhausted"
_OptunaState = optuna.trial.TrialState


@dataclass(frozen=True)
class Budget:
    """When ``optimize`` stops: ``trials`` counts every trial of the study (earlier runs and
    other workers too, so a resumed run finishes the budget and workers sharing a study share
    it); ``seconds`` is the wall time of one ``optimize`` call. The first limit reached wins."""

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
    """A minimizing study of times (seconds) in persistent storage; open it again by name to
    resume, or from several processes at once to share it."""

    def __init__(
        self,
        study: optuna.Study,
        spec: SamplerSpec | None,
        lock: StorageLock | None = None,
        allow_negative: bool = False,
    ) -> None:
        self._study = study
        self._lock: StorageLock = NoLock() if lock is None else lock
        self._allow_negative = allow_negative
        self.spec = spec  # None when the caller gave an Optuna sampler object
        self.name: str = study.study_name

    @classmethod
    def open(
        cls,
        name: str,
        *,
        storage: StorageSetting = None,
        cache_dir: str | os.PathLike[str] = ".autofuse_cache",
        sampler: SamplerSetting = "tpe",
        allow_negative: bool = False,
    ) -> Study:
        """Create the study ``name`` or resume it. Safe when many processes open one new
        study at once. A damaged SQLite or journal file is renamed ``*.corrupt-<timestamp>``
        (with a :class:`DamagedStorageWarning`) and a fresh study starts. Trials left RUNNING
        by a dead process on this host are recorded as FAIL "interrupted (process died)".

        ``storage``: None (SQLite file in ``cache_dir``), a path, a URL, or an
        ``optuna.storages.BaseStorage``. ``sampler``: "tpe", "random", "exhaustive", a
        :class:`SamplerSpec` or an ``optuna.samplers.BaseSampler``. Objective values are times:
        negative ones fail their trial unless ``allow_negative``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"expected a non-empty str study name, got {name!r}")
        if not isinstance(sampler, optuna.samplers.BaseSampler):
            resolve_sampler(sampler)  # a bad name fails before any storage is touched
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        target = storage_target(storage, cache_dir)
        lock = storage_lock(target)
        study = create_or_load(name, target, lock)
        with lock.hold(_study_key(name)):
            fail_dead_trials(study)
        spec, study.sampler = resolve_sampler(sampler, len(study.get_trials(deepcopy=False)))
        return cls(study, spec, lock, allow_negative)

    def enqueue(self, params: dict[str, Any]) -> None:
        """Evaluate ``params`` before any sampled point, unless an identical point is already
        enqueued or was tried. Parameters the objective asks for but ``params`` lacks are
        sampled."""
        if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
            raise TypeError(f"expected a dict with str keys, got {params!r}")
        with self._lock.hold(_study_key(self.name)):  # two workers enqueue a point once
            self._study.enqueue_trial(dict(params), skip_if_exists=True)

    def optimize(
        self, objective: Objective, budget: Budget, on_trial: OnTrial | None = None
    ) -> TrialRecord | None:
        """Run trials until ``budget`` is spent (or an exhaustive search has tried every
        point); ``on_trial(record, best_so_far)`` runs after each. Returns the best record.

        With workers sharing the study, each trial slot of ``budget.trials`` is reserved
        before its trial runs, so the workers together run exactly that many. A worker may run
        none (others took every slot): its best is then None while their trials are RUNNING;
        see :attr:`counts` and :meth:`wait_for_running`."""
        if not isinstance(budget, Budget):
            raise TypeError(f"expected a search.Budget, got {type(budget).__name__}")
        started = time.monotonic()
        best = self.best
        while not self._out_of_time(budget, started) and not self._exhausted():
            trial = self._reserve(budget)
            if trial is None:
                break
            record = self._run_trial(objective, trial)
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

    @property
    def counts(self) -> StudyCounts:
        """Trials by state, all workers together; ``counts.total`` is what ``Budget.trials``
        is compared with."""
        return counts_of(self.trials)

    def wait_for_running(self, timeout_s: float | None = None, poll_s: float = 0.2) -> bool:
        """Wait until no trial is RUNNING (other workers finished theirs; trials of processes
        that died meanwhile are recorded as FAIL). False when ``timeout_s`` ran out first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            running = self._study.get_trials(deepcopy=False, states=(_RUNNING,))
            if not running:
                return True
            if any(not owner_alive(t.user_attrs.get(OWNER_KEY)) for t in running):
                with self._lock.hold(_study_key(self.name)):
                    fail_dead_trials(self._study)
                continue
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)

    def progress_bar(self, total: int | None, desc: str, **tqdm_kwargs: Any) -> ProgressBar:
        """A :class:`ProgressBar` that starts from this study's trials so far (a resumed study
        with 11 of 30 trials done starts at 11/30) and its best time."""
        counts = self.counts
        return ProgressBar(
            total, desc, initial=counts.total, failed=counts.failed, best=self.best, **tqdm_kwargs
        )

    def _out_of_time(self, budget: Budget, started: float) -> bool:
        return budget.seconds is not None and time.monotonic() - started >= budget.seconds

    def _spent(self) -> int:
        """Trials counted against ``Budget.trials``: every started trial (RUNNING ones of other
        workers too) but those released unrun."""
        frozen = self._study.get_trials(deepcopy=False, states=STORED_STATES)
        return sum(t.user_attrs.get(REASON_KEY) != BUDGET_SPENT_REASON for t in frozen)

    def _reserve(self, budget: Budget) -> optuna.trial.Trial | None:
        """Ask for the next trial when ``budget`` has a slot left, else None.

        Under an exact lock (files, PostgreSQL) counting and asking are one atomic step. Without
        one, a trial found past the budget after asking is released unrun (FAIL, reason
        "budget spent by other workers", its enqueued point put back): no overshoot either."""
        while True:
            with self._lock.hold(_study_key(self.name)):
                if budget.trials is not None and self._spent() >= budget.trials:
                    return None
                trial = self._study.ask()
                trial.set_user_attr(OWNER_KEY, this_owner())
            if self._lock.exact or budget.trials is None or self._spent() <= budget.trials:
                return trial
            self._release(trial)
            time.sleep(random.uniform(0.0, 0.05))

    def _release(self, trial: optuna.trial.Trial) -> None:
        frozen = self._study._storage.get_trial(trial._trial_id)
        trial.set_user_attr(REASON_KEY, BUDGET_SPENT_REASON)
        trial.set_user_attr(DURATION_KEY, None)
        self._study.tell(trial, state=_OptunaState.FAIL)
        fixed = frozen.system_attrs.get("fixed_params")
        if fixed:
            self._study.enqueue_trial(dict(fixed), skip_if_exists=False)

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

    def _run_trial(self, objective: Objective, trial: optuna.trial.Trial) -> TrialRecord:
        handle = OptunaTrial(trial)
        start = time.perf_counter()
        try:
            outcome = _evaluate(objective, handle, self._allow_negative)
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


_RUNNING = _OptunaState.RUNNING


def _study_key(name: str) -> str:
    return f"autofuse.search:study:{name}"


def _evaluate(objective: Objective, trial: OptunaTrial, allow_negative: bool) -> _Outcome:
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
    return _outcome_of_value(value, allow_negative)


def _outcome_of_value(value: object, allow_negative: bool = False) -> _Outcome:
    """COMPLETE with a finite time >= 0 (any finite number with ``allow_negative``), else FAIL
    with the reason."""
    problem = time_problem(value, "the objective's value", allow_negative)
    if problem is not None:
        return _Outcome(TrialState.FAIL, reason=problem)
    return _Outcome(TrialState.COMPLETE, value=float(value))  # type: ignore[arg-type]
