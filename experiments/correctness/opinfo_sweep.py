"""PyTorch's OpInfo database through the autofuse backend, the way PyTorch tests Inductor.

Every op of ``torch.testing._internal.common_methods_invocations.op_db`` that runs on CPU,
with its sample inputs in the dtypes asked for (those the OpInfo supports on CPU), through
``torch.compile(..., backend="autofuse")``, forward and, where the op supports autograd,
backward, compared with eager (``experiments/correctness/opinfo_check.py``). Expected failures are listed
in ``experiments/correctness/opinfo_expected.py``.

    python -m experiments.correctness.opinfo_sweep --ops add,mul --dtypes float32,int --samples 2
    python -m experiments.correctness.opinfo_sweep --samples all --grad-dtypes all --check-bounds \
        --shard 0/4 --out results/opinfo/all0.json
    python -m experiments.correctness.opinfo_sweep --shard 0/4 --out results/opinfo/shard0.json
    python -m experiments.correctness.opinfo_sweep --merge results/opinfo/shard*.json --out results/opinfo/summary.json

``--dtypes`` takes dtype names or the classes ``lowp`` (bfloat16, else float16), ``int``
(int32, else int64, else the first integer dtype) and ``bool``. ``--samples all`` takes every
sample of each op and dtype; ``--grad-dtypes all`` runs the backward (gradients of the
backend's outputs against eager's) in every dtype picked that the op differentiates in.
``--check-bounds`` turns ``AUTOFUSE_CHECK_BOUNDS`` on: an access of a generated kernel outside
its buffers is a case of its own status, ``oob``. Each case's record is
appended to ``<out>.jsonl`` as it finishes; a killed shard started again skips the cases it
has. Statuses per case: pass (``how``: generated / eager_step / no_graph), xfail (an expected
failure), wrong (a silent mismatch), oob (out of bounds), error, timeout, skip (the sample
fails in eager too).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from autofuse.settings import reload_settings, settings
from experiments.correctness.opinfo_check import FAILING, Outcome, check_case
from experiments.correctness.opinfo_expected import EXPECTED, expected_failure

DEFAULT_DTYPES = ("float32", "lowp", "int", "bool")
MODES = ("fwd", "bwd")
STATUSES = ("pass", "xfail", "wrong", "oob", "error", "timeout", "skip")
# the float dtypes with a backward case (a backward in every dtype would double the sweep)
DEFAULT_GRAD_DTYPES = ("float32",)
# ops whose output is random (compared by structure, shape and dtype only)
RANDOM_NAME_PARTS = ("rand", "normal", "bernoulli", "dropout", "multinomial", "uniform")


def op_db() -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db as db

    return list(db)


def full_name(op: Any) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def select_ops(names: Sequence[str] | None, shard: tuple[int, int] = (0, 1)) -> list[Any]:
    """The OpInfos named (by full name, or by name for all its variants), in a fixed order,
    every ``n``-th from the ``i``-th for shard ``(i, n)``."""
    ops = sorted(op_db(), key=full_name)
    if names:
        wanted = set(names)
        known = {full_name(o) for o in ops} | {o.name for o in ops}
        unknown = sorted(wanted - known)
        if unknown:
            raise SystemExit(f"--ops: unknown op(s) {', '.join(unknown)}")
        ops = [o for o in ops if full_name(o) in wanted or o.name in wanted]
    i, n = shard
    return ops[i::n]


def pick_dtypes(op: Any, asked: Sequence[str]) -> list[torch.dtype]:
    """The dtypes of ``asked`` (names or classes) that ``op`` supports on CPU."""
    supported = op.supported_dtypes("cpu")
    out: list[torch.dtype] = []
    for name in asked:
        if name == "lowp":
            choice = [d for d in (torch.bfloat16, torch.float16) if d in supported][:1]
        elif name == "int":
            ints = sorted(
                (d for d in supported if not d.is_floating_point and not d.is_complex
                 and d is not torch.bool),
                key=str,
            )  # fmt: skip
            choice = [d for d in (torch.int32, torch.int64) if d in supported][:1] or ints[:1]
        else:
            dtype = getattr(torch, name, None)
            if not isinstance(dtype, torch.dtype):
                raise SystemExit(f"--dtypes: unknown dtype {name!r}")
            choice = [dtype] if dtype in supported else []
        out += [d for d in choice if d not in out]
    return out


def is_random(op: Any) -> bool:
    return bool(getattr(op, "has_nondeterministic_output", False)) or any(
        p in op.name for p in RANDOM_NAME_PARTS
    )


def cases(
    op: Any, dtypes: Sequence[str], modes: Sequence[str], grad_dtypes: Sequence[str]
) -> Iterator[tuple[torch.dtype, str]]:
    """(dtype, mode) pairs of ``op`` to run."""
    backward_ok = set(op.supported_backward_dtypes("cpu")) if op.supports_autograd else set()
    for dtype in pick_dtypes(op, dtypes):
        for mode in modes:
            in_grad = "all" in grad_dtypes or str(dtype)[6:] in grad_dtypes
            if mode == "bwd" and (dtype not in backward_ok or not in_grad):
                continue
            yield dtype, mode


def samples(op: Any, dtype: torch.dtype, mode: str, n: int | None) -> list[Any]:
    """The first ``n`` samples (None: all of them)."""
    torch.manual_seed(0)
    return list(itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=mode == "bwd"), n))


def run_op(op: Any, args: argparse.Namespace, done: set[tuple]) -> Iterator[dict]:
    """One record per case of ``op`` not in ``done``."""
    name = full_name(op)

    def fn(*a: Any, **k: Any) -> Any:
        return op.op(*a, **k)

    for dtype, mode in cases(op, args.dtypes, args.modes, args.grad_dtypes):
        dt = str(dtype)[6:]
        try:
            picked = samples(op, dtype, mode, args.samples)
        except Exception as e:  # noqa: BLE001 - the OpInfo cannot make samples here
            yield case_record(name, dt, mode, -1, Outcome("skip", detail=f"samples: {e}"[:200]))
            continue
        for k, s in enumerate(picked):
            if (name, dt, mode, k) in done:
                continue
            outcome = check_case(
                fn, (s.input, *s.args), dict(s.kwargs), mode == "bwd", is_random(op), args.timeout
            )
            yield case_record(name, dt, mode, k, outcome)


def case_record(op: str, dtype: str, mode: str, sample: int, outcome: Outcome) -> dict:
    rec = {"op": op, "dtype": dtype, "mode": mode, "sample": sample, **asdict(outcome)}
    rec["eager_ops"] = list(outcome.eager_ops)
    rec["seconds"] = round(outcome.seconds, 2)
    reason = expected_failure(op, dtype, mode)
    if reason and outcome.status in FAILING:
        rec["status"], rec["expected"] = "xfail", reason
    elif reason:
        rec["xpass"] = reason
    return rec


# ---------------------------------------------------------------------------------------------
# Summaries
# ---------------------------------------------------------------------------------------------


def op_class(recs: Sequence[dict]) -> str:
    """One op's class over its cases: wrong > oob > error > xfail > eager_step > generated."""
    st = {r["status"] for r in recs}
    how = {r.get("how") for r in recs if r["status"] == "pass"}
    if "wrong" in st:
        return "wrong"
    if "oob" in st:
        return "oob"
    if st & {"error", "timeout"}:
        return "error"
    if "xfail" in st:
        return "xfail"
    if how & {"eager_step", "no_graph"}:
        return "eager_step"
    return "generated" if how else "skipped"


