"""One worker of ``autofuse tune``: tune each workload, time it beside eager and torch.compile,
write its JSON; and ``summary.csv`` over a run folder.

Times in the files a person reads are in µs; every time says where it comes from: "measured"
(the GPU, this run), "modeled" (the cost model, no GPU) or "not measured" (torch.compile on a
CPU: the interpreter is not timed against it).
"""

from __future__ import annotations

import csv
import io
import os
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any

from autofuse.cache.buckets import spec_for
from autofuse.capture import capture
from autofuse.files import RUN_FILE, read_json, workload_records
from autofuse.plan.planner import Planner
from autofuse.report import summarize
from autofuse.runner import OptimizedFunction
from autofuse.tune.entry import BucketStore, planning
from autofuse.tune.roofline import ceilings, floor_s, min_bytes, modeled_ceilings, seconds, stamp
from autofuse.tune.runfiles import Workload, write_json

MODES = ("default", "max-autotune-no-cudagraphs")
COMPILE = tuple(f"torch.compile {m}" for m in MODES)
VARIANTS = ("eager", *COMPILE, "autofuse greedy", "autofuse tuned")


def worker(args, workloads: list[Workload], folder: Path, index: int, storage: str | None = None):
    """Tune every workload whose JSON is not complete. Worker 0 writes the results; the others
    only run trials of the shared studies. Returns 0, or 1 where some workload failed. The
    overall bar is the coordinator's where it started workers."""
    from tqdm import tqdm

    storage = storage or args.storage
    leader = index == 0
    ceil = _ceilings(folder) if leader else None
    todo = [w for w in workloads if _to_tune(folder, w, args, leader)]
    code = 0
    bar = tqdm(total=len(workloads), initial=len(workloads) - len(todo), desc="workloads",
               unit="workload", file=sys.stderr, disable=not (leader and args.progress) or bool(args.run_dir))  # fmt: skip
    for w in todo:
        path = folder / f"{w.name}.json"
        if not _to_tune(folder, w, args, False):  # another worker's, meanwhile
            bar.update(1)
            continue
        try:
            rec = tune_workload(w, args, storage, ceil, leader)
        except Exception as e:  # noqa: BLE001 - one failing workload must not lose the others
            code = 1
            rec = {"workload": w.name, "complete": False, "error": f"{type(e).__name__}: {e}",
                   "traceback": traceback.format_exc()}  # fmt: skip
            print(f"autofuse tune: {w.name}: {rec['error']}", file=sys.stderr, flush=True)
        if leader and rec is not None:
            write_json(path, rec)
            write_summary(folder)
            tuned = rec.get("times_us", {}).get("autofuse tuned", {}).get("us")
            bar.set_postfix({"last": w.name, "tuned": f"{tuned:.4g}µs" if tuned else "-"})
        bar.update(1)
    bar.close()
    return code


def _to_tune(folder: Path, w: Workload, args, say: bool) -> bool:
    """Whether ``w`` needs tuning: no complete result yet, or one tuned with fewer trials than
    now asked (its study then continues up to the new count; ``say``: print so)."""
    doc = read_json(folder / f"{w.name}.json")
    if doc is None or doc.get("complete") is not True:
        return True
    asked = w.trials if w.trials is not None else args.trials
    before = doc.get("trials_asked", doc.get("trials"))
    if isinstance(before, int) and asked > before:
        if say:
            print(f"autofuse tune: {w.name}: tuned with {before} trials; continuing its study "
                  f"up to {asked}", file=sys.stderr, flush=True)  # fmt: skip
        return True
    if say and isinstance(before, int) and asked < before:
        print(f"autofuse tune: {w.name}: kept (already tuned with {before} trials, more than "
              f"the {asked} asked)", file=sys.stderr, flush=True)  # fmt: skip
    return False


def _ceilings(folder: Path) -> dict:
    """The run's ceilings (measured once per run on a GPU, kept in run.json for resumes)."""
    import torch

    doc = read_json(folder / RUN_FILE) or {}
    if "ceilings" not in doc:
        doc["ceilings"] = ceilings() if torch.cuda.is_available() else modeled_ceilings()
        write_json(folder / RUN_FILE, doc)
    return doc["ceilings"]


