"""``autofuse tune SPEC``: tune a list of workloads overnight, resumably, on one or many GPUs.

SPEC is a Python file (``path/to/spec.py``) or a module path (``experiments.bench.suite_spec``) that
defines ``WORKLOADS``, a list of records. A record is a dict (or any object with these
attributes):

- ``name``: unique, letters, digits, ``_ . -`` (the JSON file's name);
- ``fn``: the function to tune, or ``module``: a zero-argument factory of the
  ``torch.nn.Module`` to tune (one of the two);
- ``inputs``: a factory of the example inputs (a tuple), called with the device (``"cuda"``, or
  ``"cpu"`` where kernels run in Triton's interpreter: keep CPU shapes tiny);
- optional ``trials`` / ``time_budget`` (seconds): override the command line's for this one;
- optional ``flops``: a number, or a function of the inputs, for the roofline floor (default 0,
  a memory-bound workload: the floor is then its minimum bytes at the copy bandwidth);
- optional ``sizes``: tune at each of these sizes (``inputs`` is then called with the device and
  the size), one workload ``<name>.<size>`` per size, each plan cached by shape bucket
  (``autofuse/cache/buckets.py``: ``autofuse.load`` runs it at every size of its bucket; two
  sizes of one bucket share the entry, the later tuned kept); ``dynamic``:
  ``{argument position: [dims]}`` that vary with the size (default: the dims whose sizes
  differ between the first two sizes). ``--sizes 64,128`` does the same for every workload.

Example::

    import torch

    def pointwise(x, w, b):
        return torch.sigmoid(x * w + b)

    WORKLOADS = [
        {"name": "pointwise", "fn": pointwise, "trials": 30,
         "inputs": lambda device: tuple(torch.randn(4096, 4096, device=device) for _ in range(3))},
    ]

Every workload's winner is stored in the cache home (``--cache-dir``; plans, kernel sources and
the call index, as ``optimize(trials=...)`` stores them), so ``autofuse.load`` finds it;
``autofuse cache export --run <run dir> -o plans.afz`` bundles a run's winners for another host.
A resumed run with more ``--trials`` than a workload was tuned with continues its study up to
the new count (and says so). Each run writes ``<out>/<date>_<gpu>/`` (``run.json``: provenance and ceilings; one
``<name>.json`` per workload, written atomically when it is complete; ``summary.csv``), with the
studies in one journal file there (``studies.journal``) unless ``--storage`` names another:
``optuna-dashboard <run dir>/studies.journal`` shows them. A killed run continues with
``--resume``: finished workloads are skipped, a partial study goes on from its storage.
``--workers N`` runs N processes (each pinned to one GPU with ``CUDA_VISIBLE_DEVICES``, one per
visible GPU by default; on a CPU N processes share each study, for testing): together they
spend each workload's trial budget once; the first writes the results.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from autofuse.files import ensure_writable
from autofuse.settings import cache_home
from autofuse.tune import results
from autofuse.tune.roofline import device_name, stamp
from autofuse.tune.runfiles import (
    RUN_FILE,
    STORAGE_FILE,
    at_sizes,
    is_complete,
    load_spec,
    read_json,
    run_dir,
    write_json,
)


def _visible_gpus() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis:
        return [v.strip() for v in vis.split(",") if v.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


def main(args: argparse.Namespace) -> int:
    """The ``autofuse tune`` command (see the module docstring)."""
    workloads = load_spec(args.spec)
    if getattr(args, "sizes", None):
        workloads = [x for w in workloads for x in at_sizes(w, args.sizes)]
    names = [w.name for w in workloads]
    if args.workloads:
        wanted = [w.strip() for w in args.workloads.split(",") if w.strip()]
        unknown = sorted(set(wanted) - {w.name for w in workloads} - {w.base for w in workloads})
        if unknown:
            raise SystemExit(f"autofuse tune: unknown workload(s) {unknown}; the spec has "
                             f"{[w.name for w in workloads]}")  # fmt: skip
        workloads = [w for w in workloads if w.name in wanted or w.base in wanted]
    if args.run_dir:  # a worker started by the coordinator below
        return results.worker(args, workloads, Path(args.run_dir), args.worker_index)
    ensure_writable(cache_home(args.cache_dir), "--cache-dir")
    folder = run_dir(args.out, args.resume, device_name(), names)
    ensure_writable(folder, "--out")
    _check_out(folder)
    doc = read_json(folder / RUN_FILE) or {"stamp": stamp(), "runs": []}
    doc["workloads"] = sorted(set(doc.get("workloads") or ()) | set(names))
    storage = args.storage or str(folder / STORAGE_FILE)
    doc["storage"] = storage if args.storage else STORAGE_FILE
    doc["runs"].append({"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "argv": sys.argv[1:], "resume": bool(args.resume)})  # fmt: skip
    write_json(folder / RUN_FILE, doc)
    print(f"autofuse tune: {len(workloads)} workloads -> {folder}", file=sys.stderr, flush=True)
    gpus = _visible_gpus()
    workers = args.workers or max(1, len(gpus))
    if workers == 1:
        code = results.worker(args, workloads, folder, 0, storage=storage)
    else:
        code = _spawn(args, workloads, folder, workers, gpus, storage)
    results.write_summary(folder)
    done = sum(is_complete(folder / f"{w.name}.json") for w in workloads)
    print(f"autofuse tune: {done}/{len(workloads)} workloads complete in {folder}; "
          f"report: python -m autofuse report {folder}", file=sys.stderr, flush=True)  # fmt: skip
    return code if done == len(workloads) else (code or 1)


def _check_out(folder: Path) -> None:
    """Never write results into the package's own folders."""
    pkg = Path(__file__).resolve().parents[1]
    here = folder.resolve()
    if here == pkg or pkg in here.parents:
        raise SystemExit(f"autofuse tune: --out {folder} is inside the package ({pkg})")


