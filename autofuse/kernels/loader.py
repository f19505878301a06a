"""Generated kernel source -> an importable module -> its ``@triton.jit`` function.

Nothing runs unchecked: the module is executed from the source string itself (which a cached
plan checked against its entry's sha256 when it was decoded), never from bytes read back from
disk, and ``inspect`` / Triton see those same lines (``linecache`` is primed with them). A copy
is still written to ``<kernel dir>/<name>_<sha>.py`` (the settings' kernel folder, under the
cache home) for tracebacks and readers; a copy there whose bytes differ from the source (edited,
truncated, emptied) is reported once with :class:`KernelFileWarning` and rewritten.
"""

from __future__ import annotations

import hashlib
import linecache
import os
import sys
import tempfile
import threading
import types
import warnings
from pathlib import Path
from typing import Any

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
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
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


def load_kernel(source: str, name: str) -> Any:
    """Execute ``source`` as a module and return its function ``name`` (once per process)."""
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
        filename = str(path)
        code = compile(data, filename, "exec", dont_inherit=True)
        # inspect.getsource (triton.jit reads its function's source) sees these verified lines,
        # not the file: an entry with mtime None is never re-read by linecache.checkcache
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        mod_name = f"autofuse_generated_{name}_{digest}"
        module = types.ModuleType(mod_name)
        module.__file__ = filename
        sys.modules[mod_name] = module
        try:
            exec(code, module.__dict__)
        except BaseException:
            sys.modules.pop(mod_name, None)
            raise
        try:
            fn = getattr(module, name)
        except AttributeError:
            raise AttributeError(f"kernel source defines no {name!r}") from None
        _LOADED[key] = fn
        return fn
