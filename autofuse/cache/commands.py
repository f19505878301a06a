"""``autofuse cache list | show KEY | clear [KEY] | export KEY|--all -o FILE | import FILE``.

Every action works on the cache home (``AUTOFUSE_CACHE_DIR``, default a per-user folder) or
on ``--cache-dir``. ``list`` and ``show`` give each entry's input shapes, speedup (from the
tuning times it recorded: over the greedy plan, the unfused plan) and provenance (when, which
GPU, torch / triton / autofuse versions, imported from where).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
import warnings
from typing import Any

from autofuse.cache.calls import CALLS_DIR
from autofuse.cache.disk import _read_entry, list_entries, plans_dir
from autofuse.cache.keys import _check_key
from autofuse.plan.runtime import KernelStep
from autofuse.settings import cache_home, settings


def _shapes(plan: Any) -> str:
    g = plan.graph
    return ", ".join(f"{g[i].dtype}{list(g[i].shape)}" for i in g.inputs)


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
            plan, meta, _ = _read_entry(root, e.key)
        if plan is None:
            continue
        print(f"{e}\n    inputs: {_shapes(plan)}\n    speedup: {_speed_text(meta)}"
              f"\n    built: {_provenance(meta)}")  # fmt: skip
    return 0


def cache_show(root: Any, key: str) -> int:
    _check_key(key)
    plan, meta, problem = _read_entry(root, key)
    if plan is None:
        print(f"entry {key}: {problem or 'not in ' + str(plans_dir(root))}", file=sys.stderr)
        return 1
    g = plan.graph
    print(f"entry {key}  ({plans_dir(root) / key})")
    print(f"function: {meta.get('function') or '?'}")
    print(f"inputs:   {_shapes(plan)}")
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
        else:
            print(f"  eager  {g[step.node].op}: {step.reason}")
    return 0


def cache_clear(root: Any, key: str | None) -> int:
    if key is not None:
        _check_key(key)
        shutil.rmtree(plans_dir(root) / key)
        print(f"removed entry {key}")
        return 0
    n = len(list_entries(root))
    shutil.rmtree(plans_dir(root), ignore_errors=True)
    kernels = settings().kernel_dir if root is None else cache_home(root) / "kernels"
    shutil.rmtree(kernels, ignore_errors=True)
    shutil.rmtree(cache_home(root) / CALLS_DIR, ignore_errors=True)
    print(f"removed {n} entries, the call index and the kernel folder {kernels}")
    return 0


def cache_command(args: argparse.Namespace) -> int:
    from autofuse.cache.bundle import BundleError, export_bundle, import_bundle

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
            if not args.out or bool(args.target) == bool(args.all):
                raise SystemExit("autofuse cache export: give KEY or --all, and -o FILE")
            m = export_bundle(args.out, None if args.all else [args.target], root)
            print(f"wrote {args.out}: {len(m['entries'])} entries")
            return 0
        if not args.target:
            raise SystemExit("autofuse cache import: give the bundle file")
        t0 = time.perf_counter()
        for old, new in import_bundle(args.target, root, loose=args.loose):
            how = "" if old == new else f" (re-keyed from {old}: recompiled from source here)"
            print(f"installed {new}{how}")
        print(f"into {plans_dir(root)} in {time.perf_counter() - t0:.2f} s")
        return 0
    except BundleError as e:
        print(f"autofuse cache {args.action}: {e}", file=sys.stderr)
        return 2
