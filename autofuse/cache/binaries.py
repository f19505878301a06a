"""Compiled kernel binaries in a cache entry: launch a cached plan without compiling.

After a kernel of a plan that came from an entry is compiled on CUDA for the first time, what
Triton needs to launch it again (the cubin, Triton's metadata json and the specialization of
its source: signature, constexprs, attributes) is written beside the kernel source as
``<entry>/bin/<kernel>.<sm>.<alignment>.json``, one JSON document with its own sha256 and the
sha256 of the kernel source it was compiled from. A later process verifies it when the entry is
decoded and, on the first launch, builds Triton's ``CompiledKernel`` from the verified bytes
instead of compiling, when the GPU's compute capability and the torch / triton versions are
the ones it was built with. Otherwise (and for any binary that fails its digest) the kernel is
recompiled from its (verified) source, after one warning; ``AUTOFUSE_STRICT=1`` refuses instead.

The one Triton-specific step is :func:`compiled_from_record` (and its inverse,
:func:`record_from_compiled`); on a machine without CUDA (or under the interpreter) nothing here
is ever called at run time, and the storage and verification are tested with a stand-in.
"""

from __future__ import annotations

import base64
import json
import re
import tempfile
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from autofuse.cache.codec import canonical_json, sha256_hex
from autofuse.cache.keys import CacheWarning, triton_version
from autofuse.cache.trust import BINARY_LIMIT, read_bounded, sign, signature_problem
from autofuse.files import write_atomic
from autofuse.settings import settings

BIN_DIR = "bin"
BINARY_FORMAT = 2  # 2: the signature as ordered [name, type] pairs


class BinaryMismatch(RuntimeError):
    """A stored binary is for another GPU or other versions (strict mode raises this)."""


def _align_tag(align: Sequence[bool]) -> str:
    return "".join("a" if a else "u" for a in align) or "none"


def current_build() -> dict[str, Any]:
    """What a binary must match: compute capability, torch and triton versions."""
    cap = None
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        cap = [int(major), int(minor)]
    return {"capability": cap, "torch": str(torch.__version__), "triton": triton_version()}


def mismatch(record: dict, build: dict | None = None) -> list[str]:
    """What differs between a binary's build and this process's (empty: usable)."""
    build = build or current_build()
    return [
        f"{k}: binary {record.get(k)!r}, here {build[k]!r}"
        for k in ("capability", "torch", "triton")
        if record.get(k) != build[k]
    ]


def _encode_path_dict(d: dict) -> list:
    return [[list(k) if isinstance(k, tuple) else k, v] for k, v in d.items()]


def _decode_path_dict(items: list) -> dict:
    return {tuple(k) if isinstance(k, list) else k: v for k, v in items}


def record_from_compiled(compiled: Any) -> dict | None:
    """What :func:`compiled_from_record` needs, from Triton's ``CompiledKernel`` (None when it
    is not a shape of Triton this knows, or holds values JSON cannot carry)."""
    try:
        binary = compiled.kernel
        if not isinstance(binary, (bytes, bytearray)):
            return None
        meta_json = None
        for name, path in (getattr(compiled, "metadata_group", None) or {}).items():
            if name.endswith(".json") and not name.startswith("__grp__"):
                meta_json = Path(path).read_text()
                break
        if meta_json is None:
            meta_json = json.dumps(compiled.metadata._asdict(), default=vars)
        src = compiled.src
        rec = {
            "name": str(compiled.name),
            "hash": str(compiled.hash),
            "metadata_json": meta_json,
            "binary_ext": "cubin",
            "binary_b64": base64.b64encode(bytes(binary)).decode(),
            "binary_sha256": sha256_hex(bytes(binary)),
            # ordered pairs: the launcher packs arguments in signature order, and the record
            # is written with sorted keys (a dict here came back alphabetical: wrong launches)
            "signature": [[str(k), v] for k, v in src.signature.items()],
            "constexprs": _encode_path_dict(dict(src.constants)),
            "attrs": _encode_path_dict(dict(src.attrs)),
        }
        json.dumps(rec)  # only what JSON carries exactly
        return rec
    except Exception:  # noqa: BLE001 - another Triton: no binary is stored, nothing breaks
        return None


def compiled_from_record(fn: Any, record: dict) -> Any:
    """Triton's ``CompiledKernel`` for the jitted ``fn`` from a verified record, no compiling.

    The bytes are written to a private temporary folder only because ``CompiledKernel`` reads
    files; it reads them in its constructor, before the folder is removed."""
    from triton.compiler.compiler import ASTSource, CompiledKernel

    attrs = {k: [tuple(a) for a in v] for k, v in _decode_path_dict(record["attrs"]).items()}
    signature = {str(k): v for k, v in record["signature"]}
    if list(signature) != list(getattr(fn, "arg_names", signature)):
        raise ValueError("the binary's signature does not list the kernel's parameters in order")
    src = ASTSource(fn, signature, _decode_path_dict(record["constexprs"]), attrs)
    binary = base64.b64decode(record["binary_b64"])
    if sha256_hex(binary) != record["binary_sha256"]:
        raise ValueError("binary does not match its sha256")
    name = re.sub(r"[^A-Za-z0-9_]", "_", record["name"])
    with tempfile.TemporaryDirectory(prefix="autofuse-bin-") as d:
        meta, bin_ = Path(d, f"{name}.json"), Path(d, f"{name}.{record['binary_ext']}")
        meta.write_text(record["metadata_json"])
        bin_.write_bytes(binary)
        return CompiledKernel(src, {meta.name: str(meta), bin_.name: str(bin_)}, record["hash"])


