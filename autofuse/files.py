"""Writing files so that a reader (or a process killed mid-write) never sees half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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
