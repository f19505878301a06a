"""GPU benchmark of the real-model suite (``experiments/bench/models.py``): eager, ``torch.compile``
(default and ``max-autotune-no-cudagraphs``) and ``torch.compile(backend="autofuse")`` (greedy
plans, no tuning options), each model as an inference call and as a training step.

    python -m experiments.bench.bench_models --out results/ --size realistic \
        --models llama_sdpa,llama_eager,gpt2,bert,vit --modes inference,train \
        --tag models_<commit> --budget-s 480

Per (model, mode) case, in one process: every backend is compiled by its first call (wall time
recorded as ``compile_s``) and checked against eager (outputs; for a training step also the
loss and every parameter's gradient; a 16-bit model's gradients are judged by their distance
from a float32 copy's, at most twice eager's own distance or the dtype's tolerance), then all backends are timed in ``--rounds`` interleaved
rounds (``triton.testing.do_bench`` medians on CUDA; min and median of the rounds recorded).
Backends run in the order eager, autofuse, compile default, compile max-autotune: the three
quick ones are compiled and timed first (and the record written) before max-autotune's long
compile starts, and the rounds are then timed again with all four. For autofuse the record lists
every compiled graph's kernels and the ATen ops that ran as eager steps.

Robustness: one backend failing records its error and the others go on; ``<out>/<tag>.json`` is
rewritten after every backend and case, so a killed run keeps what it finished. No new case
starts when less of ``--budget-s`` is left than a case's quick part has taken on average, and
max-autotune (the slowest compile by far) starts only when ``--max-autotune-min-s`` is left
over and above that average times the cases still to run (``--no-reserve``: regardless of
them): every case gets eager / autofuse / default first, max-autotune what remains. An error that leaves the CUDA context unusable (illegal
address, device-side assert) ends the model: the process re-executes itself for the models
left, appending to the same JSON.

``--size tiny --device cpu`` runs the kernels in Triton's interpreter (for tests).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

from experiments.correctness.model_grads import float32_grads, grad_errors, grad_errors_vs_float32

BACKENDS = ("eager", "autofuse", "autofuse_cuda_graph", "compile_default", "compile_max_autotune")
# autofuse: the backend's defaults (an inference graph replayed as a CUDA graph where that timed
# faster, cuda_graph="auto"); autofuse_cuda_graph: cuda_graph=True (every inference graph
# replayed; inference cases only)
_COMPILE_MODE = {"compile_default": None, "compile_max_autotune": "max-autotune-no-cudagraphs"}
_SHORT = {"eager": "eager", "autofuse": "autofuse", "autofuse_cuda_graph": "autofuse+graphs",
          "compile_default": "default",
          "compile_max_autotune": "max-autotune"}  # fmt: skip
DEFAULT_BATCH = {"realistic": 4}  # ~2 ms inference / ~6 ms training step per model on an H200


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "results"))
    p.add_argument("--size", default="realistic", choices=("tiny", "realistic"))
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--models", default="llama_sdpa,llama_eager,gpt2,bert,vit")
    p.add_argument("--modes", default="inference,train")
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help="subset of " + ",".join(BACKENDS) + " (always run in that order)")  # fmt: skip
    p.add_argument("--skip-max-autotune", action="store_true")
    p.add_argument("--batch", type=int, default=None,
                   help="batch size (default: 4 for realistic, the size's own for tiny)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    p.add_argument("--rep-ms", type=float, default=None,
                   help="timing per backend per round (default 150 on CUDA, one call on CPU)")  # fmt: skip
    p.add_argument("--tag", default="models")
    p.add_argument("--dump-code", action="store_true",
                   help="append every autofuse graph's generated kernels to OUT/kernels_<tag>.py.txt")  # fmt: skip
    p.add_argument("--budget-s", type=float, default=480.0,
                   help="no new case starts after this many seconds")  # fmt: skip
    p.add_argument("--max-autotune-min-s", type=float, default=60.0,
                   help="skip max-autotune in a case when less budget than this is left")  # fmt: skip
    p.add_argument("--reserve", action=argparse.BooleanOptionalAction, default=True,
                   help="start max-autotune only with enough budget left for the quick "
                   "backends of every case still to run (default on)")  # fmt: skip
    p.add_argument("--append", action="store_true",
                   help="add the cases to an existing <out>/<tag>.json (used on re-exec)")  # fmt: skip
    a = p.parse_args(argv)
    a.models = [m for m in a.models.split(",") if m]
    a.modes = [m for m in a.modes.split(",") if m]
    wanted = {b for b in a.backends.split(",") if b}
    unknown = wanted - set(BACKENDS)
    if unknown:
        p.error(f"unknown backends {sorted(unknown)}: expected some of {', '.join(BACKENDS)}")
    if a.skip_max_autotune:
        wanted.discard("compile_max_autotune")
    a.backends = [b for b in BACKENDS if b in wanted]
    bad = set(a.modes) - {"inference", "train"}
    if bad:
        p.error(f"unknown modes {sorted(bad)}: expected inference,train")
    return a


def _argv_for(a: argparse.Namespace, models: list[str], budget_s: float) -> list[str]:
    """The command line that continues this run with ``models`` (re-exec after a CUDA error)."""
    argv = ["--out", str(a.out), "--size", a.size, "--device", a.device,
            "--models", ",".join(models), "--modes", ",".join(a.modes),
            "--backends", ",".join(a.backends), "--rounds", str(a.rounds),
            "--tag", a.tag, "--budget-s", f"{budget_s:.1f}",
            "--max-autotune-min-s", str(a.max_autotune_min_s), "--append",
            "--reserve" if a.reserve else "--no-reserve"]  # fmt: skip
    if a.batch is not None:
        argv += ["--batch", str(a.batch)]
    if a.rep_ms is not None:
        argv += ["--rep-ms", str(a.rep_ms)]
    if a.dump_code:
        argv += ["--dump-code"]
    return argv


# ---------------------------------------------------------------------------------------------
# Stamp, timing, correctness
# ---------------------------------------------------------------------------------------------


def stamp(device: str) -> dict:
    import torch
    import triton

    import autofuse
    from autofuse.tune.roofline import git_commit as _git_commit

    return {
        "commit": os.environ.get("AUTOFUSE_COMMIT") or _git_commit(),
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "autofuse": autofuse.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def time_once(fn, device: str, rep_ms: float) -> float:
    """Seconds per call of ``fn``: do_bench's median on CUDA, the median of calls filling
    ``rep_ms`` (at least one) on CPU."""
    if device == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=rep_ms, return_mode="median") * 1e-3
    ts: list[float] = []
    while not ts or sum(ts) * 1e3 < rep_ms:
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def cuda_usable(device: str) -> bool:
    """False when the CUDA context is poisoned (every later CUDA call would fail)."""
    if device != "cuda":
        return True
    import torch

    try:
        torch.cuda.synchronize()
        return torch.ones(1, device="cuda").add(1).item() == 2.0
    except Exception:  # noqa: BLE001 - whatever the driver says, the context is gone
        return False


def _err(e: BaseException) -> dict:
    tb = traceback.format_exc()
    return {"error": f"{type(e).__name__}: {str(e)[:2000]}", "traceback": tb[-6000:]}


# ---------------------------------------------------------------------------------------------
# One case
# ---------------------------------------------------------------------------------------------


def _train_call(case, fn) -> tuple[Any, Any, dict]:
    """One training step through ``fn``: (output, loss, {param: grad}), grads cleared after."""
    case.model.zero_grad(set_to_none=True)
    out = case.forward(fn)
    loss = case.loss(out)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in case.model.named_parameters()
             if p.grad is not None}  # fmt: skip
    case.model.zero_grad(set_to_none=True)
    return out.detach(), loss.detach(), grads


def _step(case, fn, mode: str):
    """The timed callable: a no-grad forward, or zero grads + forward + backward."""
    import torch

    if mode == "inference":

        def run():
            with torch.no_grad():
                case.forward(fn)

    else:

        def run():
            case.model.zero_grad(set_to_none=True)
            case.loss(case.forward(fn)).backward()

    return run


def _autofuse_graphs(new: list) -> list[dict]:
    out = []
    for g in new:
        ops, choice = g.fallback_ops(), g.plan_choice
        out.append({"kind": g.kind, "name": g.name, "kernels": len(g.plan.kernels),
                    "eager_steps": sum(ops.values()),
                    "eager_ops": {str(k).removeprefix("aten."): v for k, v in sorted(ops.items())},
                    "plan_choice": None if choice is None else {"chosen": choice.chosen,
                                                                "why": choice.why},
                    "graph_choice": None if g.graph_choice is None else g.graph_choice.why,
                    "buffers_reused": getattr(g.plan.__dict__.get("_program"), "reused", None)})  # fmt: skip
    return out


def _dump_code(graphs: list, path: Path, stem: str) -> None:
    """Every kernel of the graphs' plans, as generated (``--dump-code``), appended to one file
    for the whole run (each graph under a header naming the model, mode and graph)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for g in graphs:
            f.write(f"\n\n######## {stem} {g.kind} graph: {len(g.plan.kernels)} kernels\n")
            for k in g.plan.kernels:
                f.write(f"\n# {k.info.kind}: {k.config.label()}\n{k.source}\n")


