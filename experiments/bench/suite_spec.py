"""The public suite (``experiments/bench/workloads.py``, bf16 GPU shapes) as an ``autofuse tune`` SPEC.

    python -m autofuse tune experiments/bench/suite_spec.py --trials 14 --time-budget 25 --out $OUT/runs
    python -m autofuse report $OUT/runs/<date>_<gpu>

``--workloads a,b`` picks some (``MEMORY`` / ``COMPUTE`` below name the two halves). Meant for
a GPU: the shapes are far too large for the interpreter.
"""

from __future__ import annotations

import functools

import torch

from experiments.bench.workloads import SUITE

MEMORY = ",".join(w.name for w in SUITE if w.kind == "memory")
COMPUTE = ",".join(w.name for w in SUITE if w.kind == "compute")


def _inputs(w, device: str) -> tuple:
    return w.inputs(device=device, dtype=torch.bfloat16)


WORKLOADS = [
    {
        "name": w.name,
        "fn": w.fn,
        "inputs": functools.partial(_inputs, w),
        "flops": w.flops,
    }
    for w in SUITE
]
