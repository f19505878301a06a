"""Where a step's time goes, by phase and by class of kernel: the breakdown the training-step
comparison needs (autofuse against torch.compile, one model, one run).

A step is a list of named phases (``forward``, ``backward``, ``optimizer``) run in order; each
runs inside a profiler range and ends with a device synchronization, so every kernel it launched
has finished inside its range (the breakdown's own cost: one synchronization per phase, not in
the timed benchmarks). Per phase it reports the wall time, the kernel time by class
(:data:`CLASSES`: GEMMs, attention, convolutions, generated fused loops, copies, other eager
kernels), the device's busy time (the union of its kernels' intervals) and the host gap (wall
time the device sat idle: launch overhead, Python, synchronizations).

    python -m experiments.bench.breakdown --models gpt2,bert --size realistic --out $OUT
    python -m experiments.bench.breakdown --models bert --size tiny --device cpu   # CPU: ATen ops

On a machine without CUDA the "kernels" are the CPU profiler's top-level ATen ops (generated
kernels run in Triton's interpreter there and are not seen): the tool runs, its figures say
nothing about a GPU. Writes ``$OUT/breakdown.json`` after every model and backend.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

CLASSES = ("gemm", "attention", "conv", "fused", "copy", "eager")
_RULES = (  # first match wins; names lower-cased
    ("attention", r"autofuse_att|fmha|flash|attention|sdpa|_mha"),
    ("conv", r"conv|fprop|dgrad|wgrad|implicit_gemm"),
    ("gemm", r"autofuse_mm|gemm|xmma|cutlass|cublas|wgmma|nvjet|"
             r"triton_tem_fused_(?:.*_)?(?:mm|bmm|addmm)|^aten::(?:mm|bmm|addmm|matmul|linear)$"),
    ("fused", r"^autofuse_|^triton_"),
    ("copy", r"copy|memcpy|memset|^aten::(?:cat|fill_|zero_|clone|contiguous)$"),
)  # fmt: skip


def classify(name: str) -> str:
    """The class of a kernel (or, on CPU, an ATen op) by its name."""
    low = name.lower()
    for cls, pattern in _RULES:
        if re.search(pattern, low):
            return cls
    return "eager"


def busy_us(intervals: Sequence[tuple[float, float]]) -> float:
    """The length of the union of ``[start, end)`` intervals (µs)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def summarize(phases: dict[str, float], kernels: list[tuple[str, str, float, float]], runs: int):
    """Per phase (``phases``: name -> wall µs summed over ``runs``; ``kernels``: (phase, name,
    start µs, end µs)): wall, kernel time by class, busy time and host gap, per step."""
    out: dict[str, Any] = {}
    for phase, wall in phases.items():
        mine = [(n, s, e) for p, n, s, e in kernels if p == phase]
        by_class = dict.fromkeys(CLASSES, 0.0)
        for n, s, e in mine:
            by_class[classify(n)] += (e - s) / runs
        busy = busy_us([(s, e) for _, s, e in mine]) / runs
        out[phase] = {"wall_us": wall / runs, "kernel_us": by_class, "busy_us": busy,
                      "host_gap_us": max(0.0, wall / runs - busy), "launches": len(mine) / runs,
                      "top": top_kernels(mine, runs)}  # fmt: skip
    return out


def top_kernels(kernels: Sequence[tuple[str, float, float]], runs: int, n: int = 12) -> list:
    """The ``n`` kernels (by name) taking the most time per step: [name, class, µs, count]."""
    total: dict[str, list[float]] = {}
    for name, s, e in kernels:
        t = total.setdefault(name, [0.0, 0.0])
        t[0] += (e - s) / runs
        t[1] += 1 / runs
    ranked = sorted(total.items(), key=lambda kv: -kv[1][0])[:n]
    return [[name[:120], classify(name), round(us, 1), round(c, 2)] for name, (us, c) in ranked]


