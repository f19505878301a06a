"""Generated kernel source -> a module made from those very bytes -> its ``@triton.jit`` function.

Nothing runs unchecked: a kernel runs from the source text the caller holds (which a cached
plan checked against its entry's sha256, and its signature where a signing key is set, when it
was decoded). The text is compiled in memory and executed into a fresh module: no file is read
between the check and the import, and no bytecode is written or read. Triton reads a
``@triton.jit`` function's source through ``inspect``; the module's pseudo file name
(``<autofuse kernel NAME_SHA>``) names no file on disk and its lines are registered in
``linecache`` (with the module's loader as a second source), so Triton can only ever see the
verified text.

Readable copies for people (``AUTOFUSE_LOGS=output_code``) are written to the kernel folder by
:func:`kernel_file`; nothing imports them. Where the configured folder cannot be created, the
copy goes to a folder under the temporary directory that this user owns with mode 0700; a
folder there that another user owns or can write is refused (:class:`UnsafeFolder`).
"""

from __future__ import annotations

import hashlib
import io
import linecache
import os
import stat
import sys
import tempfile
import threading
import tokenize
import types
import warnings
from pathlib import Path
from typing import Any

from autofuse.bounds import install as install_bounds_checks
from autofuse.files import write_atomic
from autofuse.interpreter import apply_patches, interpreting
from autofuse.kernels.common.guards import GuardedKernel, guard_source
from autofuse.settings import settings

_LOADED: dict[tuple[str, str], Any] = {}  # (source, name) -> jitted function
_BUILT: dict[tuple[Any, str], Any] = {}  # (code: the source's tokens but comments, name) -> fn
_LOCK = threading.Lock()


class UnsafeFolder(OSError):
    """A fallback folder under the temporary directory that another user owns or can write."""


class KernelFileWarning(UserWarning):
    """A readable kernel copy in the kernel folder did not hold its source (it was rewritten)."""


def private_dir(path: Path) -> Path:
    """``path`` as a folder this user owns that nobody else can write, created with mode 0700
    where missing; :class:`UnsafeFolder` where it is a link, not a folder, owned by another user
    or writable by group / others."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    uid = os.getuid() if hasattr(os, "getuid") else st.st_uid
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFolder(f"autofuse: {path} is not a folder (a link or a file); refusing it")
    if st.st_uid != uid or st.st_mode & 0o022:
        raise UnsafeFolder(
            f"autofuse: {path} is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o};"
            f" a fallback folder must be this user's ({uid}) and writable by nobody else: "
            "remove it or set AUTOFUSE_KERNEL_DIR"
        )
    return path


def kernel_dir() -> Path:
    """The folder readable kernel copies go to (the settings' folder, else a private one)."""
    path = settings().kernel_dir
    try:
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError:
        uid = os.getuid() if hasattr(os, "getuid") else 0
        return private_dir(Path(tempfile.gettempdir()) / f"autofuse-kernels-{uid}")


def _write_checked(path: Path, data: bytes) -> None:
    """``path`` holds exactly ``data`` afterwards (written atomically when it did not); a
    regular file there is read up to one byte past the expected size, nothing else is read."""
    old = None
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            with open(path, "rb") as f:
                old = f.read(len(data) + 1)
    except OSError:
        old = None
    if old == data:
        return
    if old is not None:
        warnings.warn(
            f"autofuse: kernel file {path} does not hold its generated source "
            f"(expected {len(data)} bytes with sha256 "
            f"{hashlib.sha256(data).hexdigest()[:16]}...); it is rewritten (nothing imports it)",
            KernelFileWarning,
            stacklevel=4,
        )
    write_atomic(path, data)


def kernel_file(source: str, name: str) -> Path:
    """A readable copy of ``source`` in the kernel folder (for people; nothing imports it)."""
    data = source.encode()
    path = kernel_dir() / f"{name}_{hashlib.sha256(data).hexdigest()[:20]}.py"
    _write_checked(path, data)
    return path


class _VerifiedSource:
    """The loader of a kernel module: its source is the verified text, nothing else."""

    def __init__(self, source: str) -> None:
        self.source = source

    def get_source(self, fullname: str) -> str:
        return self.source


def _module_from_source(source: str, name: str, digest: str) -> types.ModuleType:
    mod_name = f"autofuse_generated_{name}_{digest}"
    filename = f"<autofuse kernel {name}_{digest}>"
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)  # None: never re-read
    code = compile(source, filename, "exec", dont_inherit=True)
    module = types.ModuleType(mod_name)
    module.__loader__ = _VerifiedSource(source)
    module.__file__ = filename
    sys.modules[mod_name] = module
    try:
        exec(code, module.__dict__)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    return module


def kernels_built() -> int:
    """How many kernels this process has built (one per code text and name: sources that
    differ only in their comments, such as the shapes a runtime-size kernel was generated for
    or the buffer names one front end gives its inputs, share one)."""
    return len(_BUILT)


_NOT_CODE = frozenset({tokenize.COMMENT, tokenize.NL, tokenize.ENCODING})


def _code_of(source: str) -> Any:
    """``source``'s tokens without its comments (whole lines and after code alike; a ``#``
    inside a string stays part of the string) and blank lines; a text that does not tokenize
    is its own key (building it raises Python's own SyntaxError)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    try:
        return tuple((t.type, t.string) for t in tokens if t.type not in _NOT_CODE)
    except (tokenize.TokenError, SyntaxError):
        return source


def load_kernel(source: str, name: str) -> Any:
    """Run ``source`` in a fresh module and return its function ``name`` (once per process
    and code text: a source whose code, without its comments, was built already gets that
    function). With ``AUTOFUSE_CHECK_BOUNDS`` on a GPU, its guarded variant
    (:func:`load_guarded`); the interpreter checks every access itself."""
    if settings().check_bounds and not interpreting():
        return load_guarded(source, name)
    key = (source, name)  # str hashes are cached: a hit costs a dict lookup
    fn = _LOADED.get(key)
    if fn is not None:
        return fn
    with _LOCK:
        if key in _LOADED:
            return _LOADED[key]
        fn = _LOADED[key] = _build(source, name)
        return fn


def _build(source: str, name: str) -> Any:
    """Build ``source`` (under ``_LOCK``), or reuse the build of the same code text."""
    code_key = (_code_of(source), name)
    if code_key in _BUILT:
        return _BUILT[code_key]
    apply_patches()
    if interpreting():
        install_bounds_checks()  # after the interpreter's patches: checks what they pass on
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    module = _module_from_source(source, name, digest)
    try:
        fn = getattr(module, name)
    except AttributeError:
        raise AttributeError(f"kernel source defines no {name!r}") from None
    _BUILT[code_key] = fn
    return fn


_GUARDED: dict[tuple[str, str], Any] = {}


def load_guarded(source: str, name: str) -> Any:
    """``source``'s kernel ``name`` with a bounds guard before each access it can guard
    (``kernels/common/guards.py``), built in debug mode and launched as the plain one is."""
    fn = _GUARDED.get((source, name))
    if fn is None:
        guarded = guard_source(source, name)
        with _LOCK:
            fn = _build(guarded.source, name)
        fn = _GUARDED[(source, name)] = GuardedKernel(fn, guarded.extents)
    return fn