def own_code(fn, tag: str):
    """``fn`` with a code object of its own: dynamo keeps compiled code per code object, and
    each torch.compile mode must stay callable until the timing rounds."""
    if not isinstance(fn, types.FunctionType):
        return fn
    name = f"{fn.__name__}_{''.join(ch if ch.isalnum() else '_' for ch in tag)}"
    code = fn.__code__.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def flat_outputs(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def max_rel_err(out, ref) -> float:
    """Largest error relative to the reference's finite scale over all outputs; inf when the
    NaN positions differ (a NaN where the reference is finite is never a small error)."""
    import torch

    worst = 0.0
    for o, r in zip(flat_outputs(out), flat_outputs(ref)):
        o, r = o.double(), r.double()
        if not torch.equal(torch.isnan(o), torch.isnan(r)):
            return float("inf")
        finite = torch.isfinite(r)
        if not finite.any():
            continue
        scale = max(r[finite].abs().max().item(), 1e-30)
        worst = max(worst, (o[finite] - r[finite]).abs().max().item() / scale)
    return worst


def tune_workload(w: Workload, args, storage: str | None, ceil: dict | None, leader: bool):
    """Tune ``w`` (its study shared by every worker); the leader returns its record."""
    import torch

    from autofuse.tune.tuner import run_search, start_search

    cuda = torch.cuda.is_available()
    target = w.target()
    inputs = w.example("cuda" if cuda else "cpu")
    captured = capture(target, inputs)
    planner = Planner(captured.graph)
    flat = OptimizedFunction(captured, None, target).flat_inputs(inputs)
    trials = w.trials if w.trials is not None else args.trials
    budget = w.time_budget if w.time_budget is not None else args.time_budget
    opts = dict(storage=storage, study_name=f"overnight-{w.name}-{captured.graph.key[:12]}",
                example_flat=flat)  # fmt: skip
    if not leader:
        run = start_search(captured, inputs, planner.space, **opts)
        try:
            run_search(run, trials, budget, progress=False, wait_s=0.0)
        finally:
            run.close()
        return None
    t0 = time.perf_counter()
    # the winner stored in the cache home as ``optimize(trials=...)`` stores it (plan, kernel
    # sources; the call index, so ``autofuse.load`` finds it with no capture)
    store, searcher = planning(getattr(args, "cache_dir", None))
    if w.size is not None:  # one size of several: cached by its shape bucket
        store = bucket_store(w, target, captured, inputs, store.cache_dir)
    planned = planner.tuned(captured, inputs, store, searcher, retune=True, fn=target,
                            trials=trials, time_budget=budget, polish=args.polish,
                            progress=args.progress, desc=w.name, **opts)  # fmt: skip
    tuning_s = time.perf_counter() - t0
    result = planned.tuning
    tuned = OptimizedFunction(captured, result.plan, target, result)
    rec = _record(w, captured, planner, target, inputs, flat, result, tuned, tuning_s, ceil, opts)
    cached = {
        "cache_key": planned.entry,
        "call_key": planned.call,
        "cache_dir": str(store.cache_dir),
    }
    if w.size is not None:
        cached.update(size=w.size, bucket=store.spec.to_json())
    rec.update(cached, trials_asked=trials)
    return rec


def bucket_store(w: Workload, target: Any, captured: Any, inputs: tuple, cache_dir: Any) -> Any:
    """The cache by shape bucket for ``w`` (a workload of one of its spec's ``sizes``): its
    ``dynamic`` dims, or the dims whose sizes differ between its first two sizes."""
    dims = w.dynamic if w.dynamic is not None else _differing_dims(w)
    dims = {int(p): tuple(int(d) for d in ds) for p, ds in dims.items()}
    spec = spec_for(target, captured, inputs, dims, None)
    if spec is None:
        raise ValueError(f"{w.name}: the graph changes with the size ({dims}); it cannot be "
                         "cached by bucket: tune each size as a workload of its own")  # fmt: skip
    return BucketStore(cache_dir, spec)


def _differing_dims(w: Workload) -> dict[int, list[int]]:
    """{argument position: dims} where the inputs at ``w``'s first two sizes differ in size."""
    import torch

    if len(w.sizes) < 2:
        raise ValueError(f"{w.name}: one size: say which dims it sizes with 'dynamic'")
    try:  # shapes alone: no memory where the factory takes the meta device
        a, b = (w.inputs("meta", n) for n in w.sizes[:2])
    except Exception:  # noqa: BLE001 - a factory that needs real tensors
        a, b = (w.inputs("cpu", n) for n in w.sizes[:2])
    out = {}
    for pos, (x, y) in enumerate(zip(a, b)):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dim() == y.dim():
            dims = [d for d in range(x.dim()) if x.shape[d] != y.shape[d]]
            if dims:
                out[pos] = dims
    if not out:
        raise ValueError(f"{w.name}: the inputs at sizes {w.sizes[:2]} have the same shapes")
    return out


def _record(w, captured, planner, target, inputs, flat, result, tuned, tuning_s, ceil, opts):
    import torch

    import search

    with torch.no_grad():
        outputs = flat_outputs(target(*inputs))
    nbytes = min_bytes(flat, outputs)
    flops = float(w.flops(inputs) if callable(w.flops) else w.flops or 0.0)
    floor = floor_s(nbytes, flops, ceil)
    rec: dict[str, Any] = {"workload": w.name, "complete": True, **stamp()}
    if torch.cuda.is_available():
        greedy_plan = planner.greedy()
        greedy = OptimizedFunction(captured, greedy_plan, target)
        times, extra = _measure_gpu(w, target, inputs, greedy, tuned)
        rec.update(extra)
    else:
        why = "not measured: no GPU (Triton's interpreter is not timed against torch.compile)"
        times = {v: {"us": None, "source": why} for v in ("eager", *COMPILE)}
        times["autofuse greedy"] = _us(result.greedy_value, "modeled")
        times["autofuse unfused"] = _us(result.unfused_value, "modeled")
        times["autofuse tuned"] = _us(result.value, result.source)
    rows = summarize(result.plan, result.kernel_times).rows
    study = search.Study.open(opts["study_name"], storage=opts["storage"])
    tuned_us = times["autofuse tuned"]["us"]
    rec.update({
        "times_us": times,
        "tuned_source": times["autofuse tuned"]["source"],
        "min_bytes": nbytes,
        "flops": flops,
        "ceilings": ceil,
        "floor_us": floor * 1e6,
        "floor_source": ceil.get("source", "measured"),
        "fraction_of_floor": (floor * 1e6 / tuned_us) if tuned_us else None,
        "tuning_s": tuning_s,
        "trials": result.trials,
        "failed_trials": result.failed,
        "pruned_trials": result.pruned,
        # the best plans re-timed end to end before the pick (greedy kept unless beaten
        # beyond the noise): what decided the tuned plan
        "end_to_end_us": {k: v * 1e6 for k, v in result.end_to_end.items()},
        "study": study.name,
        "kernels": [{"kernel": r.name, "kind": r.kind, "ops": list(r.ops), "config": r.config,
                     "time_us": None if r.time_s is None else r.time_s * 1e6,
                     "source": r.time_source} for r in rows],
        "partition": [f"{r.name}: {' + '.join(r.ops)}" for r in rows],
        "history": [[t.number, t.value, t.state.value] for t in study.trials],
        "report": tuned.report(),
    })  # fmt: skip
    return rec


GRAPHED = "autofuse tuned, CUDA graph"


def _graphed(tuned: Any) -> Any:
    """The tuned plan's callable replaying it as one CUDA graph (``plan/graphs.py``), or None
    where its calls are not plain tensor calls (a module's, nested inputs)."""
    if not tuned.plain_call:
        return None
    return OptimizedFunction(tuned.captured, tuned.plan, None, tuned.tuning, cuda_graph=True)


def _us(seconds: float | None, source: str) -> dict:
    return {"us": None if seconds is None else seconds * 1e6, "source": source}


def _measure_gpu(w, target, inputs, greedy, tuned, n_rounds: int = 3):
    """Eager, both torch.compile modes, the greedy and the tuned plan, timed in interleaved
    rounds after every compile (min of rounds); compile times and errors vs eager."""
    import torch

    ref = target(*inputs)
    extra: dict[str, Any] = {"compile_s": {}, "max_rel_err_vs_eager": {}, "errors": {}}
    order = [("eager", target)]
    torch._dynamo.reset()
    for mode, label in zip(MODES, COMPILE):
        try:
            t0 = time.perf_counter()
            fn = target if isinstance(target, torch.nn.Module) else own_code(target, mode)
            c = torch.compile(fn, mode=None if mode == "default" else mode)
            extra["max_rel_err_vs_eager"][label] = max_rel_err(c(*inputs), ref)
            extra["compile_s"][label] = time.perf_counter() - t0
            order.append((label, c))
        except Exception as e:  # noqa: BLE001 - recorded; the other variants still run
            extra["errors"][label] = f"{type(e).__name__}: {e}"
    order += [("autofuse greedy", greedy), ("autofuse tuned", tuned)]
    extra["max_rel_err_vs_eager"]["autofuse tuned"] = max_rel_err(tuned(*inputs), ref)
    graphed = _graphed(tuned)
    if graphed is not None:  # the tuned plan replayed as one CUDA graph (a plain tensor call)
        try:
            extra["max_rel_err_vs_eager"][GRAPHED] = max_rel_err(graphed(*inputs), ref)
            order.append((GRAPHED, graphed))
        except Exception as e:  # noqa: BLE001 - recorded; the other variants still run
            extra["errors"][GRAPHED] = f"{type(e).__name__}: {e}"
    rounds: dict[str, list[float]] = {name: [] for name, _ in order}
    for r in range(n_rounds):  # the order alternates: no variant is always timed hottest
        for name, f in order if r % 2 == 0 else order[::-1]:
            rounds[name].append(seconds(f, inputs, rep_ms=100))
    times = {name: _us(min(ts), "measured") for name, ts in rounds.items()}
    for label in COMPILE:
        if label not in times:
            times[label] = {"us": None, "source": f"failed: {extra['errors'][label]}"}
    return times, extra


SUMMARY_COLUMNS = ("workload", "eager_us", "compile_default_us", "compile_max_autotune_us",
                   "greedy_us", "tuned_us", "tuned_source", "floor_us", "fraction_of_floor",
                   "speedup_vs_eager", "speedup_vs_best_compile", "speedup_vs_greedy",
                   "tuned_graph_us", "graph_speedup_vs_best_compile", "trials",
                   "tuning_s")  # fmt: skip


def summary_row(rec: dict) -> dict:
    t = rec.get("times_us", {})

    def us(key: str) -> float | None:
        return t.get(key, {}).get("us")

    tuned = us("autofuse tuned")
    compiles = [v for v in (us(c) for c in COMPILE) if v]
    measured_floor = rec.get("floor_source", "measured") == "measured"  # never a modeled one

    def ratio(base: float | None) -> float | None:
        return base / tuned if base and tuned else None

    return {
        "workload": rec["workload"], "eager_us": us("eager"), "compile_default_us": us(COMPILE[0]),
        "compile_max_autotune_us": us(COMPILE[1]), "greedy_us": us("autofuse greedy"),
        "tuned_us": tuned, "tuned_source": rec.get("tuned_source"),
        "floor_us": rec.get("floor_us") if measured_floor else None,
        "fraction_of_floor": rec.get("fraction_of_floor") if measured_floor else None,
        "speedup_vs_eager": ratio(us("eager")),
        "speedup_vs_best_compile": ratio(min(compiles) if compiles else None),
        "speedup_vs_greedy": ratio(us("autofuse greedy")),
        "tuned_graph_us": us(GRAPHED),
        "graph_speedup_vs_best_compile": (min(compiles) / us(GRAPHED)
                                          if compiles and us(GRAPHED) else None),
        "trials": rec.get("trials"), "tuning_s": rec.get("tuning_s"),
    }  # fmt: skip


def write_summary(folder: Path) -> Path:
    """``summary.csv``: one row per complete workload (written atomically)."""
    buf = io.StringIO()
    out = csv.DictWriter(buf, SUMMARY_COLUMNS)
    out.writeheader()
    for rec in workload_records(folder):
        row = summary_row(rec)
        out.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()})
    path = Path(folder) / "summary.csv"
    tmp = path.with_name(f".summary.csv.{os.getpid()}.tmp")
    tmp.write_text(buf.getvalue())
    os.replace(tmp, path)
    return path
