"""Export and import cache entries as one file (``autofuse cache export / import``).

A bundle is a zip file: ``plans/<key>/...`` (plan.json, the kernel sources, the compiled
binaries under ``bin/``), optionally ``calls/<call key>.json`` (the call index's records of
those entries, so ``load`` needs no capture) and ``manifest.json``: the sha256 of every file, each entry's build
(device, torch / triton / autofuse versions, what its key was computed from) and the provenance
of the export (host, time, versions). The manifest carries its own digest.

``import_bundle`` checks everything before it installs anything: the manifest's digest, that
the zip holds exactly the files it lists, each file's sha256 and then each entry as the cache
reads it (plan digest, kernel digests, binaries). An entry built for another device kind or
other versions is refused, with a message naming what differs; with ``loose=True`` it is
installed under the key this machine computes (its binaries dropped: the kernels are compiled
from their verified sources here), unless its kernels came from another code generator
(``generator``, a hash of autofuse's sources): those are always refused. Entries are installed atomically into the cache home; an entry
cached by shape bucket (``cache/buckets.py``) is added to the bucket index there, so that
``load`` finds it at every size of its bucket.
"""

from __future__ import annotations

import io
import json
import os
import platform
import re
import shutil
import sys
import time
import uuid
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from autofuse.cache.binaries import BIN_DIR
from autofuse.cache.buckets import note_bucket
from autofuse.cache.calls import CALLS_DIR, read_call
from autofuse.cache.codec import canonical_json, sha256_hex
from autofuse.cache.disk import (
    decode_plan,
    plan_text,
    plans_dir,
    publish_entry,
    read_doc,
    read_entry,
)
from autofuse.cache.keys import (
    CACHE_FORMAT,
    KEY_RE,
    PLAN_FILE,
    CorruptEntry,
    DeviceInfo,
    generator_id,
    key_of_parts,
    triton_version,
)
from autofuse.cache.trust import (
    BUNDLE_LIMIT,
    CALL_LIMIT,
    MEMBER_LIMIT,
    open_regular,
    read_bounded,
    sign,
    signature_problem,
)
from autofuse.files import write_atomic
from autofuse.settings import cache_home
from autofuse.version import __version__

BUNDLE_FORMAT = 1
MANIFEST = "manifest.json"
BUILD_FIELDS = ("device", "torch", "triton", "autofuse", "generator")
_CALL_RE = re.compile(r"^[0-9a-f]{32}$")
_REL_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)?$")


class BundleError(ValueError):
    """A bundle that cannot be installed: corrupted, or built for another device / versions."""


def here() -> dict[str, str]:
    """This machine's build: what an entry's key was computed with."""
    return {
        "device": DeviceInfo.current().tag(),
        "torch": str(torch.__version__),
        "triton": triton_version(),
        "autofuse": __version__,
        "generator": generator_id(),
    }


def entry_build(meta: dict) -> dict[str, Any]:
    """An entry's build, from the key parts its metadata records (or its provenance)."""
    parts = meta.get("key_parts") if isinstance(meta.get("key_parts"), dict) else {}
    return {
        "device": parts.get("device") or meta.get("gpu") or "cpu-interpreter",
        **{k: parts.get(k) or meta.get(k) for k in ("torch", "triton", "autofuse", "generator")},
    }


def _entry_files(entry: Path) -> list[str]:
    out = []
    for p in sorted(entry.rglob("*")):
        rel = p.relative_to(entry).as_posix()
        if p.is_file() and not any(part.startswith(".") for part in rel.split("/")):
            out.append(rel)
    return out


def export_bundle(
    out: str | os.PathLike,
    keys: list[str] | None = None,
    cache_dir: Any = None,
    calls: dict[str, str] | None = None,
) -> dict:
    """Write the entries ``keys`` (default: every valid entry) to the bundle ``out``, with the
    call index's records ``calls`` (call key -> entry key: ``load`` then needs no capture)."""
    root = plans_dir(cache_dir)
    if keys is None:
        keys = sorted(p.name for p in root.iterdir() if KEY_RE.match(p.name) and p.is_dir()) \
            if root.is_dir() else []  # fmt: skip
    if not keys:
        raise BundleError(f"nothing to export: no cache entries in {root}")
    blobs: dict[str, bytes] = {}
    entries = {key: _export_entry(cache_dir, root, key, blobs) for key in keys}
    manifest = _manifest(entries, _call_records(cache_dir, calls or {}, entries, blobs))
    _write_zip(Path(out), blobs, manifest)
    return manifest