def _time_rounds(recs: dict, steps: dict, a, device: str, rep_ms: float) -> int:
    """Interleaved rounds over ``steps`` (order reversed every other round); fills ``times_us``
    and returns the number of Dynamo graphs compiled meanwhile."""
    from torch._dynamo.utils import counters

    names = list(steps)
    rounds: dict[str, list[float]] = {n: [] for n in names}
    graphs_before = counters["stats"]["unique_graphs"]
    for r in range(a.rounds):
        for n in names if r % 2 == 0 else names[::-1]:
            if "timing_error" in recs[n]:
                continue
            try:
                rounds[n].append(time_once(steps[n], device, rep_ms) * 1e6)
            except Exception as e:  # noqa: BLE001 - recorded, the others go on
                recs[n]["timing_error"] = _err(e)["error"]
                if not cuda_usable(device):
                    raise
    for n, ts in rounds.items():
        if ts:
            recs[n]["times_us"] = {"min": min(ts), "median": statistics.median(ts), "rounds": ts}
    # Dynamo graphs compiled while timing: 0 expected (every backend keeps its cache entry)
    return counters["stats"]["unique_graphs"] - graphs_before


def _profile(recs: dict, steps: dict, device: str) -> None:
    """autofuse's and torch.compile default's kernels by device time, and their host time
    per step with the Python functions that take it (what holds a case back)."""
    if device != "cuda":
        return
    from experiments.probes.kernel_profile import host_times, kernel_times

    for n in ("autofuse", "compile_default"):
        if n in steps:
            for key, measure in (("kernel_profile", kernel_times), ("host_profile", host_times)):
                try:
                    recs[n][key] = measure(steps[n])
                except Exception as e:  # noqa: BLE001 - a profile is extra: the timings stand
                    recs[n][key] = _err(e)


