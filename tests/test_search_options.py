"""Optuna objects as storage and sampler, readable parameter names, checked times and the
progress bar (µs, resumed count)."""

from __future__ import annotations

import io
import math

import optuna
import pytest

import search
from search import Budget, Study, TrialFailed, TrialState


def objective(trial: search.Trial) -> float:
    return float(trial.integer("x", 0, 20)) * 1e-6


# --- 5. Optuna storage and sampler objects -----------------------------------------------------


def storage_objects(tmp_path):
    journal = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "o.log"))
    )
    rdb = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/o.db")
    return {"journal": journal, "rdb": rdb, "memory": optuna.storages.InMemoryStorage()}


@pytest.mark.parametrize("kind", ["journal", "rdb", "memory"])
def test_storage_may_be_an_optuna_storage(tmp_path, kind):
    storage = storage_objects(tmp_path)[kind]
    study = Study.open("o", storage=storage, sampler="random")
    study.optimize(objective, Budget(trials=3))
    assert study._study._storage is storage or study._study._storage._backend is storage
    again = Study.open("o", storage=storage, sampler="random")
    assert [r.state for r in again.trials] == [TrialState.COMPLETE] * 3
    exact = kind != "memory"  # file-backed: reservation under a file lock
    assert again._lock.exact is exact


def test_sampler_may_be_an_optuna_sampler(tmp_path):
    runs = []
    for name in ("a", "b"):
        sampler = optuna.samplers.RandomSampler(seed=7)
        study = Study.open(name, storage=f"{tmp_path}/s.log", sampler=sampler)
        assert study._study.sampler is sampler and study.spec is None
        study.optimize(objective, Budget(trials=6))
        runs.append([r.params for r in study.trials])
    assert runs[0] == runs[1]
    assert len({r["x"] for r in runs[0]}) > 1


@pytest.mark.parametrize("bad", ["annealing", "", 3, None])
def test_unknown_sampler_names_the_valid_ones(tmp_path, bad):
    with pytest.raises(ValueError, match=r"unknown sampler .*'tpe', 'random', 'exhaustive'"):
        Study.open("u", storage=f"{tmp_path}/u.log", sampler=bad)
    assert not (tmp_path / "u.log").exists()  # rejected before touching the storage


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_optunas_brute_force_sampler_is_refused_with_the_alternative(tmp_path):
    with pytest.raises(ValueError, match="sampler='exhaustive'"):
        Study.open("b", storage=f"{tmp_path}/b.log", sampler=optuna.samplers.BruteForceSampler())


# --- 6. readable parameter names ---------------------------------------------------------------

NAMES = ("fuse:layernorm→linear", "kernel3.XBLOCK", "cfg[0,1] λ/µ")


def readable(trial: search.Trial) -> float:
    fused = trial.categorical(NAMES[0], [True, False])
    block = trial.pow2(NAMES[1], 16, 64)
    stages = trial.integer(NAMES[2], 1, 2)
    return (0.0 if fused else 5.0) + block / 16 + stages


@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_readable_names_are_the_stored_names(tmp_path, storage):
    url = f"sqlite:///{tmp_path}/n.db" if storage == "sqlite" else f"{tmp_path}/n.log"
    study = Study.open("n", storage=url, sampler="exhaustive")
    first = {NAMES[0]: False, NAMES[1]: 32, NAMES[2]: 2}
    study.enqueue(first)
    study.optimize(readable, Budget(trials=5))
    resumed = Study.open("n", storage=url, sampler="exhaustive")
    resumed.optimize(readable, Budget(trials=100))  # 2 x 3 x 2 points in all
    records = resumed.trials
    assert records[0].params == first
    assert len(records) == 12 and len({tuple(r.params.values()) for r in records}) == 12
    assert resumed.best.params == {NAMES[0]: True, NAMES[1]: 16, NAMES[2]: 1}
    raw = optuna.load_study(study_name="n", storage=search.resolve_storage(url, tmp_path))
    assert all(set(t.params) == set(NAMES) for t in raw.trials)  # what the dashboard shows


def test_overlong_name_fails_the_trial_with_a_reason(tmp_path):
    study = Study.open("l", storage=f"{tmp_path}/l.log", sampler="random")
    study.optimize(lambda t: float(t.integer("k" * 513, 0, 1)), Budget(trials=1))
    (record,) = study.trials
    assert record.state is TrialState.FAIL
    assert "at most 512 characters, got 513" in record.reason


# --- 4. times: negative, non-finite and non-numbers fail ---------------------------------------


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (math.nan, "expected kernel time to be finite, got nan"),
        (math.inf, "expected kernel time to be finite, got inf"),
        (-1.0, "expected kernel time to be >= 0 seconds, got -1.0"),
        ("fast", "expected kernel time to be a number of seconds, got str 'fast'"),
        (None, "expected kernel time to be a number of seconds, got NoneType None"),
        (True, "expected kernel time to be a number of seconds, got bool True"),
    ],
)
def test_check_time_rejects(value, reason):
    with pytest.raises(TrialFailed) as info:
        search.check_time(value, "kernel time")
    assert info.value.reason == reason


def test_check_time_accepts_times():
    assert search.check_time(0) == 0.0 and search.check_time(2.5e-6) == 2.5e-6


def test_a_measurer_giving_a_bad_time_fails_only_that_trial(tmp_path):
    times = {0: 3e-6, 1: -1.0, 2: math.nan, 3: math.inf, 4: "n/a", 5: 2e-6}

    def tuned(trial):
        x = trial.integer("x", 0, 5)
        return search.check_time(times[x], f"time of x={x}")

    study = Study.open("t", storage=f"{tmp_path}/t.log", sampler="exhaustive")
    best = study.optimize(tuned, Budget(trials=6))
    by_x = {r.params["x"]: r for r in study.trials}
    assert {x for x, r in by_x.items() if r.state is TrialState.COMPLETE} == {0, 5}
    assert all(by_x[x].value is None and by_x[x].reason for x in (1, 2, 3, 4))
    assert by_x[1].reason == "expected time of x=1 to be >= 0 seconds, got -1.0"
    assert best.value == 2e-6


def test_allow_negative_values(tmp_path):
    study = Study.open("n", storage=f"{tmp_path}/n.log", sampler="random", allow_negative=True)
    best = study.optimize(lambda t: -float(t.integer("x", 1, 3)), Budget(trials=4))
    assert best.value < 0 and all(r.state is TrialState.COMPLETE for r in study.trials)


# --- 7. progress bar -------------------------------------------------------------------------


def test_progress_bar_shows_microseconds():
    assert search._progress.format_us(12.5e-6) == "12.5µs"
    assert search._progress.format_us(None) == "-"


def test_resumed_progress_bar_starts_at_trials_done(tmp_path):
    storage = f"{tmp_path}/p.log"
    Study.open("p", storage=storage, sampler="random").optimize(objective, Budget(trials=11))
    study = Study.open("p", storage=storage, sampler="random")
    out = io.StringIO()
    bar = study.progress_bar(30, "tune", file=out, mininterval=0)
    assert bar.n == 11
    first_line = out.getvalue()
    assert "| 11/30 [" in first_line and "| 0/30 [" not in first_line
    assert f"best={study.best.value * 1e6:.4g}µs" in first_line  # the earlier run's best
    study.optimize(objective, Budget(trials=30), on_trial=bar)
    assert bar.n == 30 and "30/30" in out.getvalue()
    best_us = f"best={study.best.value * 1e6:.4g}µs"
    assert best_us in out.getvalue()
