"""Race-free creation (or loading) of one Optuna study by many processes at once.

Creating a new SQL database runs Optuna's table creation and alembic stamping, which are not
safe to run concurrently ("table studies already exists", "UNIQUE constraint failed:
alembic_version.version_num"). So storage construction and ``create_study(load_if_exists=True)``
run under the storage's creation lock (a file lock for files, an advisory lock for
PostgreSQL); damaged files are moved aside there first. Storages without a lock get a bounded
retry on those known errors.
"""

from __future__ import annotations

import random
import time

import optuna

from ._damage import recover_if_damaged
from ._locks import CREATE_KEY, StorageLock
from ._storage import StorageTarget, build_storage

CREATE_ATTEMPTS = 6
_RACE_WORDS = ("already exists", "duplicate", "unique constraint", "locked", "deadlock")


def create_or_load(name: str, target: StorageTarget, lock: StorageLock) -> optuna.Study:
    """The minimizing study ``name`` in ``target``, created when missing."""
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
            if attempt == CREATE_ATTEMPTS or not is_creation_race(exc):
                raise
            time.sleep(random.uniform(0.02, 0.1) * attempt)
    raise AssertionError("unreachable")


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