def profile_phases(phases: Sequence[tuple[str, Callable[[], Any]]], runs: int = 3,
                   device: str = "cuda") -> dict:  # fmt: skip
    """Run the step (its ``phases`` in order) once to warm up, then ``runs`` times under the
    profiler; the breakdown of :func:`summarize`."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _, fn in phases:
        fn()
    sync()
    wall = {name: 0.0 for name, _ in phases}
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(runs):
            for name, fn in phases:
                with record_function(f"phase:{name}"):
                    t0 = time.perf_counter()
                    fn()
                    sync()
                    wall[name] += (time.perf_counter() - t0) * 1e6
    return summarize(wall, _kernels(prof.events(), cuda), runs)


def _kernels(events, cuda: bool) -> list[tuple[str, str, float, float]]:
    """(phase, name, start, end) of every device kernel (CPU: every ATen op directly inside a
    phase's range), each placed in the phase range that holds its start."""
    import torch

    ranges = [(e.time_range.start, e.time_range.end, e.name[6:]) for e in events
              if e.name.startswith("phase:")]  # fmt: skip
    out = []
    for e in events:
        if cuda:
            if e.device_type != torch.autograd.DeviceType.CUDA:
                continue
        elif not (e.cpu_parent is not None and e.cpu_parent.name.startswith("phase:")):
            continue
        start = e.time_range.start
        phase = next((p for s, t, p in ranges if s <= start <= t), None)
        if phase is not None:
            out.append((phase, e.name, start, e.time_range.end))
    return out


def training_phases(case, fn, optimizer=None) -> list[tuple[str, Callable[[], Any]]]:
    """A model case's training step (``experiments.bench.models``) through ``fn`` as phases: the
    forward and loss, the backward, and an optimizer step where one is given."""
    state: dict[str, Any] = {}

    def forward():
        case.model.zero_grad(set_to_none=True)
        state["loss"] = case.loss(case.forward(fn))

    phases = [("forward", forward), ("backward", lambda: state.pop("loss").backward())]
    if optimizer is not None:
        phases.append(("optimizer", optimizer.step))
    return phases


def backends(model, names: Sequence[str]) -> dict[str, Any]:
    """The callables compared: eager (the model), torch.compile default and max-autotune,
    autofuse's backend."""
    import torch

    made = {"eager": lambda m: m, "compile_default": torch.compile,
            "compile_max_autotune": lambda m: torch.compile(m, mode="max-autotune"),
            "autofuse": lambda m: torch.compile(m, backend="autofuse")}  # fmt: skip
    unknown = [n for n in names if n not in made]
    if unknown:
        raise ValueError(f"--backends: unknown {unknown}; expected {', '.join(made)}")
    return {n: made[n](model) for n in names}


def run_model(name: str, size: str, device: str, names: Sequence[str], runs: int) -> dict:
    import torch

    from experiments.bench.models import build

    case = build(name, size, device)
    opt = torch.optim.AdamW(case.model.parameters(), lr=1e-4, foreach=True)
    out = {}
    for backend, fn in backends(case.model, names).items():
        try:
            out[backend] = profile_phases(training_phases(case, fn, opt), runs, device)
        except Exception as e:  # noqa: BLE001 - one backend failing leaves the others' figures
            out[backend] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return out


def _header(device: str, size: str) -> dict[str, Any]:
    """The record's stamp: commit, GPU, torch, Triton, cuDNN, CUDA and the precision flags
    (the same in every arm: the process's)."""
    from experiments.bench.bench_models import stamp
    from experiments.kernelbench.gpu import library_versions, precision_flags

    return {**stamp(device), **library_versions(), "precision": precision_flags(),
            "device": device, "size": size, "models": {}}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="gpt2,llama_eager,llama_sdpa,bert,vit")
    p.add_argument("--size", default="realistic", choices=("tiny", "realistic"))
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--backends", default="eager,compile_default,autofuse")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out", default=".")
    a = p.parse_args(argv)
    if a.runs < 1:
        p.error(f"--runs must be at least 1, got {a.runs}")
    record = _header(a.device, a.size)
    path = Path(a.out) / "breakdown.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    import torch

    for model in a.models.split(","):
        # models share code objects (transformers' wrappers): a fresh recompile budget for
        # each, or the later models run eager in every compiled arm
        torch._dynamo.reset()
        record["models"][model] = run_model(model, a.size, a.device, a.backends.split(","), a.runs)
        path.write_text(json.dumps(record, indent=1))
        print(model, json.dumps(record["models"][model])[:400])
    return record


if __name__ == "__main__":
    main()
