"""Inductor's generated code beside autofuse's for the same model-style function, on a GPU.

    python -m experiments.kernel_code --out $OUT/kernel_code column_stats lm_cross_entropy

Writes ``<name>.inductor.txt`` (``TORCH_LOGS=output_code`` of torch.compile's default mode) and
``<name>.autofuse.txt`` (``AUTOFUSE_LOGS=output_code`` of autofuse's greedy plan, with each
kernel's config) per function: the material for closing a codegen gap kernel by kernel. Each
function runs in its own process so one log holds one function.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

_CHILD = """
import sys, torch
from experiments.model_functions import MODEL_FUNCTIONS
w = {w.name: w for w in MODEL_FUNCTIONS}[sys.argv[1]]
args = w.inputs(device="cuda", dtype=torch.bfloat16)
if sys.argv[2] == "inductor":
    torch.compile(w.fn)(*args)
else:
    import autofuse
    autofuse.optimize(w.fn, args)(*args)
torch.cuda.synchronize()
"""


def _dump(name: str, which: str, out: Path, timeout_s: float) -> str:
    env = dict(os.environ)
    env["TORCH_LOGS" if which == "inductor" else "AUTOFUSE_LOGS"] = "output_code"
    path = out / f"{name}.{which}.txt"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, name, which],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        path.write_text(proc.stdout + proc.stderr)
        return "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
    except subprocess.TimeoutExpired:
        return "timed out"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="+", help="model-style function names")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--timeout-s", type=float, default=90.0, help="per function and compiler")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    for name in a.names:
        for which in ("inductor", "autofuse"):
            print(f"{name} {which}: {_dump(name, which, a.out, a.timeout_s)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