def _export_entry(cache_dir: Any, root: Path, key: str, blobs: dict[str, bytes]) -> dict:
    """The manifest record of the valid entry ``key``, its files added to ``blobs``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan, meta, problem = read_entry(cache_dir, key)
    if plan is None:
        raise BundleError(f"entry {key}: {problem or 'no such entry in ' + str(root)}")
    files = {}
    for rel in _entry_files(root / key):
        data = (root / key / rel).read_bytes()
        blobs[f"plans/{key}/{rel}"] = data
        files[rel] = sha256_hex(data)
    return {
        "files": files,
        "build": entry_build(meta),
        "function": str(meta.get("function", "")),
        "kernels": len(plan.kernels),
    }


def _manifest(entries: dict, call_records: dict) -> dict[str, Any]:
    """The bundle's manifest: its entries, call records and provenance, digested and signed."""
    manifest: dict[str, Any] = {
        "autofuse_bundle": BUNDLE_FORMAT,
        "cache_format": CACHE_FORMAT,
        "provenance": {
            "created": time.time(),
            "created_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "host": platform.node(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "cuda": torch.version.cuda,
            **here(),
        },
        "entries": entries,
    }
    if call_records:
        manifest["calls"] = call_records
    manifest["manifest_sha256"] = sha256_hex(canonical_json(manifest))
    signature = sign("bundle", manifest["manifest_sha256"])
    if signature is not None:
        manifest["manifest_hmac"] = signature
    return manifest


def _write_zip(out: Path, blobs: dict[str, bytes], manifest: dict) -> None:
    """The zip ``out`` of ``blobs`` and ``manifest``, written whole or not at all."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for name, data in blobs.items():
                z.writestr(name, data)
            z.writestr(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _call_records(cache_dir: Any, calls: dict[str, str], entries: dict, blobs: dict) -> dict:
    """The call records of exported entries, added to ``blobs``: call key -> its entry and
    digest (a record whose file is gone is left out: ``load`` captures for that call)."""
    home = cache_home(cache_dir)
    out = {}
    for ck, key in sorted(calls.items()):
        if key not in entries or not _CALL_RE.match(ck):
            continue
        if (read_call(home, ck) or {}).get("plan_key") != key:
            continue  # gone, damaged or now naming another entry
        try:
            data = read_bounded(home / CALLS_DIR / f"{ck}.json", CALL_LIMIT)
        except OSError:
            continue
        blobs[f"{CALLS_DIR}/{ck}.json"] = data
        out[ck] = {"plan_key": key, "sha256": sha256_hex(data)}
    return out


def _install_calls(cache_dir: Any, manifest: dict, blobs: dict, kept: set[str]) -> None:
    """Write the bundle's call records whose entry was installed under its own key (a
    re-keyed entry's calls hash other versions: they would never match here)."""
    folder = cache_home(cache_dir) / CALLS_DIR
    for ck, rec in manifest.get("calls", {}).items():
        if rec["plan_key"] in kept:
            folder.mkdir(parents=True, exist_ok=True)
            write_atomic(folder / f"{ck}.json", blobs[f"{CALLS_DIR}/{ck}.json"], hidden=True)


def _corrupt(path: Any, why: str) -> BundleError:
    return BundleError(f"bundle {os.fspath(path)} is corrupted: {why}")


def _read_members(path: Any) -> dict[str, bytes]:
    """Every member of the zip ``path``, each checked against its declared size before it is
    decompressed (a member over :data:`MEMBER_LIMIT`, all over :data:`BUNDLE_LIMIT`, a name
    twice: refused), and never decompressed past that size."""
    with open_regular(Path(path), BUNDLE_LIMIT) as f, zipfile.ZipFile(f) as z:
        infos = z.infolist()
        names = [i.filename for i in infos]
        if len(set(names)) != len(names):
            raise _corrupt(path, "a file name appears twice in the zip")
        if MANIFEST not in names:
            raise _corrupt(path, "it has no manifest.json")
        total = sum(i.file_size for i in infos)
        big = [i.filename for i in infos if i.file_size > MEMBER_LIMIT]
        if big or total > BUNDLE_LIMIT:
            raise _corrupt(path, f"its files unpack to {total} bytes (over the limits: {big})")
        blobs = {}
        for i in infos:
            with z.open(i) as member:
                data = member.read(i.file_size + 1)
            if len(data) != i.file_size:
                raise _corrupt(path, f"{i.filename} does not unpack to its declared size")
            blobs[i.filename] = data
    return blobs


