"""The plan cache: a tuned plan and its kernels on disk, loaded by production processes.

An entry is a directory ``<cache_dir>/plans/<key>/`` holding ``plan.json`` (the graph, the
steps with their launch configs, metadata, and sha256 digests) and one readable ``<kernel>.py``
per generated kernel. The key hashes everything that changes the generated code or its result:
the graph, the specialized scalars, the input/output structure, the device, the torch / triton /
autofuse versions and the tuning-independent options. ``load`` captures the function, looks the
key up and runs the cached plan with no tuning (and without importing optuna or the search); a
miss runs the function in eager with one warning, or raises :class:`CacheMiss` in strict mode.

Entries are written to a private temporary directory, fsynced and renamed into place, so a
writer killed mid-write never leaves an entry that loads, and concurrent writers of one key
leave one complete entry (the last to rename wins). A corrupt entry (bad JSON, a digest that does
not match, a missing kernel file, another cache format) is skipped with a warning naming the file.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sys
import time
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from autofuse.cache.binaries import BIN_DIR, BinaryStore
from autofuse.cache.codec import (
    canonical_json,
    decode_graph,
    decode_kernel,
    decode_library_step,
    encode_graph,
    encode_kernel,
    encode_library_step,
    json_safe,
    sha256_hex,
)
from autofuse.cache.keys import (
    CACHE_FORMAT,
    KEY_RE,
    PLAN_FILE,
    PLANS,
    STALE_SECONDS,
    CacheWarning,
    CorruptEntry,
    DeviceInfo,
    check_key,
    generator_id,
    inputs_device,
    key_for,
    key_parts,
    triton_version,
)
from autofuse.cache.trust import PLAN_LIMIT, SOURCE_LIMIT, read_bounded, sign, signature_problem
from autofuse.plan import EagerStep, KernelStep, LibraryStep, Plan
from autofuse.settings import cache_home, settings
from autofuse.version import __version__

# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------


def plans_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """``<cache_dir>/plans`` (``cache_dir=None``: the settings' cache home)."""
    return cache_home(cache_dir) / PLANS


def entry_dir(cache_dir: str | os.PathLike | None, key: str) -> Path:
    check_key(key)
    return plans_dir(cache_dir) / key


def _kernel_files(plan: Plan) -> list[str]:
    files, used = [], set()
    for k in plan.kernels:
        base = re.sub(r"[^A-Za-z0-9_]", "_", k.name) or "kernel"
        name, n = f"{base}.py", 1
        while name in used or name == PLAN_FILE:
            n += 1
            name = f"{base}_{n}.py"
        used.add(name)
        files.append(name)
    return files


def _default_metadata() -> dict[str, Any]:
    now = time.time()
    meta: dict[str, Any] = {
        "created": now,
        "created_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now)),
        "torch": str(torch.__version__),
        "triton": triton_version(),
        "autofuse": __version__,
        "generator": generator_id(),
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }
    if torch.cuda.is_available():
        meta["gpu"] = DeviceInfo.current().tag()
        meta["driver"] = _driver_version()
    return meta


def _driver_version() -> str | None:
    try:
        return str(torch._C._cuda_getDriverVersion())
    except Exception:  # noqa: BLE001 - informational only
        return None


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _exists_error(e: OSError) -> bool:
    return (
        isinstance(e, FileExistsError)
        or e.errno in (errno.ENOTEMPTY, errno.EEXIST)
        or (os.name == "nt" and isinstance(e, PermissionError))
    )


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_renameat2: Any = None  # False once known to be unavailable


def _exchange(a: Path, b: Path) -> bool | None:
    """Swap two directories atomically (Linux renameat2 RENAME_EXCHANGE).

    True: swapped. False: not supported here. None: ``b`` does not exist (any more).
    """
    global _renameat2
    if _renameat2 is None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.renameat2
            fn.argtypes = [
                ctypes.c_int,
                ctypes.c_char_p,
                ctypes.c_int,
                ctypes.c_char_p,
                ctypes.c_uint,
            ]
            fn.restype = ctypes.c_int
            _renameat2 = fn
        except (OSError, AttributeError, ImportError):
            _renameat2 = False
    if _renameat2 is False:
        return False
    import ctypes

    rc = _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.ENOENT:
        return None
    if err in (errno.EINVAL, errno.ENOSYS, errno.EPERM, errno.EOPNOTSUPP):
        return False  # kernel or filesystem without RENAME_EXCHANGE
    raise OSError(err, os.strerror(err), str(b))


def _exchange_supported() -> bool:
    """Whether atomic directory exchange is available (probed on two scratch directories)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        a, b = Path(d, "a"), Path(d, "b")
        a.mkdir()
        b.mkdir()
        return bool(_exchange(a, b))


def entry_files(entry: Path) -> tuple[list[Path], list[Path]]:
    """(the files of an entry folder autofuse wrote: ``plan.json``, the kernel sources it
    names, their binaries under ``bin/``; every other path there, left in place)."""
    sources: set[str] = set()
    try:
        doc = json.loads((entry / PLAN_FILE).read_text())
        for step in doc["payload"]["steps"]:
            if step.get("kind") == "kernel":
                sources.add(str(step["kernel"]["source_file"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # a damaged plan.json: only itself is known to be autofuse's
    stems = tuple(f"{Path(f).stem}." for f in sources)
    ours, theirs = [], []
    for p in sorted(entry.rglob("*")):
        rel = p.relative_to(entry)
        binary = rel.parts[0] == BIN_DIR and len(rel.parts) == 2 and rel.name.startswith(stems)
        own = rel.as_posix() in sources | {PLAN_FILE} or (
            binary and rel.suffix in (".json", ".tmp")
        )
        if p.is_dir() and not p.is_symlink():
            continue
        (ours if own and p.is_file() and not p.is_symlink() else theirs).append(p)
    return ours, theirs


def _keep_foreign(final: Path, tmp: Path) -> None:
    """Copy the files of an entry folder that autofuse did not write into its replacement
    ``tmp`` (a retuned plan replaces the folder: a file of the user's there must stay)."""
    try:
        if not final.is_dir() or final.is_symlink():
            return
        for p in entry_files(final)[1]:
            dest = tmp / p.relative_to(final)
            if p.is_file() and not p.is_symlink() and not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(p, dest)
    except OSError:  # another writer replaced the entry meanwhile (its files went with it)
        pass


def publish_entry(tmp: Path, final: Path) -> None:
    """Rename the complete entry ``tmp`` to ``final``, replacing an older entry.

    Where the OS can swap two directories atomically, readers never see the entry missing;
    elsewhere the old entry is moved aside first (a reader in that instant sees a miss).
    Files of the old entry that autofuse did not write are copied into the new one first.
    """
    _keep_foreign(final, tmp)
    for _ in range(100):
        try:
            os.replace(tmp, final)  # no entry yet (or an empty directory)
            return
        except OSError as e:
            if not _exists_error(e):
                raise
        swapped = _exchange(tmp, final)
        if swapped:
            shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old entry
            return
        if swapped is None:
            continue  # another writer moved the entry away: rename again
        trash = final.parent / f".trash-{final.name}-{uuid.uuid4().hex[:12]}"
        try:
            os.replace(final, trash)
        except FileNotFoundError:
            continue  # another writer moved it already
        shutil.rmtree(trash, ignore_errors=True)
    raise OSError(f"could not replace {final}: other writers keep replacing it")


def _sweep(root: Path) -> None:
    """Remove temp / trash directories left by killed writers (only stale ones)."""
    now = time.time()
    try:
        children = list(root.iterdir())
    except OSError:
        return
    for p in children:
        if p.name.startswith((".tmp-", ".trash-")):
            try:
                if now - p.stat().st_mtime > STALE_SECONDS:
                    shutil.rmtree(p, ignore_errors=True)
            except OSError:
                pass


def plan_text(key: str, payload: dict) -> str:
    """plan.json for ``payload``: its digest, and its signature where a signing key is set."""
    digest = sha256_hex(canonical_json(payload))
    doc = {"autofuse_plan_cache": CACHE_FORMAT, "key": key, "payload_sha256": digest}
    signature = sign("plan", digest)
    if signature is not None:
        doc["signature"] = signature
    doc["payload"] = payload
    return json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def save_plan(
    cache_dir: str | os.PathLike, key: str, plan: Plan, metadata: dict | None = None
) -> Path:
    """Write ``plan`` as the entry ``key`` (atomically; an existing entry is replaced)."""
    final = entry_dir(cache_dir, key)
    files = _kernel_files(plan)
    kernels = iter(zip(plan.kernels, files))
    steps = []
    for step in plan.steps:
        if isinstance(step, KernelStep):
            kernel, file = next(kernels)
            steps.append(
                {"kind": "kernel", "kernel": encode_kernel(kernel, file), "reason": step.reason}
            )
        elif isinstance(step, LibraryStep):
            steps.append(encode_library_step(step))
        elif isinstance(step, EagerStep):
            steps.append({"kind": "eager", "node": step.node, "reason": step.reason})
        else:
            raise TypeError(f"cannot cache a plan step of type {type(step).__name__}")
    meta = _default_metadata()
    meta.update(json_safe(dict(metadata or {})))
    meta.setdefault("function", "")
    payload = {
        "format": CACHE_FORMAT,
        "key": key,
        "label": plan.label,
        "graph": encode_graph(plan.graph),
        "steps": steps,
        "metadata": meta,
    }
    text = plan_text(key, payload)

    root = plans_dir(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    _sweep(root)
    tmp = root / f".tmp-{key}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        for kernel, file in zip(plan.kernels, files):
            _write_file(tmp / file, kernel.source.encode())
        _write_file(tmp / PLAN_FILE, text.encode())
        _fsync_dir(tmp)
        publish_entry(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(root)
    return final


def store(
    optimized: Any,
    example_inputs: Sequence[Any],
    cache_dir: str | os.PathLike | None = None,
    options: dict | None = None,
    metadata: dict | None = None,
) -> Path:
    """Save an ``OptimizedFunction``'s plan under the key ``load`` will compute for it."""
    captured = optimized.captured
    key = key_for(captured, example_inputs, options)
    meta: dict[str, Any] = {
        "function": captured.source_name,
        "key_parts": key_parts(
            captured, DeviceInfo.current(inputs_device(example_inputs)), options
        ),
    }
    tuning = getattr(optimized, "tuning", None)
    if tuning is not None:
        meta["tuning"] = {
            name: json_safe(getattr(tuning, name))
            for name in (
                "value",
                "source",
                "greedy_value",
                "unfused_value",
                "library_value",
                "eager_value",
                "trials",
                "failed",
                "seconds",
                "kernel_times",
                "study_name",
                "end_to_end",
            )
            if hasattr(tuning, name)
        }
    meta.update(metadata or {})
    return save_plan(cache_dir, key, optimized.plan, meta)


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EntryInfo:
    key: str
    function: str
    created: float | None
    kernels: int
    ok: bool
    problem: str = ""
    path: str = ""

    def __str__(self) -> str:
        when = (
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.created))
            if self.created
            else "?"
        )
        state = "ok" if self.ok else f"CORRUPT ({self.problem})"
        return f"{self.key}  {self.function or '?'}  {when}  {self.kernels} kernels  {state}"


def read_doc(entry: Path) -> dict:
    """plan.json, parsed and checked against its digest; raises CorruptEntry."""
    file = entry / PLAN_FILE
    try:
        raw = read_bounded(file, PLAN_LIMIT)
    except FileNotFoundError:
        raise CorruptEntry(file, "plan.json is missing") from None
    except OSError as e:
        raise CorruptEntry(file, f"cannot be read: {e}") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CorruptEntry(file, f"is not valid JSON (truncated or corrupted?): {e}") from None
    if not isinstance(doc, dict):
        raise CorruptEntry(file, "is not a JSON object")
    fmt = doc.get("autofuse_plan_cache")
    if fmt != CACHE_FORMAT:
        raise CorruptEntry(
            file, f"was written in cache format {fmt!r}; this autofuse reads format {CACHE_FORMAT}"
        )
    payload = doc.get("payload")
    if not isinstance(payload, dict) or not isinstance(doc.get("payload_sha256"), str):
        raise CorruptEntry(file, "has no payload or no payload digest")
    if sha256_hex(canonical_json(payload)) != doc["payload_sha256"]:
        raise CorruptEntry(file, "the payload does not match its sha256 (the file was modified)")
    forged = signature_problem("plan", doc["payload_sha256"], doc.get("signature"))
    if forged is not None:
        raise CorruptEntry(file, forged)
    if payload.get("format") != CACHE_FORMAT:
        raise CorruptEntry(file, f"payload format {payload.get('format')!r} != {CACHE_FORMAT}")
    return payload


def _safe_file(entry: Path, name: Any) -> Path:
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.py", name):
        raise CorruptEntry(entry / PLAN_FILE, f"names an invalid kernel file {name!r}")
    return entry / name


def decode_plan(entry: Path, payload: dict) -> Plan:
    """The plan of ``entry`` from its parsed plan.json ``payload``, each kernel's source read and
    checked against its digest; raises CorruptEntry."""
    try:
        graph = decode_graph(payload["graph"])
        steps: list[Any] = []
        for s in payload["steps"]:
            if s["kind"] == "eager":
                steps.append(EagerStep(int(s["node"]), str(s["reason"])))
                continue
            if s["kind"] == "library":
                steps.append(decode_library_step(s, graph))
                continue
            if s["kind"] != "kernel":
                raise ValueError(f"unknown step kind {s['kind']!r}")
            k = s["kernel"]
            file = _safe_file(entry, k["source_file"])
            try:
                data = read_bounded(file, SOURCE_LIMIT)
            except FileNotFoundError:
                raise CorruptEntry(file, f"kernel file of {k['name']} is missing") from None
            except OSError as e:
                raise CorruptEntry(
                    file, f"kernel file of {k['name']} cannot be read: {e}"
                ) from None
            if sha256_hex(data) != k["source_sha256"]:
                raise CorruptEntry(
                    file, f"kernel source of {k['name']} does not match its sha256 (modified?)"
                )
            store = BinaryStore(entry, file.name, k["name"], k["source_sha256"]).scan()
            for path, problem in store.problems:
                if settings().strict:
                    raise CorruptEntry(path, f"binary of {k['name']} {problem}")
                warnings.warn(
                    f"autofuse cache: {path}: binary of {k['name']} {problem}; the kernel is "
                    "recompiled from its verified source",
                    CacheWarning,
                    stacklevel=2,
                )
            kernel = decode_kernel(k, data.decode("utf-8"))
            steps.append(KernelStep(kernel, store=store, reason=str(s.get("reason", ""))))
        return Plan(graph, tuple(steps), str(payload.get("label", "plan")))
    except CorruptEntry:
        raise
    except Exception as e:  # noqa: BLE001 - any decoding failure makes the entry unusable
        raise CorruptEntry(
            entry / PLAN_FILE, f"cannot be decoded ({type(e).__name__}: {e})"
        ) from None


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None


def read_entry(cache_dir: str | os.PathLike, key: str) -> tuple[Plan | None, dict, str | None]:
    """(plan, metadata, problem): plan None and problem None is a plain miss."""
    entry = entry_dir(cache_dir, key)
    attempts = 5
    for attempt in range(attempts):
        ino = _inode(entry)
        if ino is None:
            return None, {}, None
        try:
            payload = read_doc(entry)
            if payload.get("key") != key:
                raise CorruptEntry(
                    entry / PLAN_FILE, f"holds the entry {payload.get('key')!r}, not {key!r}"
                )
            return decode_plan(entry, payload), dict(payload.get("metadata") or {}), None
        except CorruptEntry as e:
            if _inode(entry) != ino:  # a concurrent writer replaced the entry while we read it
                if attempt < attempts - 1:
                    continue  # read again
                return None, {}, None  # replaced on every attempt: a miss, not a corrupt entry
            return None, {}, str(e)
    return None, {}, None  # pragma: no cover


def load_plan(cache_dir: str | os.PathLike, key: str) -> Plan | None:
    """The cached plan ``key``, or None (a miss; a corrupt entry also warns naming the file)."""
    plan, _, problem = read_entry(cache_dir, key)
    if problem is not None:
        warnings.warn(
            f"autofuse cache: skipping corrupt entry {key}: {problem}", CacheWarning, stacklevel=2
        )
    return plan


def load_metadata(cache_dir: str | os.PathLike, key: str) -> dict | None:
    """The metadata of a valid entry (function, created, versions, tuning times), or None."""
    plan, meta, _ = read_entry(cache_dir, key)
    return meta if plan is not None else None


def list_entries(cache_dir: str | os.PathLike | None = None) -> list[EntryInfo]:
    """Every entry of the cache, verified (corrupt ones are listed with their problem)."""
    root = plans_dir(cache_dir)
    if not root.is_dir():
        return []
    out = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".") or not entry.is_dir() or not KEY_RE.match(entry.name):
            continue
        plan, meta, problem = read_entry(cache_dir, entry.name)
        if plan is None and problem is None:
            continue  # vanished while listing
        function, created, kernels = str(meta.get("function", "")), meta.get("created"), 0
        if plan is not None:
            kernels = len(plan.kernels)
        else:
            function, created, kernels = _salvage(entry)
        out.append(
            EntryInfo(
                key=entry.name,
                function=function,
                created=created if isinstance(created, (int, float)) else None,
                kernels=kernels,
                ok=plan is not None,
                problem=problem or "",
                path=str(entry),
            )
        )
    return out


def _salvage(entry: Path) -> tuple[str, float | None, int]:
    """Best-effort function name / time / kernel count of a corrupt entry, for listing."""
    try:
        payload = json.loads((entry / PLAN_FILE).read_text())["payload"]
        meta = payload.get("metadata", {})
        kernels = sum(1 for s in payload.get("steps", ()) if s.get("kind") == "kernel")
        return str(meta.get("function", "")), meta.get("created"), kernels
    except Exception:  # noqa: BLE001
        return "", None, 0
