"""Writing files so that a reader (or a process killed mid-write) never sees half of one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

RUN_FILE = "run.json"  # an ``autofuse tune`` run folder's record of its runs


def write_atomic(path: Path, data: bytes, *, hidden: bool = False) -> None:
    """``path`` holds exactly ``data`` afterwards: written to a temporary file in the same
    folder, then renamed over it (the temporary is removed if anything fails)."""
    prefix = f".{path.stem}" if hidden else path.stem
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class FolderNotWritable(OSError):
    """A folder autofuse must write (the cache home, a run folder) that it cannot."""


def ensure_writable(folder: str | os.PathLike, option: str) -> Path:
    """``folder``, created if needed, after a test write; raises :class:`FolderNotWritable`
    naming the folder and ``option`` (what to change) where that fails."""
    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise FolderNotWritable(
            e.errno,
            f"autofuse: cannot write to the folder {path} ({e.strerror or e}); choose a "
            f"writable one with {option} (or the AUTOFUSE_CACHE_DIR variable)",
        ) from e
    return path


def read_json(path: Path) -> dict | None:
    """The JSON object in ``path``; None where it is missing, unreadable or not an object."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def workload_records(folder: Path) -> list[dict]:
    """The complete workload records of an ``autofuse tune`` run folder, by name."""
    out = []
    for p in sorted(Path(folder).glob("*.json")):
        doc = read_json(p)
        if p.name != RUN_FILE and doc and doc.get("complete") is True and "workload" in doc:
            out.append(doc)
    return out
