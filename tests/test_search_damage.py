"""A damaged study file (random bytes, truncation) is moved aside with one warning and a
fresh study starts, instead of every later open raising."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

import search
from search import Budget, DamagedStorageWarning, Study, TrialState


def make_study(kind: str, tmp_path: Path) -> tuple[str, Path]:
    """A study with three complete trials; returns its storage setting and its file."""
    if kind == "sqlite":
        file = tmp_path / "studies.db"
        storage = f"sqlite:///{file}"
    else:
        file = tmp_path / "studies.log"
        storage = str(file)
    Study.open("d", storage=storage, sampler="random").optimize(
        lambda t: float(t.integer("x", 0, 9)), Budget(trials=3)
    )
    assert file.stat().st_size > 0
    return storage, file


def damage(file: Path, how: str) -> bytes:
    size = file.stat().st_size
    if how == "random":
        data = os.urandom(size)
    elif file.suffix == ".db":
        data = file.read_bytes()[: size // 2]  # pages cut off
    else:
        data = file.read_bytes()[: size - 7]  # the last journal line cut short
    file.write_bytes(data)
    return data


@pytest.mark.parametrize("how", ["random", "truncated"])
@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_damaged_file_is_moved_aside_and_a_fresh_study_starts(tmp_path, kind, how):
    storage, file = make_study(kind, tmp_path)
    damaged = damage(file, how)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        study = Study.open("d", storage=storage, sampler="random")
    damaged_warnings = [w for w in caught if issubclass(w.category, DamagedStorageWarning)]
    assert len(damaged_warnings) == 1, [str(w.message) for w in caught]
    (aside,) = tmp_path.glob(f"{file.name}.corrupt-*")
    assert aside.read_bytes() == damaged  # kept for inspection, untouched
    message = str(damaged_warnings[0].message)
    assert str(file) in message and str(aside) in message
    assert issubclass(DamagedStorageWarning, UserWarning)

    assert study.trials == []
    study.optimize(lambda t: float(t.integer("x", 0, 9)), Budget(trials=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DamagedStorageWarning)  # the fresh file is fine
        again = Study.open("d", storage=storage, sampler="random")
    assert [r.state for r in again.trials] == [TrialState.COMPLETE] * 2
    assert len(list(tmp_path.glob(f"{file.name}.corrupt-*"))) == 1


def test_sound_files_are_left_alone(tmp_path):
    for kind in ("sqlite", "journal"):
        storage, file = make_study(kind, tmp_path / kind)
        with warnings.catch_warnings():
            warnings.simplefilter("error", DamagedStorageWarning)
            assert len(Study.open("d", storage=storage).trials) == 3
        assert list(file.parent.glob("*.corrupt-*")) == []


def test_an_empty_file_is_a_new_study_not_damage(tmp_path):
    for file, storage in ((tmp_path / "e.db", f"sqlite:///{tmp_path}/e.db"),):
        file.write_bytes(b"")
        with warnings.catch_warnings():
            warnings.simplefilter("error", DamagedStorageWarning)
            assert Study.open("e", storage=storage).trials == []
    journal = tmp_path / "e.log"
    journal.write_bytes(b"")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DamagedStorageWarning)
        assert Study.open("e", storage=str(journal)).trials == []


def test_warning_is_exported():
    assert "DamagedStorageWarning" in search.__all__