def _spawn(args, workloads, folder: Path, n: int, gpus: list[str], storage: str) -> int:
    """N worker processes, each pinned to one GPU where there are GPUs; the first writes the
    results. Shows the overall progress (workloads complete) while they run."""
    from tqdm import tqdm

    procs = []
    for i in range(n):
        env = dict(os.environ)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[i % len(gpus)]
        cmd = [sys.executable, "-m", "autofuse", "tune", args.spec, "--run-dir", str(folder),
               "--worker-index", str(i), "--storage", storage, "--trials", str(args.trials),
               "--polish", str(args.polish),
               *(["--cache-dir", str(args.cache_dir)] if args.cache_dir else []),
               *(["--time-budget", str(args.time_budget)] if args.time_budget else []),
               *(["--workloads", args.workloads] if args.workloads else []),
               *(["--sizes", ",".join(map(str, args.sizes))] if getattr(args, "sizes", ()) else []),
               *(["--no-progress"] if i or not args.progress else [])]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env))
    files = [folder / f"{w.name}.json" for w in workloads]
    with tqdm(total=len(files), desc="workloads", unit="workload", file=sys.stderr) as bar:
        try:
            while any(p.poll() is None for p in procs):
                bar.update(sum(map(is_complete, files)) - bar.n)
                time.sleep(1.0)
        except BaseException:
            for p in procs:
                p.kill()
            raise
        bar.update(sum(map(is_complete, files)) - bar.n)
    return max((p.returncode or 0) for p in procs)


def whole(least: int) -> Any:
    """An argparse type: a whole number of at least ``least`` (checked before any work)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least} (got {value})")
        return value

    return parse


def size_list(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated whole numbers of at least 1."""
    sizes = tuple(dict.fromkeys(whole(1)(t.strip()) for t in text.split(",") if t.strip()))
    if not sizes:
        raise argparse.ArgumentTypeError(f"{text!r} names no size")
    return sizes


def seconds(text: str) -> float:
    """An argparse type: a number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0 seconds (got {text})")
    return value


def add_parser(sub: Any) -> None:
    t = sub.add_parser("tune", help="tune the workloads of a SPEC file, resumably (overnight)")
    t.add_argument("spec", help="a Python file or module path defining WORKLOADS")
    t.add_argument("--trials", type=whole(1), default=50, help="trials per workload (default 50)")
    t.add_argument("--time-budget", type=seconds, default=None,
                   help="seconds of search per workload (default: no limit)")  # fmt: skip
    t.add_argument("--storage", default=None,
                   help=f"study storage URL (default: <run dir>/{STORAGE_FILE})")  # fmt: skip
    t.add_argument("--workers", type=whole(1), default=0,
                   help="worker processes (default: one per visible GPU, else 1)")  # fmt: skip
    t.add_argument("--out", default="autofuse-runs", help="results root (default ./autofuse-runs)")
    t.add_argument("--resume", nargs="?", const=True, default=False, metavar="RUN_DIR",
                   help="continue the newest run of this device in --out (or RUN_DIR)")  # fmt: skip
    t.add_argument("--workloads", default="", help="only these (comma-separated names)")
    t.add_argument("--sizes", type=size_list, default=(),
                   help="tune each workload at these sizes (comma-separated; its inputs "
                        "factory takes (device, size)), cached by shape bucket")  # fmt: skip
    t.add_argument("--polish", type=whole(0), default=16,
                   help="configs hill-climbed per kernel of the best plan (default 16)")  # fmt: skip
    t.add_argument("--cache-dir", default=None,
                   help="where the winners are cached (default: the cache home)")  # fmt: skip
    t.add_argument("--no-progress", dest="progress", action="store_false")
    t.add_argument("--run-dir", default="", help=argparse.SUPPRESS)
    t.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