def read_bundle(path: str | os.PathLike) -> tuple[dict, dict[str, bytes]]:
    """(manifest, files by name), every digest (and signature, with a signing key) checked;
    raises BundleError."""
    try:
        blobs = _read_members(path)
    except BundleError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise BundleError(f"no bundle at {os.fspath(path)}") from None
        raise _corrupt(path, f"{type(e).__name__}: {e}") from None
    except Exception as e:  # noqa: BLE001 - zlib errors and the like: a damaged file
        raise _corrupt(path, f"{type(e).__name__}: {e}") from None
    try:
        manifest = json.loads(blobs.pop(MANIFEST).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _corrupt(path, f"manifest.json is not valid JSON: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("autofuse_bundle") != BUNDLE_FORMAT:
        raise _corrupt(path, "manifest.json is not an autofuse bundle manifest of this format")
    body = {k: v for k, v in manifest.items() if k not in ("manifest_sha256", "manifest_hmac")}
    if sha256_hex(canonical_json(body)) != manifest.get("manifest_sha256"):
        raise _corrupt(path, "manifest.json does not match its sha256 (modified)")
    forged = signature_problem("bundle", manifest["manifest_sha256"], manifest.get("manifest_hmac"))
    if forged is not None:
        raise BundleError(f"bundle {os.fspath(path)} is refused: its manifest {forged}")
    listed = _listed_files(path, manifest)
    listed.update(_listed_calls(path, manifest))
    if set(listed) != set(blobs):
        extra, missing = sorted(set(blobs) - set(listed)), sorted(set(listed) - set(blobs))
        raise _corrupt(path, f"files not in the manifest {extra}, missing files {missing}")
    for name, digest in listed.items():
        if sha256_hex(blobs[name]) != digest:
            raise _corrupt(path, f"{name} does not match its sha256")
    return manifest, blobs


def _listed_files(path: Any, manifest: dict) -> dict[str, str]:
    """``plans/<key>/<file>`` -> sha256 for every file the manifest lists; one-line errors
    for a manifest of the wrong shape."""
    entries = manifest.get("entries")
    if not isinstance(entries, dict) or not entries:
        raise _corrupt(path, "manifest.json's 'entries' is not a non-empty map of entries")
    listed: dict[str, str] = {}
    for key, e in entries.items():
        if not KEY_RE.match(key):
            raise _corrupt(path, f"invalid entry key {key!r}")
        files = e.get("files") if isinstance(e, dict) else None
        if not isinstance(files, dict) or not files:
            raise _corrupt(path, f"entry {key} has no map of files in manifest.json")
        if not isinstance(e.get("build", {}), dict):
            raise _corrupt(path, f"entry {key}'s 'build' in manifest.json is not a map")
        for rel, digest in files.items():
            if not _REL_RE.match(rel) or ".." in rel.split("/"):
                raise _corrupt(path, f"invalid file name {rel!r} in entry {key}")
            if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
                raise _corrupt(path, f"entry {key}: {rel}'s digest is not a sha256")
            if rel.split("/")[0] in files and "/" in rel:
                raise _corrupt(path, f"entry {key} lists both {rel.split('/')[0]!r} and {rel!r}")
            listed[f"plans/{key}/{rel}"] = digest
    return listed


def _listed_calls(path: Any, manifest: dict) -> dict[str, str]:
    """``calls/<call key>.json`` -> sha256 for every call record the manifest lists, each of
    an entry of the bundle."""
    calls = manifest.get("calls", {})
    if not isinstance(calls, dict):
        raise _corrupt(path, "manifest.json's 'calls' is not a map of call records")
    listed = {}
    for ck, rec in calls.items():
        if not _CALL_RE.match(ck) or not isinstance(rec, dict):
            raise _corrupt(path, f"invalid call record {ck!r}")
        if rec.get("plan_key") not in manifest["entries"]:
            raise _corrupt(path, f"call record {ck} names no entry of the bundle")
        if not isinstance(rec.get("sha256"), str):
            raise _corrupt(path, f"call record {ck}'s digest is not a sha256")
        listed[f"{CALLS_DIR}/{ck}.json"] = rec["sha256"]
    return listed


def differences(build: dict, local: dict | None = None) -> list[str]:
    local = local or here()
    return [
        f"{k}: bundle {build.get(k)!r}, here {local[k]!r}"
        for k in BUILD_FIELDS
        if build.get(k) != local[k]
    ]


def _rekey(entry: Path, old_key: str, local: dict) -> str:
    """Rewrite ``entry``'s plan.json for the key this machine computes; drop its binaries."""
    payload = read_doc(entry)
    meta = payload.setdefault("metadata", {})
    parts = meta.get("key_parts")
    if not isinstance(parts, dict) or "graph" not in parts:
        raise BundleError(
            f"entry {old_key} records no key parts, so it cannot be re-keyed for this machine "
            "(it was cached by an older autofuse); tune it here instead"
        )
    parts = {**parts, **local}
    key = key_of_parts(parts)
    meta["imported_from"] = {"key": old_key, "build": entry_build(meta)}
    meta["key_parts"] = parts
    payload["key"] = key
    (entry / PLAN_FILE).write_text(plan_text(key, payload))  # signed here, where a key is set
    shutil.rmtree(entry / BIN_DIR, ignore_errors=True)  # built for another GPU / versions
    return key


def _refuse_builds(path: Any, entries: dict, local: dict, loose: bool) -> None:
    """Raise naming every entry built elsewhere (``loose`` admits all but another generator's:
    its kernels are what another autofuse generated, whatever they are compiled with)."""
    refused, generators = [], False
    for key, e in entries.items():
        build = e.get("build") or {}
        diff = differences(build, local)
        other = build.get("generator") != local["generator"]
        if diff and (not loose or other):
            generators |= other
            refused.append(f"entry {key} ({e.get('function') or '?'}): " + "; ".join(diff))
    if refused:
        hint = (
            ""
            if loose
            else ("\nimport it with --loose (loose=True) to recompile its kernels from source here")
        )
        if generators:
            hint += (
                "\nkernels made by another autofuse (generator) are never installed, "
                "even loose: tune them again with this one"
            )
        raise BundleError(
            f"bundle {os.fspath(path)} was built for another device or other versions:\n  "
            + "\n  ".join(refused)
            + hint
        )


def import_bundle(
    path: str | os.PathLike, cache_dir: Any = None, loose: bool = False
) -> list[tuple[str, str]]:
    """Check the bundle ``path`` and install its entries; returns (key in bundle, key here)."""
    manifest, blobs = read_bundle(path)
    local = here()
    _refuse_builds(path, manifest["entries"], local, loose)
    root = plans_dir(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    staged: list[tuple[str, str, Path]] = []
    tmps: list[Path] = []
    parts: list[Any] = []  # each entry's key parts: a bucket entry's go into the bucket index
    try:
        for key, e in manifest["entries"].items():
            tmp = root / f".tmp-import-{key}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
            tmps.append(tmp)
            for rel in e["files"]:
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp / rel).write_bytes(blobs[f"plans/{key}/{rel}"])
            new = _rekey(tmp, key, local) if differences(e.get("build") or {}, local) else key
            staged.append((key, new, tmp))
            try:  # the entry as the cache will read it: plan digest, kernels, binaries
                payload = read_doc(tmp)
                parts.append((payload.get("metadata") or {}).get("key_parts"))
                if payload.get("key") != new:
                    raise CorruptEntry(tmp / PLAN_FILE, f"holds the entry {payload.get('key')!r}")
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    decode_plan(tmp, payload)
            except (CorruptEntry, Warning) as err:
                raise _corrupt(path, f"entry {key}: {err}") from None
        for _, new, tmp in staged:
            publish_entry(tmp, root / new)
    finally:
        for tmp in tmps:
            shutil.rmtree(tmp, ignore_errors=True)
    _install_calls(cache_dir, manifest, blobs, {old for old, new, _ in staged if old == new})
    for p in parts:
        note_bucket(cache_home(cache_dir), p)
    return [(old, new) for old, new, _ in staged]


def bundle_summary(path: str | os.PathLike) -> str:
    """What a bundle holds (for messages)."""
    manifest, _ = read_bundle(path)
    buf = io.StringIO()
    prov = manifest.get("provenance") if isinstance(manifest.get("provenance"), dict) else {}
    print(f"bundle from {prov.get('host')} at {prov.get('created_iso')}", file=buf)
    for key, e in manifest["entries"].items():
        print(f"  {key}  {e.get('function') or '?'}  {e.get('build')}", file=buf)
    return buf.getvalue()
