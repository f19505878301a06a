"""Where studies live: an embedded SQLite file, a journal file, or an RDB server URL."""

from __future__ import annotations

import os
import re
from pathlib import Path

import optuna

JOURNAL_SUFFIXES = (".log", ".journal")
JOURNAL_PREFIX = "journal:"
# SQLAlchemy URLs of the databases Optuna's RDBStorage supports, optionally "+driver".
_RDB_URL = re.compile(r"^(sqlite|postgresql|postgres|mysql|mariadb|oracle|mssql)(\+\w+)?://")
ACCEPTED = (
    "None (SQLite file in cache_dir), a journal file path ending in .log/.journal or "
    "starting with 'journal:', or a database URL (sqlite:///..., postgresql://..., mysql://...)"
)


def resolve_storage(
    storage: str | os.PathLike[str] | None, cache_dir: str | os.PathLike[str]
) -> str | optuna.storages.BaseStorage:
    """Turn the user's storage setting into what ``optuna.create_study(storage=...)`` takes."""
    if storage is None:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{os.fspath(cache_dir)}/studies.db"
    if isinstance(storage, os.PathLike):
        storage = os.fspath(storage)
    if not isinstance(storage, str) or not storage.strip():
        raise ValueError(f"unsupported storage {storage!r}: expected {ACCEPTED}")
    if storage.startswith(JOURNAL_PREFIX):
        return journal_storage(_journal_path(storage))
    if _RDB_URL.match(storage):
        return storage
    if storage.endswith(JOURNAL_SUFFIXES) and "://" not in storage:
        return journal_storage(storage)
    raise ValueError(f"unsupported storage {storage!r}: expected {ACCEPTED}")


def _journal_path(storage: str) -> str:
    path = storage[len(JOURNAL_PREFIX) :]
    if path.startswith("//"):  # URL style: journal:///abs/path or journal://rel/path
        path = path[2:]
    if not path:
        raise ValueError(f"unsupported storage {storage!r}: expected a file path after 'journal:'")
    return path


def journal_storage(path: str | os.PathLike[str]) -> optuna.storages.BaseStorage:
    """Optuna journal storage on a file (safe for several processes on one host)."""
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(_journal_backend(str(file)))


def _journal_backend(path: str) -> object:
    try:  # Optuna >= 4.0
        from optuna.storages.journal import JournalFileBackend
    except ImportError:  # Optuna 3.x
        return optuna.storages.JournalFileStorage(path)
    return JournalFileBackend(path)
