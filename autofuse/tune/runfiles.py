"""The files of an ``autofuse tune`` run: the workload records of a SPEC, the run folder,
atomic JSON (see ``autofuse/tune/overnight.py`` for the SPEC format)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autofuse.files import write_atomic

STORAGE_FILE = "studies.journal"
RUN_FILE = "run.json"
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class Workload:
    name: str
    fn: Callable[..., Any] | None
    module: Callable[[], Any] | None
    inputs: Callable[[str], tuple]
    trials: int | None = None
    time_budget: float | None = None
    flops: Any = 0.0

    def target(self) -> Any:
        """What is tuned: the function, or a fresh module from the factory."""
        return self.fn if self.fn is not None else self.module()


FIELDS = ("name", "fn", "module", "inputs", "trials", "time_budget", "flops")


class SpecError(ValueError):
    """A spec file that cannot be read, or a record of it that is wrong (named)."""


def _check_fields(rec: Any, where: str) -> None:
    """A record's keys are the known ones: a misspelt ``trails`` must not be ignored."""
    if not isinstance(rec, dict):
        return
    import difflib

    for key in rec:
        if key not in FIELDS:
            close = difflib.get_close_matches(str(key), FIELDS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise SpecError(f"{where}: unknown key {key!r}{hint} (known keys: {', '.join(FIELDS)})")


def _field(rec: Any, key: str, default: Any = None) -> Any:
    return rec.get(key, default) if isinstance(rec, dict) else getattr(rec, key, default)


def load_spec(spec: str) -> list[Workload]:
    """The ``WORKLOADS`` of a spec file or module, checked (a bad record raises naming it)."""
    if spec.endswith(".py") or os.sep in spec:
        path = Path(spec)
        if not path.is_file():
            raise SpecError(f"autofuse tune: no spec file {spec!r}")
        mod_spec = importlib.util.spec_from_file_location(f"autofuse_spec_{path.stem}", path)
        assert mod_spec is not None and mod_spec.loader is not None
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[mod_spec.name] = module
        mod_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(spec)
    records = getattr(module, "WORKLOADS", None)
    if not isinstance(records, (list, tuple)) or not records:
        raise SpecError(f"autofuse tune: {spec} must define WORKLOADS, a non-empty list")
    out: list[Workload] = []
    for k, rec in enumerate(records):
        name, fn, module_f = _field(rec, "name"), _field(rec, "fn"), _field(rec, "module")
        where = f"{spec}: WORKLOADS[{k}]"
        _check_fields(rec, where)
        if not isinstance(name, str) or not _NAME.match(name):
            raise SpecError(f"{where}: 'name' must be letters, digits, _ . - (got {name!r})")
        if (fn is None) == (module_f is None) or not callable(fn or module_f):
            raise SpecError(f"{where} ({name}): give exactly one of 'fn' or 'module' (callable)")
        if not callable(_field(rec, "inputs")):
            raise SpecError(f"{where} ({name}): 'inputs' must be a factory of the inputs")
        out.append(Workload(name, fn, module_f, _field(rec, "inputs"), _field(rec, "trials"),
                            _field(rec, "time_budget"), _field(rec, "flops", 0.0)))  # fmt: skip
    names = [w.name for w in out]
    if len(set(names)) != len(names):
        raise SpecError(f"{spec}: workload names repeat: {names}")
    return out


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower() or "device"


def run_dir(out: str | Path, resume: Any, device: str) -> Path:
    """``<out>/<date>_<gpu>``; with ``resume`` the newest such folder (or the one named)."""
    out = Path(out)
    tag = slug(device)
    if isinstance(resume, str):
        return Path(resume)
    if resume:
        found = sorted(p for p in out.glob(f"*_{tag}") if (p / RUN_FILE).is_file())
        if found:
            return found[-1]
    base = f"{time.strftime('%Y-%m-%d')}_{tag}"
    path, n = out / base, 2
    while path.exists():
        path, n = out / f"{time.strftime('%Y-%m-%d')}-{n}_{tag}", n + 1
    return path


def write_json(path: Path, doc: Any) -> None:
    """Write atomically: a reader (or a resumed run) never sees half a file."""
    write_atomic(path, json.dumps(doc, indent=1, default=str).encode(), hidden=True)


def read_json(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def is_complete(path: Path) -> bool:
    doc = read_json(path)
    return doc is not None and doc.get("complete") is True
