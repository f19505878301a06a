"""Every kind of damaged study storage (another application's SQLite file, a bogus schema
version, a dropped table, a dangling link, a FIFO, a lock or journal path that is a folder) is
set aside with one warning and a fresh study starts; a folder that cannot be written is one
clear error naming it. The search library never imports torch."""

from __future__ import annotations

import os
import sqlite3
import warnings
from pathlib import Path

import pytest

from search import Budget, DamagedStorageWarning, StorageUnavailable, Study


def _study(storage: str) -> None:
    Study.open("d", storage=storage, sampler="random").optimize(
        lambda t: float(t.integer("x", 0, 9)), Budget(trials=2)
    )


def _sql(file: Path, *statements: str) -> None:
    with sqlite3.connect(file) as conn:
        for s in statements:
            conn.execute(s)


def _other_app(file, tmp):
    _sql(file, "CREATE TABLE notes (id INTEGER, text TEXT)", "INSERT INTO notes VALUES (1, 'x')")


def _bogus_version(file, tmp):
    _study(f"sqlite:///{file}")
    _sql(file, "UPDATE alembic_version SET version_num = 'v99.bogus'")


def _dropped_table(file, tmp):
    _study(f"sqlite:///{file}")
    _sql(file, "DROP TABLE trial_values")


def _dangling(file, tmp):
    file.symlink_to(tmp / "nowhere" / "studies.db")


def _fifo(file, tmp):
    os.mkfifo(file)


def _folder(file, tmp):
    file.mkdir()
    (file / "x").write_text("")


def _lock_folder(file, tmp):
    Path(str(file) + ".search-lock").mkdir()


SQLITE = {"another app's file": _other_app, "bogus schema version": _bogus_version,
          "dropped table": _dropped_table, "dangling link": _dangling, "fifo": _fifo,
          "folder": _folder, "lock path a folder": _lock_folder}  # fmt: skip
JOURNAL = {"dangling link": _dangling, "fifo": _fifo, "folder": _folder,
           "journal lock a folder": lambda f, t: Path(str(f) + ".lock").mkdir()}  # fmt: skip


def _opens_fresh(storage: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        study = Study.open("d", storage=storage, sampler="random")
    ours = [w for w in caught if issubclass(w.category, DamagedStorageWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert study.trials == []
    study.optimize(lambda t: float(t.integer("x", 0, 9)), Budget(trials=1))
    assert len(Study.open("d", storage=storage, sampler="random").trials) == 1


@pytest.mark.parametrize("how", list(SQLITE))
def test_damaged_sqlite_storage_of_every_kind_starts_fresh(tmp_path, how):
    file = tmp_path / "studies.db"
    SQLITE[how](file, tmp_path)
    _opens_fresh(f"sqlite:///{file}")


@pytest.mark.parametrize("how", list(JOURNAL))
def test_damaged_journal_storage_of_every_kind_starts_fresh(tmp_path, how):
    file = tmp_path / "studies.journal"
    JOURNAL[how](file, tmp_path)
    _opens_fresh(str(file))


def test_a_folder_that_cannot_be_written_is_one_clear_error(tmp_path, monkeypatch):
    import optuna

    def read_only(*args, **kwargs):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(optuna, "create_study", read_only)
    file = tmp_path / "home" / "studies.db"
    with pytest.raises(StorageUnavailable, match=f"folder {file.parent} cannot be written"):
        Study.open("d", storage=f"sqlite:///{file}", sampler="random")
    assert not list(file.parent.glob("*.corrupt-*"))  # nothing set aside


def test_search_never_imports_torch():
    import subprocess
    import sys

    code = "import search, sys; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