def _summarize(rec: dict) -> None:
    b = rec["backends"]

    def t(name: str, key: str = "min") -> float | None:
        return b.get(name, {}).get("times_us", {}).get(key)

    af = b.get("autofuse", {})
    for key in ("min", "median"):
        suffix = "" if key == "min" else "_median"
        a_t, e_t = t("autofuse", key), t("eager", key)
        comp = [x for x in (t("compile_default", key), t("compile_max_autotune", key)) if x]
        if a_t and e_t:
            rec[f"speedup_autofuse_vs_eager{suffix}"] = e_t / a_t
        if a_t and comp:
            rec[f"speedup_autofuse_vs_best_compile{suffix}"] = min(comp) / a_t
    rec["autofuse_correct"] = af.get("correct")
    if "autofuse_cuda_graph" in b:
        rec["autofuse_cuda_graph_correct"] = b["autofuse_cuda_graph"].get("correct")
    cg, comp = (
        t("autofuse_cuda_graph"),
        [x for x in (t("compile_default"), t("compile_max_autotune")) if x],
    )
    if cg and comp:
        rec["speedup_autofuse_cuda_graph_vs_best_compile"] = min(comp) / cg


def run_case(rec: dict, case, mode: str, a, device: str, rep_ms: float, deadline: float,
             save, reserve_s: float = 0.0) -> None:  # fmt: skip
    """Fills ``rec`` (already in the saved document) with the case's results. Max-autotune
    starts only when ``max_autotune_min_s`` is left after ``reserve_s`` (kept for the quick
    backends of the cases still to run)."""
    import torch

    from autofuse.frontend import compiled_graphs
    from experiments.bench.models import max_rel_err, tolerance

    torch._dynamo.reset()
    tol = tolerance(case.dtype)
    rec.update({"size": case.size, "device": device,
                "batch": next(iter(case.inputs.values())).shape[0],
                "dtype": str(case.dtype).removeprefix("torch."), "tolerance": tol,
                "backends": {}})  # fmt: skip
    t_case = time.perf_counter()
    ref: Any = None
    fns: dict[str, Any] = {}
    steps: dict[str, Any] = {}

    def call(fn):
        if mode == "inference":
            return case.inference(fn), None, None
        return _train_call(case, fn)

    def first_call(name: str) -> None:
        nonlocal ref
        br: dict = {}
        rec["backends"][name] = br
        try:
            if name == "eager":
                fn = case.model
            elif name == "autofuse":
                fn = torch.compile(case.model, backend="autofuse")
            elif name == "autofuse_cuda_graph":
                fn = torch.compile(case.model, backend="autofuse", options={"cuda_graph": True})
            else:
                fn = torch.compile(case.model, mode=_COMPILE_MODE[name])
            before = {id(g) for g in compiled_graphs()}
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                _sync(device)
                t0 = time.perf_counter()
                out, loss, grads = call(fn)
                _sync(device)
                br["compile_s"] = time.perf_counter() - t0
            if name.startswith("autofuse"):
                new = [g for g in compiled_graphs() if id(g) not in before]
                br["graphs"] = _autofuse_graphs(new)
                if a.dump_code:
                    code = Path(a.out) / f"kernels_{a.tag}.py.txt"
                    _dump_code(new, code, f"{case.name}_{mode}_{name}")
                br["kernels"] = sum(g["kernels"] for g in br["graphs"])
                total: dict[str, int] = {}
                for g in br["graphs"]:
                    for op, n in g["eager_ops"].items():
                        total[op] = total.get(op, 0) + n
                br["eager_ops"] = dict(sorted(total.items()))
                msgs = sorted({f"{w.category.__name__}: {w.message}"[:300] for w in seen})
                br["warnings"] = msgs[:20]
            if name == "eager":
                truth = float32_grads(case) if mode == "train" else None
                ref = (out, loss, grads, truth)
            else:
                br["max_rel_err_out"] = max_rel_err(out, ref[0])
                ok = br["max_rel_err_out"] <= tol
                if mode == "train":
                    br["max_rel_err_loss"] = max_rel_err(loss, ref[1])
                    br.update(grad_errors(grads, ref[2], tol))
                    ok = ok and br["max_rel_err_loss"] <= tol and not br["grads_missing"]
                    if ref[3] is None:  # float32: against eager's gradients
                        ok = ok and not br["grads_over_tol"]
                    else:  # 16-bit: against the float32 truth, bounded by eager's own error
                        br.update(grad_errors_vs_float32(grads, ref[2], ref[3], tol))
                        ok = ok and not br["grads_vs_fp32_over_bound"]
                br["correct"] = bool(ok)
            del out, loss, grads
            print(f"  {case.name} {mode} {name}: first call {br['compile_s']:.1f} s"
                  + (f", correct={br['correct']}" if "correct" in br else ""), flush=True)  # fmt: skip
            step = _step(case, fn, mode)
            step()  # one more call after the compiling one: warm
            _sync(device)
            fns[name], steps[name] = fn, step
        except Exception as e:  # noqa: BLE001 - recorded, the other backends go on
            br.update(_err(e))
            if name == "autofuse":
                br["correct"] = False
            print(f"  {case.name} {mode} {name}: ERROR {br['error'][:300]}", flush=True)
            if not cuda_usable(device):
                raise
        finally:
            save()

    quick = [b for b in a.backends if b != "compile_max_autotune"]
    if mode == "train":  # CUDA graphs replay inference graphs only
        quick = [b for b in quick if b != "autofuse_cuda_graph"]
    if "eager" not in quick:
        quick.insert(0, "eager")  # the reference of the correctness checks
    for name in quick:
        first_call(name)
        if name == "eager" and "error" in rec["backends"]["eager"]:
            break  # nothing to compare with
    timed = [n for n in quick if n in steps and n in a.backends]
    rec["graphs_compiled_while_timing"] = _time_rounds(
        rec["backends"], {n: steps[n] for n in timed}, a, device, rep_ms
    )
    _profile(rec["backends"], steps, device)
    _summarize(rec)
    rec["quick_s"] = time.perf_counter() - t_case
    save()
    if "compile_max_autotune" in a.backends and "eager" in steps:
        left = deadline - time.monotonic()
        if left - reserve_s < a.max_autotune_min_s:
            rec["backends"]["compile_max_autotune"] = {
                "skipped": f"budget: {left:.0f} s left, {reserve_s:.0f} s of it kept for the "
                f"cases still to run, < {a.max_autotune_min_s:.0f} s"
            }
        else:
            first_call("compile_max_autotune")
            if "compile_max_autotune" in steps:
                timed = [n for n in a.backends if n in steps]
                for n in timed:
                    rec["backends"][n].pop("times_us", None)
                rec["graphs_compiled_while_timing"] += _time_rounds(
                    rec["backends"], {n: steps[n] for n in timed}, a, device, rep_ms
                )
        _summarize(rec)
    rec["case_s"] = time.perf_counter() - t_case
    fns.clear()
    steps.clear()


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def table(cases: list[dict]) -> str:
    cols = ["model", "mode", "eager us", "default us", "max-autotune us", "autofuse us",
            "af vs best compile", "af+graphs us", "vs best", "correct"]  # fmt: skip
    rows = [cols]

    def us(r: dict, name: str) -> str:
        br = r.get("backends", {}).get(name, {})
        if "times_us" in br:
            return f"{br['times_us']['min']:.1f}"
        if "error" in br or "timing_error" in br:
            return "ERROR"
        return "skipped" if "skipped" in br else "-"

    for r in cases:
        sp = r.get("speedup_autofuse_vs_best_compile")
        cg = r.get("speedup_autofuse_cuda_graph_vs_best_compile")
        corr = r.get("autofuse_correct")
        rows.append([r["model"], r["mode"], us(r, "eager"), us(r, "compile_default"),
                     us(r, "compile_max_autotune"), us(r, "autofuse"),
                     f"{sp:.2f}x" if sp else "-", us(r, "autofuse_cuda_graph"),
                     f"{cg:.2f}x" if cg else "-", "-" if corr is None else str(corr)])  # fmt: skip
    widths = [max(len(row[k]) for row in rows) for k in range(len(cols))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows)


