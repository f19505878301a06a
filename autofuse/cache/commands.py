"""``autofuse cache list | show KEY | clear [KEY] | export KEY|--all -o FILE | import FILE``.

Every action works on the cache home (``AUTOFUSE_CACHE_DIR``, default a per-user folder) or
on ``--cache-dir``. ``list`` and ``show`` give each entry's input shapes, speedup (from the
tuning times it recorded: over the greedy plan, the unfused plan) and provenance (when, which
GPU, torch / triton / autofuse versions, imported from where).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from autofuse.cache.binaries import BIN_DIR
from autofuse.cache.buckets import BUCKETS_DIR
from autofuse.cache.bundle import BundleError, export_bundle, import_bundle
from autofuse.cache.calls import CALLS_DIR
from autofuse.cache.disk import entry_files, list_entries, plans_dir, read_entry
from autofuse.cache.keys import PLAN_FILE, valid_key
from autofuse.files import workload_records
from autofuse.plan import KernelStep, LibraryStep
from autofuse.settings import cache_home, settings

_KERNEL_FILE = re.compile(r"^[A-Za-z0-9_]+_[0-9a-f]{20}(\.py|[A-Za-z0-9_]*\.tmp)$")
_CALL_FILE = re.compile(r"^[0-9a-f]{32}\.json$|^\.?[0-9a-f]{32}.*\.tmp$")
_INDEX_FILE = re.compile(r"^[0-9a-f]{24}\.json$|^\.[0-9a-f]{24}.*\.tmp$")
_TEMPS = (".tmp-", ".trash-")


def _shapes(plan: Any) -> str:
    g = plan.graph
    return ", ".join(f"{g[i].dtype}{list(g[i].shape)}" for i in g.inputs)


def bucket_text(meta: dict) -> str:
    """The sizes a bucket entry serves (``cache/buckets.py``): each argument's shape, a
    dynamic size as ``<=N`` (its bucket's upper edge); "" for an entry of exact shapes."""
    bucket = (meta.get("key_parts") or {}).get("bucket")
    if not isinstance(bucket, dict):
        return ""
    args = [a for a in bucket.get("arguments") or () if isinstance(a, list) and len(a) == 4]
    sizes = [[f"<={str(s)[1:]}" if str(s).startswith("b") else s for s in a[3]] for a in args]
    return ", ".join(f"arg {a[0]}: {a[1].removeprefix('torch.')}{s}" for a, s in zip(args, sizes))


def speedups(meta: dict) -> dict[str, float]:
    """The tuned plan's speedup over its baselines, from the times its entry recorded."""
    tuning = meta.get("tuning") if isinstance(meta.get("tuning"), dict) else {}
    value = meta.get("value_s", tuning.get("value"))
    base = dict(meta.get("baselines_s") or {})
    for k in ("greedy", "unfused", "eager"):
        base.setdefault(k, tuning.get(f"{k}_value"))
    if not isinstance(value, (int, float)) or value <= 0:
        return {}
    return {k: v / value for k, v in base.items() if isinstance(v, (int, float)) and v > 0}


def _provenance(meta: dict) -> str:
    when = meta.get("created_iso") or "?"
    gpu = meta.get("gpu") or (meta.get("key_parts") or {}).get("device") or "cpu-interpreter"
    out = f"{when} on {gpu}, torch {meta.get('torch')}, triton {meta.get('triton')}, "
    out += f"autofuse {meta.get('autofuse')}"
    imported = meta.get("imported_from")
    if isinstance(imported, dict):
        out += f"; imported from {imported.get('key')} (built for {imported.get('build')})"
    return out


def _speed_text(meta: dict) -> str:
    s = speedups(meta)
    unit = "modeled" if meta.get("source") == "modeled" else "measured"
    return ", ".join(f"{v:.2f}x vs {k}" for k, v in s.items()) + f" ({unit})" if s else "-"


def cache_list(root: Any) -> int:
    for e in list_entries(root):
        if not e.ok:
            print(e)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan, meta, _ = read_entry(root, e.key)
        if plan is None:
            continue
        bucket = f"\n    bucket: {bucket_text(meta)}" if bucket_text(meta) else ""
        print(f"{e}\n    inputs: {_shapes(plan)}{bucket}\n    speedup: {_speed_text(meta)}"
              f"\n    built: {_provenance(meta)}")  # fmt: skip
    return 0


def cache_show(root: Any, key: str) -> int:
    key = resolve_key(root, key)
    plan, meta, problem = read_entry(root, key)
    if plan is None:
        print(f"entry {key}: {problem or 'not in ' + str(plans_dir(root))}", file=sys.stderr)
        return 1
    g = plan.graph
    print(f"entry {key}  ({plans_dir(root) / key})")
    print(f"function: {meta.get('function') or '?'}")
    print(f"inputs:   {_shapes(plan)}")
    if bucket_text(meta):
        print(f"bucket:   {bucket_text(meta)} (any size of the bucket; inputs: the tuning's)")
    print("outputs:  " + ", ".join(f"{g[o].dtype}{list(g[o].shape)}" for o in g.outputs))
    print(f"speedup:  {_speed_text(meta)}")
    if isinstance(meta.get("value_s"), (int, float)):
        print(f"time:     {meta['value_s'] * 1e6:.2f} us ({meta.get('trials', '?')} trials)")
    print(f"built:    {_provenance(meta)}")
    for step in plan.steps:
        if isinstance(step, KernelStep):
            k = step.kernel
            n_bin = len(step.store.records) if step.store is not None else 0
            print(f"  kernel {k.name}: {len(k.info.nodes)} ops, {k.config}, {n_bin} binaries")
        elif isinstance(step, LibraryStep):
            print(f"  library {step.implementation}: {step.reason}")
        else:
            print(f"  eager  {g[step.node].op}: {step.reason}")
    return 0


class UnknownKey(ValueError):
    """A key or key prefix that names no entry, or more than one."""


def resolve_key(root: Any, prefix: str) -> str:
    """The entry key ``prefix`` names: the key itself, or the one key it begins (as ``git``
    takes a short hash); raises :class:`UnknownKey` naming the candidates otherwise."""
    if not valid_key(prefix):
        raise UnknownKey(f"{prefix!r} is not a cache key (letters, digits, '_', '-', '.')")
    base = plans_dir(root)
    if (base / prefix).is_dir():
        return prefix
    found = sorted(p.name for p in base.glob(f"{prefix}*") if p.is_dir() and _is_entry(p))
    if len(found) == 1:
        return found[0]
    if not found:
        raise UnknownKey(f"no entry {prefix!r} in {base} (autofuse cache list shows the keys)")
    raise UnknownKey(f"key prefix {prefix!r} names {len(found)} entries in {base}: "
                    f"{', '.join(k[:20] + '…' for k in found[:8])}; give more of the key")  # fmt: skip


def _is_entry(path: Path) -> bool:
    return valid_key(path.name) and (path / PLAN_FILE).is_file()


def _own_kernel_file(path: Path) -> bool:
    """A kernel source ``loader.load_kernel`` wrote (``<name>_<sha20>.py``), its temporary
    or its compiled bytecode."""
    name = path.name
    if path.parent.name == "__pycache__":
        name = name.split(".")[0] + ".py" if name.endswith(".pyc") else ""
    return bool(_KERNEL_FILE.match(name))


def _remove(paths: list[Path]) -> int:
    n = 0
    for p in paths:
        try:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            n += 1
        except FileNotFoundError:
            pass
    return n


def _remove_entry(entry: Path) -> list[Path]:
    """Remove what autofuse wrote in an entry folder (the folder once empty); returns the paths
    left there that it did not write. A symbolic link is not autofuse's: left as it is."""
    if entry.is_symlink():
        return [entry]
    ours, theirs = entry_files(entry)
    _remove(ours)
    _rmdir_if_empty(entry / BIN_DIR, entry)
    return theirs


def _say_left(left: list[Path]) -> None:
    if left:
        shown = ", ".join(str(p) for p in left[:5]) + (" …" if len(left) > 5 else "")
        print(f"left in place, not written by autofuse: {shown}", file=sys.stderr)


def _rmdir_if_empty(*folders: Path) -> None:
    for d in folders:
        try:
            d.rmdir()
        except OSError:  # not empty (something autofuse did not write), or absent
            pass


def clear_all(root: Any) -> tuple[int, int, int]:
    """Remove what autofuse wrote and nothing else: the plan entries (and the temporaries of
    killed writers), the call index's records, the bucket index, the readable kernel copies it
    wrote; a folder is removed only once empty. Returns (entries, call records, kernel files)
    removed."""
    plans, calls = plans_dir(root), cache_home(root) / CALLS_DIR
    buckets = cache_home(root) / BUCKETS_DIR
    kernels = settings().kernel_dir if root is None else cache_home(root) / "kernels"

    def children(d: Path) -> list[Path]:
        return sorted(d.iterdir()) if d.is_dir() else []

    entries = [p for p in children(plans) if _is_entry(p) or p.name.startswith(_TEMPS)]
    records = [p for p in children(calls) if _CALL_FILE.match(p.name)]
    index = [p for p in children(buckets) if _INDEX_FILE.match(p.name)]
    pyc = kernels / "__pycache__"
    sources = [p for p in children(kernels) + children(pyc) if _own_kernel_file(p)]
    temps = [p for p in entries if p.name.startswith(_TEMPS) and not p.is_symlink()]
    kept = [p for p in entries if p not in temps]
    n_entries = sum(not p.is_symlink() for p in kept)
    left = [f for p in kept for f in _remove_entry(p)]
    _remove(temps), _remove(records), _remove(index)
    n_kernels = _remove(sources)
    _rmdir_if_empty(plans, calls, buckets, pyc, kernels)
    _say_left(left)
    return n_entries, len(records), n_kernels


def cache_clear(root: Any, key: str | None) -> int:
    if key is not None:
        key = resolve_key(root, key)
        left = _remove_entry(plans_dir(root) / key)
        print(f"removed entry {key}" if left != [plans_dir(root) / key] else
              f"entry {key} is a symbolic link (autofuse writes none): left in place")  # fmt: skip
        _say_left(left)
        return 0
    n, calls, kernels = clear_all(root)
    print(f"removed {n} entries, {calls} call records and {kernels} kernel files "
          "(files autofuse did not write are left in place)")  # fmt: skip
    return 0


def run_keys(root: Any, folder: str) -> tuple[list[str], dict[str, str]]:
    """The cache keys of a run folder's winners (and their call keys), each checked to be in
    the cache; raises :class:`UnknownKey` naming what is missing."""
    recs = workload_records(Path(folder))
    if not recs:
        raise UnknownKey(f"no complete workload results in {folder} (an autofuse tune run folder)")
    keys, calls, missing = [], {}, []
    for rec in recs:
        key = rec.get("cache_key")
        if not isinstance(key, str) or not (plans_dir(root) / key).is_dir():
            missing.append(f"{rec['workload']} ({key or 'no cache key recorded'})")
            continue
        keys.append(key)
        if rec.get("call_key"):
            calls[str(rec["call_key"])] = key
    if missing:
        raise UnknownKey(f"the winners of {', '.join(missing)} are not in {plans_dir(root)} "
                         "(tuned with another --cache-dir, or cleared?)")  # fmt: skip
    return keys, calls


def cache_export(root: Any, args: argparse.Namespace) -> int:
    chosen = sum(map(bool, (args.target, args.all, args.run)))
    if not args.out or chosen != 1:
        raise SystemExit("autofuse cache export: give one of KEY, --all or --run DIR, "
                         "and -o FILE")  # fmt: skip
    calls: dict[str, str] = {}
    if args.run:
        keys, calls = run_keys(root, args.run)
    else:
        keys = None if args.all else [resolve_key(root, args.target)]
    m = export_bundle(args.out, keys, root, calls=calls)
    print(f"wrote {args.out}: {len(m['entries'])} entries, {len(m.get('calls', {}))} call records")
    return 0


def cache_command(args: argparse.Namespace) -> int:
    root = args.cache_dir
    try:
        if args.action == "list":
            return cache_list(root)
        if args.action == "show":
            if not args.target:
                raise SystemExit("autofuse cache show: give the KEY (autofuse cache list)")
            return cache_show(root, args.target)
        if args.action == "clear":
            return cache_clear(root, args.target)
        if args.action == "export":
            return cache_export(root, args)
        if not args.target:
            raise SystemExit("autofuse cache import: give the bundle file")
        t0 = time.perf_counter()
        for old, new in import_bundle(args.target, root, loose=args.loose):
            how = "" if old == new else f" (re-keyed from {old}: recompiled from source here)"
            print(f"installed {new}{how}")
        print(f"into {plans_dir(root)} in {time.perf_counter() - t0:.2f} s")
        return 0
    except (BundleError, UnknownKey) as e:
        print(f"autofuse cache {args.action}: {e}", file=sys.stderr)
        return 2
