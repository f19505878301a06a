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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autofuse.files import RUN_FILE, read_json, write_atomic

STORAGE_FILE = "studies.journal"
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
    sizes: tuple[int, ...] = ()  # tuned at each size (``inputs(device, size)``), by bucket
    dynamic: Any = None  # {argument position: dims} (None: the dims whose sizes differ)
    size: int | None = None  # one of ``sizes``: this workload's (``at_sizes``)
    base: str = ""  # the spec's name of a workload of one size

    def target(self) -> Any:
        """What is tuned: the function, or a fresh module from the factory."""
        return self.fn if self.fn is not None else self.module()

    def example(self, device: str) -> tuple:
        """The inputs it is tuned on: ``inputs(device)``, or ``inputs(device, size)``."""
        return tuple(self.inputs(device) if self.size is None else self.inputs(device, self.size))


FIELDS = ("name", "fn", "module", "inputs", "trials", "time_budget", "flops", "sizes", "dynamic")


def at_sizes(w: Workload, sizes: Sequence[int]) -> list[Workload]:
    """``w`` tuned at each of ``sizes``: one workload per size, named ``<name>.<size>``, its
    inputs ``w.inputs(device, size)``; each caches its plan by shape bucket (one entry per
    bucket: two sizes of one bucket share the entry, the later tuned kept)."""
    name = w.base or w.name
    return [replace(w, name=f"{name}.{n}", sizes=tuple(sizes), size=n, base=name) for n in sizes]


def _sizes(rec: Any, where: str) -> tuple[int, ...]:
    """A record's ``sizes`` (a non-empty list of whole numbers of at least 1) and ``dynamic``
    (a dict {argument position: dims}), checked."""
    sizes, dynamic = _field(rec, "sizes"), _field(rec, "dynamic")
    if sizes is None:
        if dynamic is not None:
            raise SpecError(f"{where}: 'dynamic' needs 'sizes' (the sizes to tune at)")
        return ()
    if not isinstance(sizes, (list, tuple)) or not sizes:
        raise SpecError(f"{where}: 'sizes' must be a non-empty list of sizes (got {sizes!r})")
    for n in sizes:
        check_count(n, "each of 'sizes'", where, least=1)
    ok = dynamic is None or (isinstance(dynamic, dict) and all(
        isinstance(p, int) and isinstance(d, (list, tuple)) and all(isinstance(k, int) for k in d)
        for p, d in dynamic.items()))  # fmt: skip
    if not ok:
        raise SpecError(f"{where}: 'dynamic' must be {{argument position: [dims]}} (got "
                        f"{dynamic!r})")  # fmt: skip
    return tuple(dict.fromkeys(sizes))


class UsageError(ValueError):
    """A command-line value that is wrong: the command says so (naming it) before any work."""


class SpecError(UsageError):
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
    module = _import_spec(spec)
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
        check_count(_field(rec, "trials"), "'trials'", f"{where} ({name})", least=1)
        check_count(_field(rec, "time_budget"), "'time_budget'", f"{where} ({name})")
        sizes = _sizes(rec, f"{where} ({name})")
        w = Workload(name, fn, module_f, _field(rec, "inputs"), _field(rec, "trials"),
                     _field(rec, "time_budget"), _field(rec, "flops", 0.0),
                     dynamic=_field(rec, "dynamic"))  # fmt: skip
        out += at_sizes(w, sizes) if sizes else [w]
    names = [w.name for w in out]
    if len(set(names)) != len(names):
        raise SpecError(f"{spec}: workload names repeat: {names}")
    return out


def _import_spec(spec: str) -> Any:
    """The spec's module: a file loaded by path, or a module path imported from here (the
    current folder first); an import that fails is the user's to fix (named, no traceback)."""
    try:
        if spec.endswith(".py") or os.sep in spec:
            path = Path(spec)
            if not path.is_file():
                raise SpecError(f"autofuse tune: no spec file {spec!r}")
            name = f"autofuse_spec_{path.stem}"
            mod_spec = importlib.util.spec_from_file_location(name, path)
            assert mod_spec is not None and mod_spec.loader is not None
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[mod_spec.name] = module
            mod_spec.loader.exec_module(module)
            return module
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        return importlib.import_module(spec)
    except ImportError as e:
        what = "the spec" if e.name and spec.startswith(e.name) else f"spec {spec!r} imports"
        raise SpecError(
            f"autofuse tune: cannot import {what} ({type(e).__name__}: {e}); give a Python file "
            f"(path/to/spec.py) or a module path importable from {os.getcwd()}"
        ) from e


def check_count(value: Any, what: str, where: str, least: int | None = None) -> None:
    """``value`` (None: not given) is a whole number of at least ``least``, or with no ``least``
    a number of seconds above 0; else :class:`UsageError` naming ``what`` and ``where``."""
    if value is None:
        return
    kinds = (int,) if least is not None else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        bad = True
    else:
        bad = value < least if least is not None else not value > 0  # (NaN is bad too)
    if bad:
        want = f"a whole number, at least {least}" if least is not None else "seconds, above 0"
        raise UsageError(f"{where}: {what} must be {want} (got {value!r})")


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower() or "device"


def run_dir(out: str | Path, resume: Any, device: str, names: Sequence[str]) -> Path:
    """``<out>/<date>_<gpu>``; with ``resume`` the newest run there of the spec defining
    ``names`` (or the folder named, which must be one: else :class:`UsageError`)."""
    out = Path(out)
    tag = slug(device)
    if isinstance(resume, str):
        problem = not_a_run_of(Path(resume), names)
        if problem is not None:
            raise UsageError(
                f"autofuse tune: --resume {resume}: {problem}. Give a run folder of this spec "
                "(autofuse-runs/<date>_<device>), --resume alone for the newest one in --out, "
                "or leave --resume out to start a new run"
            )
        return Path(resume)
    if resume:
        found = sorted(p for p in out.glob(f"*_{tag}") if not_a_run_of(p, names) is None)
        if found:
            return found[-1]
        print(f"autofuse tune: --resume: no earlier run of this spec on {device} in {out}; "
              "starting a new one", file=sys.stderr, flush=True)  # fmt: skip
    base = f"{time.strftime('%Y-%m-%d')}_{tag}"
    path, n = out / base, 2
    while path.exists():
        path, n = out / f"{time.strftime('%Y-%m-%d')}-{n}_{tag}", n + 1
    return path


def run_workloads(folder: Path) -> set[str]:
    """The workloads of a run folder: its spec's names (``run.json``) and its results."""
    doc = read_json(folder / RUN_FILE) or {}
    names = {str(n) for n in doc.get("workloads", ()) if isinstance(doc.get("workloads"), list)}
    return names | {p.stem for p in folder.glob("*.json") if p.name != RUN_FILE}


def not_a_run_of(folder: Path, names: Sequence[str]) -> str | None:
    """Why ``folder`` is not a run of the spec defining ``names`` (None: it is one)."""
    if not folder.exists():
        return "no such folder"
    if not folder.is_dir():
        return "a file, not a run folder"
    if not (folder / RUN_FILE).is_file():
        return f"no {RUN_FILE} there: not a folder autofuse tune wrote"
    others = sorted(run_workloads(folder) - set(names))
    if others:
        return f"a run of another spec (it holds {others}, which this spec does not define)"
    return None


def write_json(path: Path, doc: Any) -> None:
    """Write atomically: a reader (or a resumed run) never sees half a file."""
    write_atomic(path, json.dumps(doc, indent=1, default=str).encode(), hidden=True)


def is_complete(path: Path) -> bool:
    doc = read_json(path)
    return doc is not None and doc.get("complete") is True
