"""Cold start from the plan cache against torch.compile with a warm cache (GPU).

For three workloads (memory-bound ``rmsnorm_residual``, GEMM ``gemm_bias_gelu``, and a Llama-
style decoder block: RMSNorm, causal attention, SwiGLU MLP, as one module), in one run:

1. a child process tunes each workload and caches the plan in a private cache home, then loads
   it once and calls it (which stores the kernels' compiled binaries in the entry);
2. a child process runs ``torch.compile`` on it once, filling a private Inductor / Triton cache;
3. ``--repeats`` NEW processes per side measure the time to the first correct call:
   autofuse: from ``import autofuse`` to the first call of ``autofuse.load(...)`` returning
   (synchronized), with a Triton cache that holds none of the plan's kernels (so only the
   entry's binaries can spare compiling them): ``--triton-cache host`` (default) copies one in
   which an unrelated kernel ran (Triton's own helpers compiled, as on any host that ran Triton
   before), ``empty`` starts from nothing, ``shared`` reuses step 1's; torch.compile: from
   ``torch.compile(fn)`` to its first call returning, with the warm Inductor and Triton cache
   of step 2 (``TORCHINDUCTOR_CACHE_DIR`` / ``TRITON_CACHE_DIR`` reused). Both sides create
   their inputs and the module before the clock starts; both are checked against eager;
4. one more new process profiles the first autofuse call (``first_call_profile``: cProfile's
   top functions, after a first cuBLAS matmul and a first SDPA call are timed apart): where
   the time goes, not a measurement of it.

    python -m experiments.bench.cold_start --out $OUT [--trials 8] [--repeats 3]

writes ``$OUT/cold_start.json`` (every repeat, medians, the autofuse breakdown: import, load,
first call, and how many launches used a stored binary).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

WORKLOADS = ("rmsnorm_residual", "gemm_bias_gelu", "decoder_block")


class DecoderBlock(torch.nn.Module):
    """A Llama-style block without external dependencies (explicit causal attention)."""

    def __init__(self, d: int = 1024, heads: int = 16, ff: int = 2816) -> None:
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = torch.nn.Parameter(torch.ones(d)), torch.nn.Parameter(torch.ones(d))
        self.qkv = torch.nn.Linear(d, 3 * d, bias=False)
        self.o = torch.nn.Linear(d, d, bias=False)
        self.gate = torch.nn.Linear(d, ff, bias=False)
        self.up = torch.nn.Linear(d, ff, bias=False)
        self.down = torch.nn.Linear(ff, d, bias=False)

    @staticmethod
    def _rms(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    def forward(self, x):
        b, s, d = x.shape
        h = self._rms(x, self.n1)
        q, k, v = self.qkv(h).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-1, -2)) * (d // self.heads) ** -0.5
        i = torch.arange(s, device=x.device)
        p = torch.softmax(scores.masked_fill(i[:, None] < i[None, :], float("-inf")), dim=-1)
        x = x + self.o((p @ v).transpose(1, 2).reshape(b, s, d))
        h = self._rms(x, self.n2)
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


class HFModel(torch.nn.Module):
    """A Hugging Face model of ``experiments.bench.models`` called on its token ids alone, returning
    the last hidden state (a module: ``load`` keys it by its class and parameters)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids).last_hidden_state


def make(name: str, device: str = "cuda"):
    """(fn, inputs) on CUDA, deterministic: the same in every process. ``hf_<model>``: a whole
    model of ``experiments.bench.models`` (``hf_bert``), realistic size on CUDA, tiny elsewhere."""
    if name.startswith("hf_"):
        from experiments.bench.models import build

        case = build(name[3:], "realistic" if device == "cuda" else "tiny", device, seed=0)
        return HFModel(case.model).eval(), (case.inputs["input_ids"],)
    if name == "decoder_block":
        torch.manual_seed(0)
        block = DecoderBlock().to("cuda", torch.bfloat16).eval()
        return block, (torch.randn(4, 512, 1024, device="cuda", dtype=torch.bfloat16),)
    from experiments.bench.workloads import BY_NAME

    w = BY_NAME[name]
    return w.fn, w.inputs("cuda", torch.bfloat16, seed=0)


