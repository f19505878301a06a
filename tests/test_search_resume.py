"""Resume after the process running a study was SIGKILLed mid-trial.

Counting rule: the trial the dead process left RUNNING is recorded as FAIL with reason
"interrupted (process died)" when the study is reopened, and ``Budget(trials=N)`` counts every
finished trial (COMPLETE + FAIL + PRUNED). Killed at trial 5 of 12: trials 0-4 COMPLETE, trial 5
FAIL (interrupted), and the resumed run adds trials 6-11, so 12 trials, 11 COMPLETE.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from search import Budget, Study, TrialState

REPO = Path(__file__).resolve().parents[1]
KILLED_AT = 5

VICTIM = f"""
import os, sys, time
import search

study = search.Study.open("resume", storage=sys.argv[1], sampler="tpe")

def objective(trial):
    x = trial.integer("x", 0, 100)
    trial.set_note("pid", os.getpid())
    if trial.number == {KILLED_AT}:
        os.kill(os.getpid(), 9)
    time.sleep(0.01)
    return float(x)

study.optimize(objective, search.Budget(trials=12))
raise SystemExit("not killed")
"""


def storage_for(kind: str, tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/studies.db" if kind == "sqlite" else f"{tmp_path}/studies.log"


def run_victim(storage: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", VICTIM, storage],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_resume_after_sigkill(tmp_path, kind):
    storage = storage_for(kind, tmp_path)
    run_victim(storage, tmp_path)

    study = Study.open("resume", storage=storage, sampler="tpe")
    before = study.trials
    assert [r.state for r in before] == [TrialState.COMPLETE] * KILLED_AT + [TrialState.FAIL]
    assert before[-1].reason == "interrupted (process died)"
    assert before[-1].duration_s is None

    calls = []

    def objective(trial):
        calls.append(trial.number)
        return float(trial.integer("x", 0, 100))

    best = study.optimize(objective, Budget(trials=12))
    after = study.trials
    assert calls == list(range(KILLED_AT + 1, 12))
    assert len(after) == 12
    assert sum(r.state is TrialState.COMPLETE for r in after) == 11
    assert after[: KILLED_AT + 1] == before
    assert best == min((r for r in after if r.value is not None), key=lambda r: r.value)
    # Reopening again changes nothing and the reason survives.
    assert Study.open("resume", storage=storage).trials == after


def test_running_trial_of_live_process_is_left_alone(tmp_path):
    storage = f"{tmp_path}/live.journal"
    study = Study.open("live", storage=storage, sampler="random")
    # Simulate another live process on this host (this one) holding a trial.
    raw = study._study.ask()
    raw.set_user_attr("autofuse.owner", {"host": socket.gethostname(), "pid": os.getpid()})
    reopened = Study.open("live", storage=storage, sampler="random")
    assert [r.state for r in reopened.trials] == [TrialState.RUNNING]
    # The RUNNING trial counts toward the budget (another worker will finish it).
    reopened.optimize(lambda t: float(t.integer("x", 0, 9)), Budget(trials=3))
    assert [r.state for r in reopened.trials] == [TrialState.RUNNING] + [TrialState.COMPLETE] * 2
