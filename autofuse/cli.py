"""Command line: ``autofuse demo`` (two small examples), ``autofuse cache list | show
| clear | export | import`` (autofuse/cache/commands.py), ``autofuse tune SPEC`` (overnight
tuning of a list of workloads) and ``autofuse report DIR``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import autofuse
from autofuse.cache.commands import cache_command
from autofuse.files import FolderNotWritable
from autofuse.interpreter import note_given
from autofuse.tune import overnight, runreport
from autofuse.tune.overnight import add_parser, whole
from autofuse.tune.roofline import autofuse_commit
from autofuse.tune.runfiles import UsageError

DESCRIPTION = (
    "autofuse: profiler-driven fusion tuning for PyTorch. Commands: demo (two small examples "
    "explained and optimized), tune SPEC (tune a list of workloads, resumably), report RUN_DIR "
    "(report.md and report.html of a run), cache list | show | clear | export | import (the "
    "cached plans)."
)


def _ensure_backend() -> str:
    """Use the GPU when there is one, else Triton's interpreter on CPU tensors."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    os.environ.setdefault("TRITON_INTERPRET", "1")
    note_given()  # each command says where its kernels run
    return "cpu"


def demo(args: argparse.Namespace) -> int:
    device = _ensure_backend()
    os.environ.setdefault("AUTOFUSE_LOGS", "output_code")
    import torch

    def pointwise_example(x, w, b):
        tmp = x * w
        tmp = tmp + b
        tmp = tmp.sigmoid()
        return tmp

    def reduction_example(x):
        tmp = x * 2.0
        result = tmp.sum(dim=-1)
        result = result + 1.0
        return result

    n = 1024 if device == "cuda" else 64
    x, w, b = (torch.randn(n, n, device=device) for _ in range(3))
    print(f"== device: {device}" + (" (Triton interpreter)" if device == "cpu" else ""))
    for fn, inputs in ((pointwise_example, (x, w, b)), (reduction_example, (x,))):
        print(f"\n== autofuse.explain({fn.__name__})")
        print(autofuse.explain(fn, inputs))
        print(f"\n== autofuse.optimize({fn.__name__})")
        opt = autofuse.optimize(fn, inputs, trials=args.trials, cache_dir=args.cache_dir)
        err = (opt(*inputs) - fn(*inputs)).abs().max().item()
        print(opt.report())
        print(f"max |autofuse - eager| = {err:.3g}")
    return 0


def cache_cmd(args: argparse.Namespace) -> int:
    return cache_command(args)


def tune(args: argparse.Namespace) -> int:
    if _ensure_backend() == "cpu" and not args.run_dir:
        print("autofuse tune: no GPU: kernels run in Triton's interpreter, times are modeled "
              "by the cost model", file=sys.stderr, flush=True)  # fmt: skip
    return overnight.main(args)


def report(args: argparse.Namespace) -> int:
    return runreport.main(args)


class _Version(argparse.Action):
    """``--version``, computed only when asked (it runs git)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        print(version_text())
        parser.exit()


def version_text() -> str:
    """``autofuse <version> (commit <sha>)``: the commit of autofuse's own folder."""
    return f"autofuse {autofuse.__version__} (commit {autofuse_commit()})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="autofuse", description=DESCRIPTION)
    p.add_argument("--version", action=_Version, nargs=0, help="print the version and exit")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser(
        "demo", help="explain and optimize two small examples (pointwise, reduction)"
    )
    d.add_argument(
        "--trials", type=whole(0), default=10, help="search trials (0: greedy plan only)"
    )
    d.add_argument("--cache-dir", default=None, help="default: the cache home")
    d.set_defaults(func=demo)
    c = sub.add_parser("cache", help="list, show, clear, export or import cached plans")
    c.add_argument("action", choices=["list", "show", "clear", "export", "import"])
    c.add_argument("target", nargs="?",
                   help="KEY or a key prefix (show, clear, export), or a bundle (import)")  # fmt: skip
    c.add_argument("--all", action="store_true", help="export: every entry")
    c.add_argument("--run", help="export: the winners of an autofuse tune run folder")
    c.add_argument("-o", "--out", help="export: the bundle file to write (e.g. plans.afz)")
    c.add_argument("--loose", action="store_true", help="import: accept entries built for "
                   "another device or versions (their kernels are recompiled here)")  # fmt: skip
    c.add_argument("--cache-dir", default=None, help="default: the cache home")
    c.set_defaults(func=cache_cmd)
    add_parser(sub)
    sub.choices["tune"].set_defaults(func=tune)
    r = sub.add_parser("report", help="report.md and report.html for an autofuse tune folder")
    r.add_argument("dir", help="a run folder written by autofuse tune")
    r.set_defaults(func=report)
    args = p.parse_args(argv)

    try:
        return args.func(args)
    except (FolderNotWritable, UsageError) as e:  # the user's to fix: the message, no traceback
        msg = str(e)
        print(msg if msg.startswith("autofuse") else f"autofuse {args.cmd}: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
