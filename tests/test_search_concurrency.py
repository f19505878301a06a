"""Many processes on one study: creation races, a shared trial budget, no lost or duplicated
trials. Workers are forked from one driver process (``python -c``, without torch) that imported
``search`` once, and start each step together at a barrier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest

import search
from search import Budget, Study, TrialState

REPO = Path(__file__).resolve().parents[1]

CREATE_DRIVER = r"""
import json, multiprocessing as mp, sys
import search

def worker(storages, barrier, queue):
    for storage in storages:
        barrier.wait()
        try:
            search.Study.open("race", storage=storage, sampler="random")
            queue.put(None)
        except Exception as exc:
            queue.put(f"{type(exc).__name__}: {exc}"[:300])

storages, n = json.loads(sys.argv[1]), int(sys.argv[2])
ctx = mp.get_context("fork")
barrier, queue = ctx.Barrier(n), ctx.Queue()
procs = [ctx.Process(target=worker, args=(storages, barrier, queue)) for _ in range(n)]
for p in procs:
    p.start()
results = [queue.get(timeout=120) for _ in range(n * len(storages))]
for p in procs:
    p.join(timeout=60)
print(json.dumps(results))
"""

BUDGET_DRIVER = r"""
import json, multiprocessing as mp, os, sys, time
import optuna
import search

ENQUEUED = [{"x": 3}, {"x": 7}]
_ask = optuna.Study.ask

def slow_ask(self, *args, **kwargs):  # a slow sampler or storage: widens any check-then-ask gap
    time.sleep(0.03)
    return _ask(self, *args, **kwargs)

optuna.Study.ask = slow_ask

def worker(storage, budget, barrier, queue):
    barrier.wait()
    try:
        study = search.Study.open("shared", storage=storage, sampler="random")
        for params in ENQUEUED:
            study.enqueue(params)
        ran = []
        def objective(trial):
            ran.append(trial.number)
            time.sleep(0.02)
            return float(trial.integer("x", 0, 50))
        study.optimize(objective, search.Budget(trials=budget))
        queue.put({"pid": os.getpid(), "ran": ran, "error": None})
    except Exception as exc:
        queue.put({"pid": os.getpid(), "ran": [], "error": f"{type(exc).__name__}: {exc}"})

storage, budget, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ctx = mp.get_context("fork")
barrier, queue = ctx.Barrier(n), ctx.Queue()
procs = [ctx.Process(target=worker, args=(storage, budget, barrier, queue)) for _ in range(n)]
for p in procs:
    p.start()
results = [queue.get(timeout=240) for _ in range(n)]
for p in procs:
    p.join(timeout=60)
print(json.dumps(results))
"""


def run_driver(code: str, *args: str, timeout: float = 300) -> list:
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def storage_for(kind: str, tmp_path: Path, tag: str = "s") -> str:
    return f"sqlite:///{tmp_path}/{tag}.db" if kind == "sqlite" else f"{tmp_path}/{tag}.log"


def check_shared_budget(storage: str, budget: int, workers: int) -> list[dict]:
    """Run ``workers`` processes sharing ``Budget(trials=budget)`` on ``storage`` and check
    that together they ran exactly ``budget`` trials, each trial number once."""
    results = run_driver(BUDGET_DRIVER, storage, str(budget), str(workers))
    assert [r["error"] for r in results] == [None] * workers
    ran = sorted(n for r in results for n in r["ran"])
    assert ran == list(range(budget))  # no trial run twice, none lost
    study = Study.open("shared", storage=storage, sampler="random")
    records = study.trials
    assert [r.number for r in records] == list(range(budget))
    assert [r.state for r in records] == [TrialState.COMPLETE] * budget
    assert study.counts == search.StudyCounts(complete=budget, failed=0, pruned=0, running=0)
    assert [r.params for r in records[:2]] == [{"x": 3}, {"x": 7}]  # enqueued points first
    # every worker enqueued both points: they were stored once (no leftover WAITING copies)
    assert study._study.get_trials(states=(optuna.trial.TrialState.WAITING,)) == []
    return results


# --- 1. concurrent creation --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("rounds", [3, pytest.param(10, marks=pytest.mark.exhaustive)])
@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_eight_processes_create_one_new_study(tmp_path, kind, rounds):
    storages = [storage_for(kind, tmp_path, f"round{r}") for r in range(rounds)]
    results = run_driver(CREATE_DRIVER, json.dumps(storages), "8")
    assert len(results) == 8 * rounds
    assert [r for r in results if r is not None] == []
    for storage in storages:  # one study per storage, not one per process
        assert [s.study_name for s in search_summaries(storage)] == ["race"]


def search_summaries(storage: str) -> list:
    return optuna.get_all_study_summaries(search.resolve_storage(storage, "."))


# --- 2 and 8. one budget shared by several workers ---------------------------------------------


@pytest.mark.parametrize("kind", [pytest.param("sqlite", marks=pytest.mark.slow), "journal"])
def test_workers_share_a_budget_exactly(tmp_path, kind):
    results = check_shared_budget(storage_for(kind, tmp_path), budget=9, workers=4)
    assert sum(len(r["ran"]) for r in results) == 9


def test_two_workers_on_one_journal_lose_and_duplicate_nothing(tmp_path):
    results = check_shared_budget(f"{tmp_path}/two.journal", budget=15, workers=2)
    assert all(r["ran"] for r in results)  # both took part


def test_worker_that_ran_nothing_can_tell_and_wait(tmp_path):
    storage = f"{tmp_path}/w.journal"
    other = Study.open("w", storage=storage, sampler="random")
    raw = other._study.ask()  # another live worker (this process) holds the only slot
    raw.set_user_attr("autofuse.owner", {"host": os.uname().nodename, "pid": os.getpid()})
    raw.suggest_int("x", 0, 9)

    late = Study.open("w", storage=storage, sampler="random")
    calls = []
    best = late.optimize(lambda t: calls.append(1) or 1.0, Budget(trials=1))
    assert calls == [] and best is None
    assert late.counts == search.StudyCounts(complete=0, failed=0, pruned=0, running=1)
    assert late.wait_for_running(timeout_s=0.2, poll_s=0.05) is False

    threading.Timer(0.3, lambda: other._study.tell(raw, 2.5)).start()
    started = time.monotonic()
    assert late.wait_for_running(timeout_s=10, poll_s=0.05) is True
    assert time.monotonic() - started < 5
    assert late.best is not None and late.best.value == 2.5
    assert late.counts.complete == 1 and late.counts.total == 1


def test_released_trials_do_not_count_and_give_back_their_point(tmp_path):
    """Storages without an exact lock: a trial asked past the budget is released unrun."""
    study = Study.open("r", storage=f"{tmp_path}/r.log", sampler="random")
    study._lock = search._locks.NoLock()
    study.enqueue({"x": 4})
    trial = study._study.ask()  # pops the enqueued point, as a worker racing past the budget
    study._release(trial)
    (released,) = study.trials
    assert (released.state, released.reason) == (TrialState.FAIL, search.BUDGET_SPENT_REASON)
    assert study.counts.total == 0
    study.optimize(lambda t: float(t.integer("x", 0, 9)), Budget(trials=2))
    done = [r for r in study.trials if r.reason is None]
    assert len(done) == 2 and done[0].params == {"x": 4}  # the point was put back
    assert study.counts.total == 2
