"""The roofline floor of a workload and the provenance of a run (shared by ``autofuse tune``
and ``experiments/bench/suite.py``).

The floor is the time a workload cannot beat on this machine: its minimum bytes (each input
read once, each output written once) at the copy bandwidth, or its flops at the bf16 matmul
rate, whichever is longer. On a GPU both ceilings are measured (:func:`ceilings`); without one
they are the cost model's (:func:`modeled_ceilings`, labelled "modeled").
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any

from autofuse.measure import CostModel
from autofuse.version import __version__


def min_bytes(inputs: Any, outputs: Any) -> int:
    """Each input read once, each output written once."""
    import torch

    ts = [t for t in (*inputs, *outputs) if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in ts)


def seconds(fn, args, rep_ms: int = 200) -> float:
    """Median time of ``fn(*args)`` on the GPU (``triton.testing.do_bench``), in seconds."""
    from triton.testing import do_bench

    return do_bench(lambda: fn(*args), warmup=25, rep=rep_ms, return_mode="median") * 1e-3


def ceilings() -> dict:
    """The GPU's copy bandwidth (a 2 GiB bf16 copy) and bf16 matmul rate (8192^3), measured."""
    import torch

    n = 2**30  # 1 GiB of bf16 per buffer (2 GiB each)
    a = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    t_copy = seconds(lambda: b.copy_(a), ())
    copy_bw = 2 * a.numel() * a.element_size() / t_copy
    a = b = None  # noqa: F841 - free 4 GiB before the matmul
    m = 8192
    x = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    t_mm = seconds(torch.mm, (x, y))
    return {"copy_bytes_per_s": copy_bw, "bf16_mm_flops_per_s": 2 * m**3 / t_mm,
            "copy_s": t_copy, "mm_s": t_mm, "source": "measured"}  # fmt: skip


def modeled_ceilings() -> dict:
    """The cost model's bandwidth and tensor-core rate (no GPU: every figure is modeled)."""
    m = CostModel()
    return {"copy_bytes_per_s": m.bandwidth, "bf16_mm_flops_per_s": m.mma_rate,
            "source": "modeled"}  # fmt: skip


def floor_s(nbytes: float, flops: float, ceil: dict) -> float:
    return max(nbytes / ceil["copy_bytes_per_s"], flops / ceil["bf16_mm_flops_per_s"])


def git_commit(where: str | None = None) -> str:
    """HEAD of the checkout holding ``where`` (default the working directory), marked
    ``-dirty`` when tracked files differ from it (a copied working tree can carry an older
    .git: set AUTOFUSE_COMMIT there)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              timeout=30, cwd=where).stdout.strip()  # fmt: skip

    try:
        head = git("rev-parse", "--short", "HEAD")
        return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except Exception:  # noqa: BLE001 - no git, or not a checkout
        return "unknown"


def autofuse_commit() -> str:
    """autofuse's own commit: ``AUTOFUSE_COMMIT``, else the git of the package's folder (not
    of the working directory, which may be the user's project)."""
    return os.environ.get("AUTOFUSE_COMMIT") or git_commit(_package_dir())


def _package_dir() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def device_name() -> str:
    """The GPU's name, or ``cpu-model`` (the interpreter and the cost model)."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu-model"


def stamp() -> dict:
    """Provenance: commit (``AUTOFUSE_COMMIT`` or git), GPU, torch, triton, autofuse, date."""
    import torch
    import triton

    return {
        "commit": autofuse_commit(),
        "gpu": device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "autofuse": __version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
