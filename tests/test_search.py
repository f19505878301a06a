"""Tests of the torch-free search library (CPU only, fast)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

import search
from search import Budget, SamplerSpec, Study, TrialFailed, TrialPruned, TrialState

REPO = Path(__file__).resolve().parents[1]
KINDS = ["tpe", "random", "exhaustive"]


def run_python(code: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd or REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def conditional(trial: search.Trial) -> float:
    """Two branches; the unique optimum is mode=b, y=8 with value 0."""
    if trial.categorical("mode", ["a", "b"]) == "a":
        return (trial.integer("x", 0, 7) - 5) ** 2 + 1.0
    return abs(math.log2(trial.pow2("y", 1, 64)) - 3)


SPACE = [("a", x) for x in range(8)] + [("b", 2**k) for k in range(7)]


def point(params: dict) -> tuple:
    return (params["mode"], params.get("x", params.get("y")))


def open_study(tmp_path: Path, kind: str = "random", name: str = "s") -> Study:
    return Study.open(name, storage=f"sqlite:///{tmp_path}/s.db", sampler=kind)


# --- import hygiene ---------------------------------------------------------------------------

NO_TORCH = "assert not any(m == 'torch' or m.startswith('torch.') for m in sys.modules), 'torch'"


def test_import_leaves_torch_out():
    result = run_python(f"import search, sys; {NO_TORCH}")
    assert result.returncode == 0, result.stderr


def test_running_each_sampler_leaves_torch_out(tmp_path):
    code = (
        "import sys, search\n"
        "for kind in ('tpe', 'random', 'exhaustive'):\n"
        "    s = search.Study.open(kind, storage=sys.argv[1], sampler=kind)\n"
        "    s.optimize(lambda t: float(t.integer('x', 0, 3) + t.pow2('y', 1, 4)),\n"
        "               search.Budget(trials=12), on_trial=search.progress_bar(12, kind))\n"
        f"{NO_TORCH}\n"
    )
    result = run_python(code, f"sqlite:///{tmp_path}/t.db")
    assert result.returncode == 0, result.stderr


def test_public_names():
    assert sorted(search.__all__) == sorted(
        name for name in dir(search) if not name.startswith("_") and name in search.__all__
    )
    for name in search.__all__:
        assert getattr(search, name) is not None


# --- samplers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_sampler_finds_minimum_of_conditional_space(tmp_path, kind):
    study = open_study(tmp_path, kind)
    best = study.optimize(conditional, Budget(trials=60))
    assert best is not None
    assert best.params == {"mode": "b", "y": 8}
    assert best.value == 0.0
    assert study.best == best
    for record in study.trials:
        assert record.state is TrialState.COMPLETE
        assert point(record.params) in SPACE
        assert set(record.params) in ({"mode", "x"}, {"mode", "y"})
    if kind == "exhaustive":
        visited = [point(r.params) for r in study.trials]
        assert sorted(visited) == sorted(SPACE)  # every point exactly once, then stops


def test_exhaustive_stays_stopped_on_reopen(tmp_path):
    open_study(tmp_path, "exhaustive").optimize(conditional, Budget(trials=100))
    again = open_study(tmp_path, "exhaustive")
    calls = []
    again.optimize(lambda t: calls.append(1) or conditional(t), Budget(trials=100))
    assert calls == []
    assert len(again.trials) == len(SPACE)


def test_sampler_spec():
    assert search.sampler_spec("random") == SamplerSpec(kind="random")
    spec = SamplerSpec(kind="tpe", seed=3, constant_liar=True)
    assert search.sampler_spec(spec) is spec
    with pytest.raises(ValueError, match=r"'annealing'.*tpe.*random.*exhaustive"):
        search.sampler_spec("annealing")
    with pytest.raises(ValueError, match="multivariate"):
        SamplerSpec(multivariate=False, group=True)
    with pytest.raises(ValueError, match="kind"):
        SamplerSpec(kind="grid")  # type: ignore[arg-type]


def test_same_seed_same_trials(tmp_path):
    runs = []
    for name in ("one", "two"):
        study = Study.open(name, storage=f"sqlite:///{tmp_path}/s.db", sampler="tpe")
        study.optimize(conditional, Budget(trials=15))
        runs.append([r.params for r in study.trials])
    assert runs[0] == runs[1]


# --- failures ---------------------------------------------------------------------------------


def test_failures_are_recorded_and_search_goes_on(tmp_path):
    def objective(trial):
        kind = trial.categorical("kind", list(expected))
        trial.set_note("kind", kind)
        if kind == "failed":
            raise TrialFailed("compile error")
        if kind == "error":
            raise ValueError("boom")
        if kind == "pruned":
            raise TrialPruned("too slow")
        if kind == "none":
            return None
        return {"ok": 1.5, "nan": math.nan, "inf": math.inf, "neg": -1.0, "str": "fast"}[kind]

    value = "expected the objective's value to be"
    expected = {
        "ok": (TrialState.COMPLETE, None),
        "failed": (TrialState.FAIL, "compile error"),
        "error": (TrialState.FAIL, "ValueError: boom"),
        "nan": (TrialState.FAIL, f"{value} finite, got nan"),
        "inf": (TrialState.FAIL, f"{value} finite, got inf"),
        "neg": (TrialState.FAIL, f"{value} >= 0 seconds, got -1.0"),
        "str": (TrialState.FAIL, f"{value} a number of seconds, got str 'fast'"),
        "pruned": (TrialState.PRUNED, "too slow"),
        "none": (TrialState.FAIL, f"{value} a number of seconds, got NoneType None"),
    }
    seen = []
    study = open_study(tmp_path, "exhaustive")
    best = study.optimize(objective, Budget(trials=50), on_trial=lambda r, b: seen.append((r, b)))
    for records in (study.trials, open_study(tmp_path, "exhaustive").trials):  # also on reopen
        got = {r.params["kind"]: (r.state, r.reason) for r in records}
        assert got == expected
        assert all(r.notes == {"kind": r.params["kind"]} for r in records)
        assert all(r.duration_s is not None and r.duration_s >= 0 for r in records)
    assert best is not None and best.params == {"kind": "ok"} and best.value == 1.5
    assert [r for r, _ in seen] == study.trials
    ok_number = best.number
    assert all((b is None) == (r.number < ok_number) for r, b in seen)


def test_bad_parameters_fail_the_trial_with_a_reason(tmp_path):
    study = open_study(tmp_path)
    study.optimize(lambda t: float(t.pow2("y", 3, 64)), Budget(trials=1))
    (record,) = study.trials
    assert record.state is TrialState.FAIL
    assert record.reason.startswith("ValueError: pow2 expected low to be a power of two")
    assert "got 3" in record.reason


def test_pow2_and_integer_ranges(tmp_path):
    study = open_study(tmp_path, "exhaustive")
    study.optimize(lambda t: float(t.pow2("p", 4, 32) + t.integer("i", 2, 8, step=3)), Budget(99))
    assert sorted((r.params["p"], r.params["i"]) for r in study.trials) == [
        (p, i) for p in (4, 8, 16, 32) for i in (2, 5, 8)
    ]


# --- enqueue and budgets ----------------------------------------------------------------------


def test_enqueued_points_run_first_and_duplicates_are_skipped(tmp_path):
    study = open_study(tmp_path, "exhaustive")
    first, second = {"mode": "a", "x": 3}, {"mode": "b", "y": 16}
    study.enqueue(first)
    study.enqueue(second)
    study.enqueue(dict(first))  # identical to a pending point: skipped
    study.optimize(conditional, Budget(trials=4))
    params = [r.params for r in study.trials]
    assert params[:2] == [first, second]
    assert len(params) == 4 and first not in params[2:]
    study.enqueue(params[3])  # identical to a finished point: skipped
    study.optimize(conditional, Budget(trials=5))
    assert study.trials[4].params not in params


def test_budget_by_seconds(tmp_path):
    study = open_study(tmp_path)

    def slow(trial):
        time.sleep(0.05)
        return float(trial.integer("x", 0, 100))

    started = time.monotonic()
    study.optimize(slow, Budget(seconds=0.3))
    assert 1 <= len(study.trials) < 20
    assert time.monotonic() - started < 2.0


def test_budget_needs_a_limit():
    with pytest.raises(ValueError, match="neither"):
        Budget()
    with pytest.raises(ValueError, match="trials"):
        Budget(trials=-1)
    with pytest.raises(ValueError, match="seconds"):
        Budget(seconds=math.nan)


def test_budget_trials_counts_earlier_runs(tmp_path):
    open_study(tmp_path).optimize(conditional, Budget(trials=4))
    study = open_study(tmp_path)
    study.optimize(conditional, Budget(trials=7))
    assert len(study.trials) == 7
    study.optimize(conditional, Budget(trials=3))  # already spent
    assert len(study.trials) == 7


def test_keyboard_interrupt_is_recorded_then_raised(tmp_path):
    study = open_study(tmp_path)

    def objective(trial):
        trial.integer("x", 0, 3)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        study.optimize(objective, Budget(trials=5))
    (record,) = study.trials
    assert (record.state, record.reason) == (TrialState.FAIL, "interrupted (KeyboardInterrupt)")


def test_progress_bar(tmp_path, capsys):
    import io

    out = io.StringIO()
    bar = search.progress_bar(5, "tune", file=out)
    open_study(tmp_path).optimize(conditional, Budget(trials=5), on_trial=bar)
    text = out.getvalue()
    assert "tune" in text and "5/5" in text and "best=" in text


# --- storage ----------------------------------------------------------------------------------


def test_resolve_storage(tmp_path):
    cache = tmp_path / "cache" / "deep"
    assert search.resolve_storage(None, cache) == f"sqlite:///{cache}/studies.db"
    assert cache.is_dir()
    for url in ("sqlite:///x.db", "postgresql://u:p@h/db", "mysql+pymysql://u@h/db"):
        assert search.resolve_storage(url, tmp_path) == url
    for journal in (tmp_path / "j" / "a.log", f"{tmp_path}/b.journal", f"journal:{tmp_path}/c"):
        assert isinstance(search.resolve_storage(journal, tmp_path), optuna.storages.JournalStorage)
    assert (tmp_path / "j").is_dir()


@pytest.mark.parametrize("bad", ["studies.db", "", "http://example.com/x", "journal:", "x.txt"])
def test_resolve_storage_rejects(tmp_path, bad):
    with pytest.raises(ValueError, match="unsupported storage") as info:
        search.resolve_storage(bad, tmp_path)
    assert repr(bad) in str(info.value)


def test_default_storage_is_sqlite_in_cache_dir(tmp_path):
    study = Study.open("d", cache_dir=tmp_path / "c", sampler="random")
    study.optimize(conditional, Budget(trials=2))
    assert (tmp_path / "c" / "studies.db").is_file()
    assert len(Study.open("d", cache_dir=tmp_path / "c").trials) == 2