def _estimate(quick: list[float], worst: bool = False) -> float:
    """Seconds of one more case's quick part, the mean (or the longest) so far (0 before the
    first)."""
    if not quick:
        return 0.0
    return max(quick) if worst else statistics.mean(quick)


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    if a.device is None:
        import torch

        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported
    import torch

    from experiments.bench.models import build

    start = time.monotonic()
    deadline = start + a.budget_s
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{a.tag}.json"
    rep_ms = a.rep_ms if a.rep_ms is not None else (150.0 if a.device == "cuda" else 0.0)
    batch = a.batch if a.batch is not None else DEFAULT_BATCH.get(a.size)
    quick: list[float] = []  # seconds of each case's eager/autofuse/default part
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 32)
    doc: dict
    if a.append and path.exists():
        doc = json.loads(path.read_text())
        doc["restarts"] = doc.get("restarts", 0) + 1
    else:
        doc = {"stamp": stamp(a.device), "cases": [], "not_run": []}
    doc["args"] = {k: v for k, v in vars(a).items() if k != "append"}

    def save() -> None:
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        os.replace(tmp, path)

    print(f"bench_models: {a.size} on {a.device}, models {a.models}, modes {a.modes}, "
          f"backends {a.backends}, budget {a.budget_s:.0f} s", flush=True)  # fmt: skip
    for k, name in enumerate(a.models):
        if deadline - time.monotonic() < _estimate(quick, worst=True):
            doc["not_run"] += [f"{m} {mode}: budget" for m in a.models[k:] for mode in a.modes]
            break
        try:
            case = build(name, a.size, a.device, batch=batch)
        except Exception as e:  # noqa: BLE001 - recorded, the next model goes on
            for mode in a.modes:
                doc["cases"].append({"model": name, "mode": mode, "backends": {}, **_err(e)})
            save()
            print(f"{name}: build ERROR {type(e).__name__}: {e}", flush=True)
            if cuda_usable(a.device):
                continue
            case = None
        poisoned = case is None
        for j, mode in enumerate(a.modes):
            if poisoned:
                break
            if deadline - time.monotonic() < _estimate(quick, worst=True):
                doc["not_run"] += [f"{name} {m}: budget" for m in a.modes[j:]]
                break
            later = (len(a.models) - k - 1) * len(a.modes) + len(a.modes) - j - 1
            reserve = _estimate(quick) * later if a.reserve else 0.0
            rec: dict = {"model": name, "mode": mode, "backends": {}}
            doc["cases"].append(rec)
            try:
                run_case(rec, case, mode, a, a.device, rep_ms, deadline, save, reserve)
            except Exception as e:  # noqa: BLE001 - a poisoned CUDA context (or a bug here)
                rec.update(_err(e))
                poisoned = not cuda_usable(a.device)
                if poisoned:
                    rec["cuda_context_lost"] = True
                    doc["not_run"] += [f"{name} {m}: CUDA context lost" for m in a.modes[j + 1 :]]
            if "quick_s" in rec:
                quick.append(rec["quick_s"])
            doc["elapsed_s"] = time.monotonic() - start
            save()
            _print_case(rec)
        del case
        gc.collect()
        if poisoned:
            rest = a.models[k + 1 :]
            left = deadline - time.monotonic()
            if rest and left > 0 and argv is None:
                save()
                print(f"CUDA context lost: re-executing for {rest} ({left:.0f} s left)", flush=True)
                sys.stdout.flush()
                cmd = [
                    sys.executable,
                    "-m",
                    "experiments.bench.bench_models",
                    *_argv_for(a, rest, left),
                ]
                os.execv(sys.executable, cmd)
            doc["not_run"] += [f"{m} {mode}: CUDA context lost" for m in rest for mode in a.modes]
            break
        if a.device == "cuda":
            torch.cuda.empty_cache()
    doc["elapsed_s"] = time.monotonic() - start
    save()
    print(f"\n{path} ({doc['elapsed_s']:.0f} s)\n" + table(doc["cases"]), flush=True)
    if doc["not_run"]:
        print("not run: " + "; ".join(doc["not_run"]), flush=True)
    return doc


def _print_case(rec: dict) -> None:
    parts = []
    for name, br in rec.get("backends", {}).items():
        s = _SHORT[name]
        if "times_us" in br:
            s += f" {br['times_us']['min']:.1f}us"
        if "compile_s" in br:
            s += f" (compile {br['compile_s']:.1f}s)"
        if "error" in br:
            s += " ERROR"
        if "skipped" in br:
            s += " skipped"
        parts.append(s)
    af = rec.get("backends", {}).get("autofuse", {})
    extra = f" kernels={af['kernels']} eager_ops={af.get('eager_ops')}" if "kernels" in af else ""
    err = f" ERROR {rec['error'][:200]}" if "error" in rec else ""
    print(f"{rec['model']:12s} {rec['mode']:9s} " + ", ".join(parts)
          + f" correct={rec.get('autofuse_correct')}{extra}{err}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