def _close(got, want) -> bool:
    got, want = (
        (got if isinstance(got, tuple) else (got,)),
        (want if isinstance(want, tuple) else (want,)),
    )
    return all(
        torch.allclose(g.float(), w.float(), rtol=3e-2, atol=3e-2 * w.float().abs().max().item())
        for g, w in zip(got, want)
    )


# ---------------------------------------------------------------------------------------------
# Child processes
# ---------------------------------------------------------------------------------------------


def child_tune(name: str, trials: int, budget: float) -> dict:
    import autofuse

    fn, args = make(name)
    t0 = time.perf_counter()
    with torch.no_grad():
        autofuse.optimize(fn, args, trials=trials, time_budget=budget, progress=False)
        tuned = time.perf_counter() - t0
        fast = autofuse.load(fn, args, strict=True)  # the entry's plan: stores the binaries
        ok = _close(fast(*args), fn(*args))
    torch.cuda.synchronize()
    return {"tune_s": tuned, "correct": ok, "key": fast.cache_key}


def child_compile(name: str) -> dict:
    fn, args = make(name)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        compiled = torch.compile(fn)
        out = compiled(*args)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    with torch.no_grad():
        ok = _close(out, fn(*args))
    return {"first_call_s": first, "correct": ok}


def child_load(name: str) -> dict:
    fn, args = make(name)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    import autofuse  # noqa: I001 - the clock starts before the import on purpose

    t1 = time.perf_counter()
    with torch.no_grad():
        fast = autofuse.load(fn, args, strict=True)
        t2 = time.perf_counter()
        out = fast(*args)
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        ok = _close(out, fn(*args))
    from autofuse.plan import launcher

    return {"first_call_s": t3 - t0, "import_s": t1 - t0, "load_s": t2 - t1,
            "call_s": t3 - t2, "correct": ok, "launches": launcher.stats(),
            "tuner_imported": any(m.startswith("autofuse.tune") for m in sys.modules)}  # fmt: skip


def child_profile(name: str) -> dict:
    """Where a new process's first call goes (not a measurement of it: the profiler slows it):
    the first call from the cache under cProfile, its top functions by cumulative time, after
    the libraries' own first-use costs are paid apart (a cuBLAS matmul, an SDPA call) and
    timed."""
    import cProfile
    import pstats

    fn, args = make(name)
    x = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    torch.mm(x, x)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    q = x.view(1, 1, 64, 64)
    torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    import autofuse

    with torch.no_grad():
        fast = autofuse.load(fn, args, strict=True)
        prof = cProfile.Profile()
        t3 = time.perf_counter()
        prof.enable()
        fast(*args)
        torch.cuda.synchronize()
        prof.disable()
        t4 = time.perf_counter()
    stats = pstats.Stats(prof).sort_stats("cumulative")
    top = []
    for (file, line, func), (_cc, nc, _tt, ct, _callers) in list(stats.stats.items()):
        top.append((ct, f"{Path(file).name}:{line}({func})", nc))
    top.sort(reverse=True)
    return {"cublas_first_mm_s": t1 - t0, "sdpa_first_call_s": t2 - t1,
            "profiled_first_call_s": t4 - t3,
            "top": [{"cum_s": round(c, 4), "fn": f, "calls": n} for c, f, n in top[:30]]}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------


def _triton_cache(mode: str, work: Path, name: str, r: int, tune_env: dict) -> str:
    if mode == "shared":
        return tune_env["TRITON_CACHE_DIR"]
    path = work / name / f"triton-{mode}-{r}"
    if mode == "host":
        shutil.copytree(work / "triton-host", path, dirs_exist_ok=True)
    return str(path)