def summarize(records: Sequence[dict]) -> dict:
    """Counts per case and per op, the ops by class, and every failing case."""
    by_op: dict[str, list[dict]] = collections.defaultdict(list)
    for r in records:
        by_op[r["op"]].append(r)
    classes = {op: op_class(rs) for op, rs in sorted(by_op.items())}
    cases_by = collections.Counter(r["status"] for r in records)
    how = collections.Counter(r.get("how") for r in records if r["status"] == "pass")
    eager_ops = collections.Counter(e for r in records for e in r.get("eager_ops", ()))
    failing = [
        {k: r[k] for k in ("op", "dtype", "mode", "sample", "status", "detail")}
        for r in records
        if r["status"] in FAILING
    ]
    return {
        "cases": {s: cases_by.get(s, 0) for s in STATUSES},
        "passing_cases_by_how": dict(how),
        "ops": dict(collections.Counter(classes.values())),
        "ops_total": len(classes),
        "op_classes": classes,
        "xfail_cases": sum(1 for r in records if r["status"] == "xfail"),
        "xpass": sorted({r["op"] for r in records if r.get("xpass")}),
        "eager_step_ops": dict(eager_ops.most_common()),
        "failing": failing,
        "expected_failures": EXPECTED,
    }


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _write(out: Path, config: dict, records: list[dict]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"config": config, "summary": summarize(records)}, indent=1))
    os.replace(tmp, out)


def _reclassed(rec: dict) -> dict:
    """A record judged by today's expected-failure list."""
    reason = expected_failure(rec["op"], rec["dtype"], rec["mode"])
    if reason and rec["status"] in FAILING:
        return {**rec, "status": "xfail", "expected": reason}
    return rec


