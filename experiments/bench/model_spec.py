"""The model-style functions (``experiments/bench/model_functions.py``, bf16 GPU shapes) as an
``autofuse tune`` SPEC: each tuned and compared with eager and both torch.compile modes.

    python -m autofuse tune experiments/bench/model_spec.py --trials 14 --time-budget 25 --out $OUT/runs
    python -m autofuse report $OUT/runs/<date>_<gpu>

Meant for a GPU: the shapes are far too large for the interpreter.
"""

from __future__ import annotations

import functools

import torch

from experiments.bench.model_functions import MODEL_FUNCTIONS


def _inputs(w, device: str) -> tuple:
    return w.inputs(device=device, dtype=torch.bfloat16)


WORKLOADS = [
    {"name": w.name, "fn": w.fn, "inputs": functools.partial(_inputs, w)} for w in MODEL_FUNCTIONS
]
