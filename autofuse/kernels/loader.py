"""Generated kernel source -> an importable module -> its ``@triton.jit`` function.

Nothing runs unchecked: ``triton.jit`` needs a real file, so each source (which a cached plan
checked against its entry's sha256 when it was decoded) is written to
``<kernel dir>/<name>_<sha>.py`` (the settings' kernel folder, under the cache home) and imported
from there; a file found there whose bytes differ from the source (edited, truncated, emptied)
is reported once with :class:`KernelFileWarning` and rewritten before the import.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

from autofuse.files import write_atomic
from autofuse.interpreter import apply_patches
from autofuse.settings import settings

_LOADED: dict[tuple[str, str], Any] = {}  # (source, name) -> jitted function
_LOCK = threading.Lock()


def kernel_dir() -> Path:
    path = settings().kernel_dir
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        uid = os.getuid() if hasattr(os, "getuid") else 0
        path = Path(tempfile.gettempdir()) / f"autofuse-kernels-{uid}"
        path.mkdir(parents=True, exist_ok=True)
    return path


class KernelFileWarning(UserWarning):
    """A kernel file in the kernel folder did not hold its source (it was rewritten)."""


def _write_checked(path: Path, data: bytes) -> None:
    """``path`` holds exactly ``data`` afterwards (written atomically when it did not)."""
    try:
        old = path.read_bytes()
    except OSError:
        old = None
    if old == data:
        return
    if old is not None:
        warnings.warn(
            f"autofuse: kernel file {path} does not hold its generated source ({len(old)} bytes, "
            f"expected {len(data)} with sha256 {hashlib.sha256(data).hexdigest()[:16]}...; "
            "edited, truncated or emptied?); it is rewritten and the verified source runs",
            KernelFileWarning,
            stacklevel=4,
        )
    write_atomic(path, data)


def load_kernel(source: str, name: str) -> Any:
    """Import ``source`` and return its function ``name`` (imported once per process)."""
    key = (source, name)  # str hashes are cached: a hit costs a dict lookup
    fn = _LOADED.get(key)
    if fn is not None:
        return fn
    with _LOCK:
        if key in _LOADED:
            return _LOADED[key]
        apply_patches()
        data = source.encode()
        digest = hashlib.sha256(data).hexdigest()[:20]
        path = kernel_dir() / f"{name}_{digest}.py"
        _write_checked(path, data)
        mod_name = f"autofuse_generated_{name}_{digest}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(mod_name, None)
            raise
        try:
            fn = getattr(module, name)
        except AttributeError:
            raise AttributeError(f"kernel source defines no {name!r}") from None
        _LOADED[key] = fn
        return fn