def child_prime() -> dict:
    """Run one unrelated Triton kernel: the cache then holds Triton's compiled helpers."""
    import triton
    import triton.language as tl

    @triton.jit
    def _add_one(x_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)

    x = torch.zeros(100, device="cuda")
    _add_one[(1,)](x, 100, BLOCK=128)
    torch.cuda.synchronize()
    return {"ok": bool((x == 1).all())}


def _run(role: str, name: str, env: dict, extra: list[str] | None = None) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "experiments.bench.cold_start",
        "--child",
        role,
        "--workload",
        name,
    ]
    r = subprocess.run(cmd + (extra or []), env=env, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        return {"error": r.stderr[-3000:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="results")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--time-budget", type=float, default=300.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--triton-cache",
        default="host",
        choices=("empty", "host", "shared"),
        help="the loading process's Triton cache: empty; host (a copy of one that "
        "ran an unrelated kernel: Triton's own compiled helpers, none of the plan's "
        "kernels; default); shared (the tuning process's)",
    )
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--workload", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        fns = {"tune": lambda: child_tune(a.workload, a.trials, a.time_budget),
               "compile": lambda: child_compile(a.workload), "load": lambda: child_load(a.workload),
               "profile": lambda: child_profile(a.workload), "prime": child_prime}  # fmt: skip
        print(json.dumps(fns[a.child]()))
        return
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = out / "cold_start_caches"
    base = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    base.pop("AUTOFUSE_KERNEL_DIR", None)
    report: dict = {"workloads": {}, "triton_cache": a.triton_cache}
    if a.triton_cache == "host":
        _run("prime", "-", {**base, "TRITON_CACHE_DIR": str(work / "triton-host")})
    try:
        from experiments.bench.suite import stamp

        report["stamp"] = stamp()
    except Exception as e:  # noqa: BLE001
        report["stamp"] = {"error": repr(e)}
    for name in a.workloads.split(","):
        home = work / name / "autofuse"
        tune_env = {**base, "AUTOFUSE_CACHE_DIR": str(home),
                    "TRITON_CACHE_DIR": str(work / name / "triton-autofuse")}  # fmt: skip
        ind_env = {**base, "TORCHINDUCTOR_CACHE_DIR": str(work / name / "inductor"),
                   "TRITON_CACHE_DIR": str(work / name / "triton-inductor")}  # fmt: skip
        row: dict = {"tune": _run("tune", name, tune_env, ["--trials", str(a.trials),
                     "--time-budget", str(a.time_budget)]),
                     "torch_compile_fill": _run("compile", name, ind_env)}  # fmt: skip
        loads, compiles = [], []
        for r in range(a.repeats):  # interleaved, each in a new process
            env = {**base, "AUTOFUSE_CACHE_DIR": str(home)}
            env["TRITON_CACHE_DIR"] = _triton_cache(a.triton_cache, work, name, r, tune_env)
            loads.append(_run("load", name, env))
            compiles.append(_run("compile", name, ind_env))
        row["autofuse_load"], row["torch_compile_warm"] = loads, compiles
        env = {**base, "AUTOFUSE_CACHE_DIR": str(home)}
        env["TRITON_CACHE_DIR"] = _triton_cache(a.triton_cache, work, name, a.repeats, tune_env)
        row["first_call_profile"] = _run("profile", name, env)
        for key, runs in (("autofuse_load", loads), ("torch_compile_warm", compiles)):
            ts = [x["first_call_s"] for x in runs if "first_call_s" in x]
            row[f"{key}_median_s"] = statistics.median(ts) if ts else None
        report["workloads"][name] = row
        print(f"{name:18s} autofuse load {row['autofuse_load_median_s']}  "
              f"torch.compile warm {row['torch_compile_warm_median_s']}", flush=True)  # fmt: skip
        (out / "cold_start.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