def read_binary(path: Path, source_sha256: str) -> dict:
    """A binary record, checked (its own digest, the binary's, the source it was built from);
    raises ValueError naming the problem."""
    try:
        raw = read_bounded(path, BINARY_LIMIT)
    except OSError as e:
        raise ValueError(f"cannot be read: {e}") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"is not valid JSON (truncated or corrupted?): {e}") from None
    if not isinstance(doc, dict) or doc.get("autofuse_binary") != BINARY_FORMAT:
        raise ValueError("is not an autofuse binary of this format")
    payload = doc.get("payload")
    if not isinstance(payload, dict) or sha256_hex(canonical_json(payload)) != doc.get(
        "payload_sha256"
    ):
        raise ValueError("does not match its sha256 (the file was modified)")
    forged = signature_problem("binary", doc["payload_sha256"], doc.get("signature"))
    if forged is not None:
        raise ValueError(forged)
    if payload.get("source_sha256") != source_sha256:
        raise ValueError("was compiled from another source")
    try:
        binary = base64.b64decode(payload["binary_b64"], validate=True)
    except (KeyError, ValueError) as e:
        raise ValueError(f"holds no readable binary ({e})") from None
    if sha256_hex(binary) != payload.get("binary_sha256"):
        raise ValueError("the binary does not match its sha256")
    return payload


def write_binary(path: Path, payload: dict) -> None:
    doc = {"autofuse_binary": BINARY_FORMAT, "payload_sha256": sha256_hex(canonical_json(payload))}
    signature = sign("binary", doc["payload_sha256"])
    if signature is not None:
        doc["signature"] = signature
    doc["payload"] = payload
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(doc, sort_keys=True).encode(), hidden=True)


class BinaryStore:
    """One kernel's binaries in one entry: the verified ones, and where new ones go."""

    def __init__(self, entry: Path, kernel_file: str, kernel: str, source_sha256: str) -> None:
        self.entry, self.stem, self.kernel = Path(entry), Path(kernel_file).stem, kernel
        self.source_sha256 = source_sha256
        self.records: dict[tuple[bool, ...], dict] = {}
        self.problems: list[tuple[Path, str]] = []
        self._lock = threading.Lock()

    def scan(self) -> BinaryStore:
        """Read and verify this kernel's binaries (a bad one is dropped, its problem kept)."""
        folder = self.entry / BIN_DIR
        if not folder.is_dir():
            return self
        for path in sorted(folder.glob(f"{self.stem}.*.json")):
            try:
                rec = read_binary(path, self.source_sha256)
                self.records[tuple(bool(a) for a in rec["align"])] = rec
            except (ValueError, KeyError, TypeError) as e:
                self.problems.append((path, str(e)))
        return self

    def restore(self, fn: Any, align: tuple[bool, ...]) -> Any:
        """A launchable ``CompiledKernel`` for these alignments, or None (compile instead)."""
        rec = self.records.get(align)
        if rec is None:
            return None
        differs = mismatch(rec)
        try:
            if differs:
                raise BinaryMismatch("; ".join(differs))
            return compiled_from_record(fn, rec)
        except Exception as e:  # noqa: BLE001 - a binary that cannot be used is recompiled
            if settings().strict:
                raise BinaryMismatch(f"binary of kernel {self.kernel}: {e}") from e
            self.records.pop(align, None)
            warnings.warn(
                f"autofuse: the stored binary of kernel {self.kernel} cannot be used "
                f"({type(e).__name__}: {e}); recompiling it from its verified source",
                CacheWarning,
                stacklevel=4,
            )
            return None

    def save(self, align: tuple[bool, ...], compiled: Any) -> None:
        """Store the binary of a first compile (best effort: a failure only costs a compile)."""
        rec = record_from_compiled(compiled)
        build = current_build()
        if rec is None or build["capability"] is None:
            return
        rec.update(build, kernel=self.kernel, source_sha256=self.source_sha256)
        rec["align"] = list(align)
        cap = "sm_{}{}".format(*build["capability"])
        path = self.entry / BIN_DIR / f"{self.stem}.{cap}.{_align_tag(align)}.json"
        with self._lock:
            try:
                if self.entry.is_dir():
                    write_binary(path, rec)
                    self.records[align] = rec
            except OSError:
                pass  # a read-only cache still runs; it compiles in every process
