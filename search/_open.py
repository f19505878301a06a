"""Race-free creation (or loading) of one Optuna study by many processes at once.

Creating a new SQL database runs Optuna's table creation and alembic stamping, which are not
safe to run concurrently ("table studies already exists", "UNIQUE constraint failed:
alembic_version.version_num"). So storage construction and ``create_study(load_if_exists=True)``
run under the storage's creation lock (a file lock for files, an advisory lock for
PostgreSQL); damaged files are moved aside there first. Storages without a lock get a bounded
retry on those known errors.
"""

from __future__ import annotations

import errno
import os
import random
import time

import optuna

from ._damage import (
    SQLITE_SIDECARS,
    StorageUnavailable,
    not_a_file,
    recover_if_damaged,
    set_aside,
)
from ._locks import CREATE_KEY, StorageLock
from ._storage import StorageTarget, build_storage

CREATE_ATTEMPTS = 6
_RACE_WORDS = ("already exists", "duplicate", "unique constraint", "locked", "deadlock")


def create_or_load(name: str, target: StorageTarget, lock: StorageLock) -> optuna.Study:
    """The minimizing study ``name`` in ``target``, created when missing. A damaged study or
    lock file (of any kind Optuna cannot open) is set aside once, with one warning, for a fresh
    one; a folder that cannot be written raises :class:`StorageUnavailable` naming it."""
    lock_path = getattr(lock, "path", None)
    if lock_path is not None:
        set_aside(lock_path, not_a_file(lock_path))
    if target.kind == "journal" and target.path:  # Optuna's own lock: a symbolic link
        journal_lock = target.path + ".lock"
        if os.path.isdir(journal_lock) and not os.path.islink(journal_lock):
            set_aside(journal_lock, "the journal's lock is a folder")
    fresh_tried = False
    for attempt in range(1, CREATE_ATTEMPTS + 1):
        try:
            with lock.hold(CREATE_KEY):
                recover_if_damaged(target.kind, target.path)
                return optuna.create_study(
                    study_name=name,
                    storage=build_storage(target),
                    direction="minimize",
                    load_if_exists=True,
                )
        except Exception as exc:
            unavailable = unwritable(target.path or lock_path, exc)
            if unavailable is not None:
                raise unavailable from exc
            if attempt < CREATE_ATTEMPTS and is_creation_race(exc):
                time.sleep(random.uniform(0.02, 0.1) * attempt)
                continue
            if fresh_tried or not _file_backed(target):
                raise
            fresh_tried = True  # Optuna cannot open it (a dropped table, ...): start afresh
            sidecars = SQLITE_SIDECARS if target.kind == "sqlite" else ()
            set_aside(target.path, f"{type(exc).__name__}: {str(exc).splitlines()[0]}", sidecars)
    raise AssertionError("unreachable")


def _file_backed(target: StorageTarget) -> bool:
    return target.kind in ("sqlite", "journal") and bool(target.path) and \
        os.path.lexists(target.path)  # fmt: skip


_UNWRITABLE = ("readonly database", "read-only file system", "disk is full", "no space left",
               "permission denied", "unable to open database file")  # fmt: skip


def unwritable(path: str | os.PathLike[str] | None, exc: BaseException) -> OSError | None:
    """:class:`StorageUnavailable` naming the folder when ``exc`` says it cannot be written."""
    err = exc
    while err is not None and not isinstance(err, OSError):
        err = err.__cause__ or err.__context__
    text = str(exc).lower()
    codes = (errno.EROFS, errno.ENOSPC, errno.EACCES, errno.EPERM, getattr(errno, "EDQUOT", -1))
    if not (isinstance(err, OSError) and err.errno in codes) and \
            not any(w in text for w in _UNWRITABLE):  # fmt: skip
        return None
    folder = os.path.dirname(os.path.abspath(os.fspath(path))) if path else "the storage"
    return StorageUnavailable(
        f"study storage folder {folder} cannot be written (read-only, full or not permitted): "
        f"{str(exc).splitlines()[0]}; free space there, or pass storage= / cache_dir= elsewhere"
    )


def is_creation_race(exc: BaseException) -> bool:
    """Whether ``exc`` is one of the errors two processes creating one database provoke."""
    import sqlalchemy.exc

    if isinstance(exc, sqlalchemy.exc.IntegrityError):
        return True
    if isinstance(
        exc,
        (
            sqlalchemy.exc.OperationalError,
            sqlalchemy.exc.ProgrammingError,
            optuna.exceptions.StorageInternalError,
        ),
    ):
        text = str(exc).lower()
        return any(word in text for word in _RACE_WORDS)
    return False
