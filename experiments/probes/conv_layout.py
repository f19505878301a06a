"""The library convolution alone in both memory formats, and the whole problem in eager in both,
for KernelBench problems at their own shapes (GPU): is the gap to torch.compile the layout?

For each problem, its first convolution module's input is caught with a forward hook; then, in
one interleaved run: that convolution on contiguous (NCHW / NCDHW) tensors and weights, the same
in channels-last (``channels_last`` / ``channels_last_3d``), and the whole model in eager in
both formats, and torch.compile's default mode on the contiguous model. Times are the median of
CUDA-event rounds; nothing here is modeled.

    python -m experiments.probes.conv_layout KERNELBENCH_DIR --level 2 --problems 1-5 \\
        --dtypes fp32,bf16 --out $OUT

writes ``$OUT/conv_layout.json`` after every problem (commit, GPU, torch, triton in it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from experiments.kernelbench.problems import (
    BY_STAGE,
    discover,
    instantiate,
    load_module,
    parse_numbers,
)

CONVS = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.ConvTranspose1d,
         torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d)  # fmt: skip
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def channels_last(x: Any) -> Any:
    """``x`` in the channels-last format of its rank (4-D or 5-D tensors; others as they are)."""
    if isinstance(x, torch.Tensor) and x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    if isinstance(x, torch.Tensor) and x.dim() == 5:
        return x.contiguous(memory_format=torch.channels_last_3d)
    return x


def first_conv(model: torch.nn.Module, inputs: list) -> tuple[torch.nn.Module, torch.Tensor]:
    """The model's first convolution module to run, and the input it receives."""
    seen: list[tuple[torch.nn.Module, torch.Tensor]] = []
    hooks = [
        m.register_forward_pre_hook(lambda mod, args: seen.append((mod, args[0])))
        for m in model.modules()
        if isinstance(m, CONVS)
    ]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in hooks:
            h.remove()
    if not seen:
        raise LookupError("the model has no convolution module")
    return seen[0][0], seen[0][1].detach()


def cuda_timer(fn: Callable[[], Any], reps: int = 20) -> float:
    """Seconds per call: CUDA events around ``reps`` calls after a warm-up."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def variants(model, inputs, conv, x, compile_fn=torch.compile) -> dict[str, Callable[[], Any]]:
    """The callables timed for one problem (all without autograd)."""
    import copy

    conv_cl = copy.deepcopy(conv).to(memory_format=torch.channels_last)
    model_cl = copy.deepcopy(model).to(memory_format=torch.channels_last)
    x_cl, inputs_cl = channels_last(x), [channels_last(a) for a in inputs]
    compiled = compile_fn(model)
    return {
        "conv_contiguous": lambda: conv(x),
        "conv_channels_last": lambda: conv_cl(x_cl),
        "eager_contiguous": lambda: model(*inputs),
        "eager_channels_last": lambda: model_cl(*inputs_cl),
        "compile_default": lambda: compiled(*inputs),
    }


def time_problem(problem, dtype: torch.dtype, rounds: int, timer=cuda_timer, device="cuda",
                 stage: str = "shipped", compile_fn=torch.compile) -> dict:  # fmt: skip
    """One problem's record: every variant's median and rounds, and the two layout ratios."""
    module, _ = load_module(problem, BY_STAGE[stage])
    # the mode the benchmark runs it in (training: batch norms use the batch's statistics)
    model, inputs = instantiate(module, seed=0, dtype=dtype, device=device)
    conv, x = first_conv(model, inputs)
    calls = variants(model, inputs, conv, x, compile_fn)
    times: dict[str, list[float]] = {k: [] for k in calls}
    with torch.no_grad():
        for _ in range(rounds):  # interleaved: drift hits every variant alike
            for k, fn in calls.items():
                times[k].append(timer(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "problem": problem.key, "dtype": str(dtype).replace("torch.", ""),
        "conv": type(conv).__name__, "conv_input_shape": list(x.shape),
        "median_s": med, "rounds_s": times,
        "conv_cl_speedup": med["conv_contiguous"] / med["conv_channels_last"],
        "eager_cl_speedup": med["eager_contiguous"] / med["eager_channels_last"],
    }  # fmt: skip


def provenance() -> dict:
    import triton

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"commit": os.environ.get("AUTOFUSE_COMMIT", "unknown"), "gpu": gpu,
            "torch": torch.__version__, "triton": triton.__version__}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", help="a KernelBench checkout (its KernelBench/levelN folders)")
    p.add_argument("--level", type=int, default=2)
    p.add_argument("--problems", default="1-5")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=".")
    a = p.parse_args(argv)
    bad = [d for d in a.dtypes.split(",") if d not in DTYPES]
    if bad:
        p.error(f"--dtypes: unknown {bad}; expected a list of {', '.join(DTYPES)}")
    out = Path(a.out) / "conv_layout.json"
    record: dict = {**provenance(), "problems": []}
    for problem in discover(a.root, a.level, parse_numbers(a.problems)):
        for d in a.dtypes.split(","):
            try:
                row = time_problem(problem, DTYPES[d], a.rounds)
            except Exception as e:  # noqa: BLE001 - a problem that fails is recorded, not fatal
                row = {"problem": problem.key, "dtype": d, "error": f"{type(e).__name__}: {e}"}
            record["problems"].append(row)
            out.write_text(json.dumps(record, indent=1))
            med = row.get("median_s", {})
            print(problem.key, d, {k: round(v * 1e6, 1) for k, v in med.items()} or row)


if __name__ == "__main__":
    main()
