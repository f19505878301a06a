"""Where a convolution problem's time goes: the GPU kernels of eager, torch.compile's default
mode and autofuse's greedy plan (and the greedy plan with every convolution forced
channels-last, alone: the planner's other plans, which it would time beside it and take where
faster, are not built; and with inference BatchNorm folded into the convolutions), each kernel's device
time per call from the profiler and the kernels launched per call.

    python -m experiments.probes.conv_profile KB --level 2 --problems 4,32,52 --out OUT.json
        [--phase as-made|eval]

KB is a KernelBench folder (as for ``experiments.kernelbench``). Per problem and arm the record
lists ``(kernel name, µs per call)`` sorted by time, and the total; with ``TORCH_LOGS=
output_code`` set, the compiled arm's generated code goes to stderr (which convolution it calls,
in which layout). Precision flags are left as they are, the same in every arm.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
from pathlib import Path
from typing import Any

from experiments.kernelbench.problems import (
    BY_STAGE,
    discover,
    instantiate,
    load_module,
    parse_numbers,
)

# each autofuse arm's settings (the others' left at their defaults)
AUTOFUSE_ARMS = {
    "autofuse greedy": {},
    "autofuse channels_last alone": {"AUTOFUSE_CONV_LAYOUT": "channels_last"},
    "autofuse folded": {"AUTOFUSE_BN_FOLD": "fold"},
    # rows walked by stride (kernels/common/row_order.py), the channels-last plan alone; the
    # split's chunks of a GroupNorm row cut across channel planes, so also unsplit
    "autofuse rows by stride, channels_last": {
        "AUTOFUSE_REDUCTION_ORDER": "stride",
        "AUTOFUSE_CONV_LAYOUT": "channels_last",
    },
    "autofuse rows by stride, channels_last, unsplit": {
        "AUTOFUSE_REDUCTION_ORDER": "stride",
        "AUTOFUSE_CONV_LAYOUT": "channels_last",
        "AUTOFUSE_SPLIT_REDUCTIONS": "0",
    },
}
ARMS = ("eager", "compile default", *AUTOFUSE_ARMS)
SETTINGS = ("AUTOFUSE_CONV_LAYOUT", "AUTOFUSE_BN_FOLD", "AUTOFUSE_REDUCTION_ORDER",
            "AUTOFUSE_SPLIT_REDUCTIONS")  # fmt: skip
ALONE = (  # arms whose plan is not timed against others
    "autofuse channels_last alone",
    "autofuse rows by stride, channels_last",
    "autofuse rows by stride, channels_last, unsplit",
)


def kernel_times(fn: Any, inputs: list, calls: int = 5) -> list[tuple[str, float]]:
    """(kernel name, µs per call) of ``fn(*inputs)``'s GPU kernels, the longest first (with
    ``launches``: the kernels per call, under the name ``"(launches)"`` at the end)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn(*inputs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(*inputs)
        torch.cuda.synchronize()
    total: collections.Counter = collections.Counter()
    launches = 0
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            total[ev.name[:140]] += ev.device_time_total / calls
            launches += 1
    return [(k, round(v, 2)) for k, v in total.most_common()] + [("(launches)", launches / calls)]


def build(arm: str, model: Any, inputs: list) -> Any:
    import torch

    import autofuse
    from autofuse.settings import reload_settings

    if arm == "eager":
        return model
    if arm == "compile default":
        return torch.compile(model)
    for name in SETTINGS:
        os.environ.pop(name, None)
    os.environ.update(AUTOFUSE_ARMS[arm])
    reload_settings()
    from autofuse.plan.planner import Planner

    alternatives = Planner.alternatives
    if arm in ALONE:
        Planner.alternatives = lambda self, base, label: []
    try:
        return autofuse.optimize(model, inputs)
    finally:
        Planner.alternatives = alternatives
        for name in SETTINGS:
            os.environ.pop(name, None)
        reload_settings()


def plan_facts(fn: Any) -> dict:
    """An autofuse arm's plan choice (the plans timed end to end and why one won) and each
    convolution's measured layout times (µs, contiguous and channels-last); {} for the others."""
    plan = getattr(fn, "plan", None)
    if plan is None:
        return {}
    choice = getattr(fn, "plan_choice", None)
    layouts = [
        {"node": n.name, "layout": n.attr("layout"), "layout_us": n.attr("layout_us")}
        for n in plan.graph.nodes
        if n.attr("layout")
    ]
    return {"choice": None if choice is None else choice.why, "layouts": layouts}


GENERATED = ("triton_", "autofuse_")  # Inductor's and autofuse's generated kernels' prefixes


def by_kind(kernels: list[tuple[str, float]]) -> dict[str, float]:
    """µs per call of every kernel (not only the longest the record lists), generated kernels
    and the rest (library calls, eager's own kernels, copies) apart."""
    gen = sum(t for k, t in kernels if k.startswith(GENERATED))
    rest = sum(t for k, t in kernels if not k.startswith(GENERATED))
    return {"generated": round(gen, 1), "other": round(rest, 1)}


def profile_problem(problem: Any, dtype: str, phase: str = "as-made") -> dict:
    import torch

    dt = getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[dtype])
    module, _ = load_module(problem, BY_STAGE["shipped"])
    model, inputs = instantiate(module, 0, dt, "cuda")  # the mode KernelBench runs it in
    if phase == "eval":
        model.eval()
    rec: dict = {"problem": problem.key, "phase": phase, "arms": {}}
    for arm in ARMS:
        torch._dynamo.reset()
        try:
            with torch.no_grad():
                fn = build(arm, model, inputs)
                kernels = kernel_times(fn, inputs)
            launches = kernels.pop()[1]
            rec["arms"][arm] = {"total_us": round(sum(t for _, t in kernels), 1),
                                "launches": launches, "kernels": kernels[:12],
                                "by_kind_us": by_kind(kernels), **plan_facts(fn)}  # fmt: skip
        except Exception as e:  # noqa: BLE001 - recorded; the other arms still run
            rec["arms"][arm] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m experiments.probes.conv_profile", description=__doc__
    )
    p.add_argument("dir", type=Path)
    p.add_argument("--level", type=int, default=2)
    p.add_argument("--problems", default="")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument(
        "--phase",
        choices=("as-made", "eval"),
        default="as-made",
        help="eval: the model in eval mode (BatchNorm on running statistics)",
    )
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    from autofuse.tune.roofline import stamp

    doc: dict = {"stamp": stamp(), "records": []}
    for problem in discover(a.dir, a.level, parse_numbers(a.problems)):
        doc["records"].append(profile_problem(problem, a.dtype, a.phase))
        a.out.write_text(json.dumps(doc, indent=1))
        r = doc["records"][-1]
        print(problem.key, {k: v.get("total_us", v.get("error")) for k, v in r["arms"].items()},
              flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