def merge(paths: Sequence[str], out: Path) -> dict:
    """One summary of several shards' records (their ``.jsonl`` files)."""
    records: list[dict] = []
    for p in paths:
        records += _read_jsonl(Path(p).with_suffix(".jsonl"))
    latest = {(r["op"], r["dtype"], r["mode"], r["sample"]): r for r in records}
    records = [_reclassed(r) for r in latest.values()]  # a case run twice: the later run
    configs = [json.loads(Path(p).read_text()).get("config", {}) for p in paths if Path(p).exists()]
    summary = summarize(records)
    summary["ops_not_run"] = sorted({full_name(o) for o in op_db()} - set(summary["op_classes"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    config = {"merged": [Path(p).name for p in paths], "shards": configs}
    out.write_text(json.dumps({"config": config, "summary": summary}, indent=1))
    out.with_suffix(".md").write_text(markdown(summary, configs[0] if configs else {}))
    return summary


def markdown(s: dict, config: dict) -> str:
    """The summary as a short Markdown report."""
    lines = [
        "# OpInfo sweep through the autofuse backend (CPU, Triton interpreter)",
        "",
        f"Ops of `op_db` run: {s['ops_total']} (not run: {len(s.get('ops_not_run', ()))}); "
        f"dtypes {config.get('dtypes')}, {_samples_text(config.get('samples'))} per op and "
        f"dtype, backward in {config.get('grad_dtypes')}, {config.get('timeout')} s per case; "
        f"bounds checked: {'yes' if config.get('check_bounds') else 'no'}.",
        "",
        "| ops | count |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in sorted(s["ops"].items())),
        "",
        "| cases | count |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in s["cases"].items()),
        *(f"| pass: {k} | {v} |" for k, v in sorted(s["passing_cases_by_how"].items())),
        "",
        "Ops run as eager steps (cases): "
        + ", ".join(f"`{k}` {v}" for k, v in list(s["eager_step_ops"].items())[:40]),
        "",
        "## Failing cases (not listed as expected)",
        "",
        *(
            f"- {f['status']}: `{f['op']}` {f['dtype']} {f['mode']} #{f['sample']}: "
            f"{f['detail'][:160]}"
            for f in s["failing"]
        ),
        "",
        "## Expected failures",
        "",
        *(f"- `{k}`: {v}" for k, v in sorted(s["expected_failures"].items())),
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def parse_shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: expected i/n, e.g. 0/4") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: need 0 <= i < n")
    return i, n


def _count(text: str) -> int | None:
    if text == "all":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"--samples {text!r}: a positive count or 'all'")
    return n


def _samples_text(n: int | None) -> str:
    return "every sample" if n is None else f"first {n} sample(s)"


def _csv(text: str) -> list[str]:
    return [t for t in text.split(",") if t]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", type=_csv, default=None, help="comma-separated op names (default all)")
    p.add_argument("--dtypes", type=_csv, default=list(DEFAULT_DTYPES))
    p.add_argument("--modes", type=_csv, default=list(MODES))
    p.add_argument("--grad-dtypes", type=_csv, default=list(DEFAULT_GRAD_DTYPES))
    p.add_argument(
        "--samples", type=_count, default=2, help="first N samples per op and dtype, or all"
    )
    p.add_argument(
        "--shard", type=parse_shard, default=(0, 1), help="i/n: every n-th op from the i-th"
    )
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per case")
    p.add_argument(
        "--check-bounds", action="store_true", help="AUTOFUSE_CHECK_BOUNDS=1 for every case"
    )
    p.add_argument("--out", type=Path, default=Path("results/opinfo/sweep.json"))
    p.add_argument("--merge", nargs="+", default=None, help="shard JSON files to summarize")
    args = p.parse_args(argv)
    bad = sorted(set(args.modes) - set(MODES))
    if bad:
        p.error(f"--modes: unknown {', '.join(bad)} (fwd, bwd)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        s = merge(args.merge, args.out)
        print(json.dumps({k: s[k] for k in ("cases", "ops", "ops_total")}))
        return 0
    os.environ.setdefault("TRITON_INTERPRET", "1" if not torch.cuda.is_available() else "0")
    if args.check_bounds:
        os.environ["AUTOFUSE_CHECK_BOUNDS"] = "1"
        reload_settings()
    log = args.out.with_suffix(".jsonl")
    log.parent.mkdir(parents=True, exist_ok=True)
    records = _read_jsonl(log)
    done = {(r["op"], r["dtype"], r["mode"], r["sample"]) for r in records}
    config = {k: v for k, v in vars(args).items() if k not in ("out", "merge")}
    config["check_bounds"] = settings().check_bounds  # the flag or the environment
    t0 = time.time()
    for op in select_ops(args.ops, args.shard):
        for rec in run_op(op, args, done):
            records.append(rec)
            with open(log, "a") as f:
                f.write(json.dumps(rec) + "\n")
            if rec["status"] in FAILING:
                print(f"{rec['status']}: {rec['op']} {rec['dtype']} {rec['mode']}"
                      f" #{rec['sample']}: {rec['detail'][:160]}", flush=True)  # fmt: skip
        _write(args.out, {**config, "seconds": round(time.time() - t0)}, records)
    _write(args.out, {**config, "seconds": round(time.time() - t0)}, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
