"""Damaged study files: detected when a study is opened, moved aside, and replaced by a fresh
study (with one :class:`DamagedStorageWarning`) instead of failing every later open."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import time
import warnings
from pathlib import Path

SQLITE_SIDECARS = ("-journal", "-wal", "-shm")  # would be replayed onto a fresh file


class DamagedStorageWarning(UserWarning):
    """A study file could not be read: it was renamed ``<file>.corrupt-<timestamp>`` and a
    fresh study was started in its place."""


def _optuna_tables() -> list[str]:
    """Every table of this Optuna's schema (its models), and alembic's version table."""
    try:
        from optuna.storages._rdb import models

        return sorted({*models.BaseModel.metadata.tables, "alembic_version"})
    except Exception:  # noqa: BLE001 - another Optuna's layout: the tables every one has
        return ["alembic_version", "studies", "trials"]


class StorageUnavailable(OSError):
    """The study storage's folder cannot be written (read-only, full, not permitted)."""


def not_a_file(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot hold a study or lock file (a dangling link, a folder, a FIFO or
    device), or None (a regular file, or nothing there)."""
    if not os.path.lexists(path):
        return None
    if os.path.islink(path) and not os.path.exists(path):
        return "it is a symbolic link to nothing"
    mode = os.stat(path).st_mode
    if stat.S_ISDIR(mode):
        return "it is a folder, not a file"
    if not stat.S_ISREG(mode):
        return "it is not a regular file (a FIFO, socket or device)"
    return None


def _known_revisions() -> frozenset[str]:
    """The schema revisions this Optuna knows (its alembic scripts)."""
    import optuna

    folder = Path(optuna.__file__).parent / "storages" / "_rdb" / "alembic" / "versions"
    found = set()
    for script in folder.glob("*.py"):
        for line in script.read_text(errors="replace").splitlines():
            if line.startswith("revision ="):
                found.add(line.split("=", 1)[1].strip().strip("\"'"))
    return frozenset(found)


def _schema_problem(conn: sqlite3.Connection) -> str | None:
    """Why an SQLite file that reads fine is no Optuna study file of a known schema."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not tables:
        return None  # an empty database: Optuna creates its tables
    missing = [t for t in _optuna_tables() if t not in tables]
    if missing:
        return f"not a whole Optuna study file (no table {', '.join(missing)})"
    versions = [r[0] for r in conn.execute("SELECT version_num FROM alembic_version")]
    known = _known_revisions()
    if len(versions) != 1 or (known and versions[0] not in known):
        return f"schema version {versions} is none this Optuna knows"
    return None


def sqlite_damage(path: str | os.PathLike[str]) -> str | None:
    """Why the SQLite file at ``path`` is unreadable, or None when it is fine (or absent)."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    conn = None
    try:
        conn = sqlite3.connect(os.fspath(path), timeout=60)
        rows = conn.execute("PRAGMA quick_check").fetchall()
        if rows == [("ok",)]:
            problem = _schema_problem(conn)
            if problem is not None:
                return problem
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            return None  # busy, not damaged: other processes are writing
        return f"sqlite3.OperationalError: {exc}"
    except sqlite3.DatabaseError as exc:
        return f"sqlite3.DatabaseError: {exc}"
    finally:
        if conn is not None:
            conn.close()
    if rows != [("ok",)]:
        return "integrity check failed: " + "; ".join(str(r[0]) for r in rows[:3])
    return None


def journal_damage(path: str | os.PathLike[str]) -> str | None:
    """Why the journal file at ``path`` is unreadable, or None when it is fine (or absent).

    Every line must be a JSON object with an ``op_code`` and end with a newline (Optuna skips
    a torn last line silently, then fails once something is appended after it)."""
    if not os.path.exists(path):
        return None
    with _journal_locked(os.fspath(path)):
        data = Path(path).read_bytes()
    if data and not data.endswith(b"\n"):
        return "the last line is cut short (no newline at the end)"
    for number, line in enumerate(data.splitlines(), start=1):
        try:
            op = json.loads(line)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            return f"line {number} is not JSON ({type(exc).__name__})"
        if not isinstance(op, dict) or "op_code" not in op:
            return f"line {number} is not a journal operation (no op_code)"
    return None


class _journal_locked:
    """Optuna's own lock of a journal file (its writers hold it while appending), so a line
    being written is not mistaken for a torn one."""

    def __init__(self, path: str) -> None:
        from optuna.storages.journal import JournalFileSymlinkLock

        self._lock = JournalFileSymlinkLock(path)

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def move_aside(path: str | os.PathLike[str], sidecars: tuple[str, ...] = ()) -> Path:
    """Rename ``path`` (and its existing ``path + sidecar`` files) to
    ``<path>.corrupt-<timestamp>``; returns the new path."""
    source = Path(path)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = source.with_name(f"{source.name}.corrupt-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = source.with_name(f"{source.name}.corrupt-{stamp}-{n}")
    os.replace(source, aside)
    for suffix in sidecars:
        extra = Path(os.fspath(source) + suffix)
        if extra.exists():
            os.replace(extra, Path(os.fspath(aside) + suffix))
    return aside


def recover_if_damaged(kind: str, path: str | None) -> Path | None:
    """For an SQLite ("sqlite") or journal ("journal") file: when damaged, move it aside and
    warn once; returns where it went (None when nothing was wrong). Call under the storage's
    creation lock."""
    if path is None or kind not in ("sqlite", "journal"):
        return None
    reason = not_a_file(path)
    if reason is None:
        reason = sqlite_damage(path) if kind == "sqlite" else journal_damage(path)
    return set_aside(path, reason, SQLITE_SIDECARS if kind == "sqlite" else ())


def set_aside(
    path: str | os.PathLike[str], reason: str | None, sidecars: tuple = ()
) -> Path | None:
    """Move the damaged ``path`` aside with one warning (nothing when ``reason`` is None)."""
    if reason is None:
        return None
    if reason is None:
        return None
    aside = move_aside(path, sidecars)
    warnings.warn(
        f"study storage {path} is damaged ({reason}); moved it to {aside} and started a fresh "
        "study there",
        DamagedStorageWarning,
        stacklevel=3,
    )
    return aside
