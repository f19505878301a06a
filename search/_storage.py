"""Where studies live: an embedded SQLite file, a journal file, a database URL, or an Optuna
storage object built by the caller."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import optuna

from ._locks import FileLock, NoLock, PostgresLock, StorageLock

JOURNAL_SUFFIXES = (".log", ".journal")
JOURNAL_PREFIX = "journal:"
# SQLAlchemy URLs of the databases Optuna's RDBStorage supports, optionally "+driver".
_RDB_URL = re.compile(r"^(sqlite|postgresql|postgres|mysql|mariadb|oracle|mssql)(\+\w+)?://")
_POSTGRES_URL = re.compile(r"^(postgresql|postgres)(\+\w+)?://")
ACCEPTED = (
    "None (SQLite file in cache_dir), a journal file path ending in .log/.journal or "
    "starting with 'journal:', a database URL (sqlite:///..., postgresql://..., mysql://...) "
    "or an optuna.storages.BaseStorage instance"
)
SQLITE_TIMEOUT_S = 60.0  # how long an SQLite writer waits for another process's transaction

StorageSetting = str | os.PathLike[str] | optuna.storages.BaseStorage | None


@dataclass(frozen=True)
class StorageTarget:
    """What a storage setting points at.

    ``kind``: "sqlite" (``url`` and, unless in memory, the database ``path``), "journal"
    (``path``), "rdb" (a server ``url``) or "object" (a caller's ``storage``; ``url``/``path``
    are filled in where the object reveals them, for locking)."""

    kind: Literal["sqlite", "journal", "rdb", "object"]
    url: str | None = None
    path: str | None = None
    storage: optuna.storages.BaseStorage | None = field(default=None, compare=False)


def resolve_storage(
    storage: StorageSetting, cache_dir: str | os.PathLike[str]
) -> str | optuna.storages.BaseStorage:
    """Turn the user's storage setting into what ``optuna.create_study(storage=...)`` takes."""
    target = storage_target(storage, cache_dir)
    if target.kind in ("sqlite", "rdb"):
        assert target.url is not None
        return target.url
    return build_storage(target)


def storage_target(storage: StorageSetting, cache_dir: str | os.PathLike[str]) -> StorageTarget:
    """Classify ``storage`` (see :data:`ACCEPTED`); raises ValueError for anything else."""
    if isinstance(storage, optuna.storages.BaseStorage):
        return _object_target(storage)
    if storage is None:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        return _url_target(f"sqlite:///{os.fspath(cache_dir)}/studies.db")
    if isinstance(storage, os.PathLike):
        storage = os.fspath(storage)
    if not isinstance(storage, str) or not storage.strip():
        raise ValueError(f"unsupported storage {storage!r}: expected {ACCEPTED}")
    if storage.startswith(JOURNAL_PREFIX):
        return _journal_target(_journal_path(storage))
    if _RDB_URL.match(storage):
        return _url_target(storage)
    if storage.endswith(JOURNAL_SUFFIXES) and "://" not in storage:
        return _journal_target(storage)
    raise ValueError(f"unsupported storage {storage!r}: expected {ACCEPTED}")


def _journal_target(path: str) -> StorageTarget:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return StorageTarget("journal", path=path)


def _url_target(url: str) -> StorageTarget:
    if not url.startswith("sqlite"):
        return StorageTarget("rdb", url=url)
    path = _sqlite_path(url)
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    return StorageTarget("sqlite", url=url, path=path)


def _sqlite_path(url: str) -> str | None:
    from sqlalchemy.engine import make_url

    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return database


def _object_target(storage: optuna.storages.BaseStorage) -> StorageTarget:
    inner = getattr(storage, "_backend", None)  # _CachedStorage wraps an RDBStorage
    rdb = storage if isinstance(storage, optuna.storages.RDBStorage) else inner
    if isinstance(rdb, optuna.storages.RDBStorage):
        url = rdb.url
        path = _sqlite_path(url) if url.startswith("sqlite") else None
        return StorageTarget("object", url=url, path=path, storage=storage)
    if isinstance(storage, optuna.storages.JournalStorage):
        path = getattr(inner, "_file_path", None)  # a JournalFileBackend's file
        return StorageTarget("object", path=path, storage=storage)
    return StorageTarget("object", storage=storage)


def _journal_path(storage: str) -> str:
    path = storage[len(JOURNAL_PREFIX) :]
    if path.startswith("//"):  # URL style: journal:///abs/path or journal://rel/path
        path = path[2:]
    if not path:
        raise ValueError(f"unsupported storage {storage!r}: expected a file path after 'journal:'")
    return path


def build_storage(target: StorageTarget) -> optuna.storages.BaseStorage:
    """The Optuna storage for ``target``; for a new SQL database this creates its tables, so
    hold :func:`storage_lock`'s creation lock around it."""
    if target.kind == "object":
        assert target.storage is not None
        return target.storage
    if target.kind == "journal":
        assert target.path is not None
        return journal_storage(target.path)
    assert target.url is not None
    engine_kwargs = (
        {"connect_args": {"timeout": SQLITE_TIMEOUT_S}} if target.kind == "sqlite" else {}
    )
    return optuna.storages.RDBStorage(target.url, engine_kwargs=engine_kwargs)


def storage_lock(target: StorageTarget) -> StorageLock:
    """The inter-process lock for ``target``: a file lock for files, an advisory lock for
    PostgreSQL, else :class:`NoLock`."""
    if target.path is not None:
        return FileLock(target.path)
    if target.url is not None and _POSTGRES_URL.match(target.url):
        return PostgresLock(target.url)
    return NoLock()


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
