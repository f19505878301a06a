"""Inter-process locks that make study creation and trial reservation atomic.

File-backed storages (an SQLite file, a journal file) are locked with ``flock`` on a sibling
``<file>.search-lock`` (Optuna's journal uses ``<file>.lock`` itself); a PostgreSQL database
with a session-level advisory lock. Other storages get :class:`NoLock`: creation then relies on
retries and the trial budget on a check after ``ask()`` (see ``_study``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

LOCK_SUFFIX = ".search-lock"
CREATE_KEY = "autofuse.search:create"


class StorageLock(Protocol):
    """A lock over one storage; ``key`` names what is locked (a study, or creation)."""

    exact: bool  # True when holding it excludes every other process using the storage

    def hold(self, key: str) -> contextlib.AbstractContextManager[None]: ...


class NoLock:
    """For storages with no lock this package knows of: holds nothing."""

    exact = False

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        yield


class FileLock:
    """``flock`` on ``<path>.search-lock``: one lock for the whole file, whatever the key."""

    exact = True

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(os.fspath(path) + LOCK_SUFFIX)

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        try:
            import fcntl
        except ImportError:  # not POSIX: no flock; fall back to retries and checks
            yield
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


class PostgresLock:
    """A PostgreSQL session advisory lock per key, on a connection of its own."""

    exact = True

    def __init__(self, url: str) -> None:
        self.url = url
        self._engine = None

    def _connect(self):  # noqa: ANN202 - a SQLAlchemy connection
        if self._engine is None:
            import sqlalchemy
            from sqlalchemy.pool import NullPool

            self._engine = sqlalchemy.create_engine(self.url, poolclass=NullPool)
        return self._engine.connect()

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        from sqlalchemy import text

        with self._connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": lock_key(key)})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": lock_key(key)})
                conn.commit()


def lock_key(key: str) -> int:
    """A stable signed 64-bit integer for ``key`` (PostgreSQL advisory lock ids are bigint)."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)
