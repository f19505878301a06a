"""Inductor's generated code beside autofuse's for the same model-style function, on a GPU.

    python -m experiments.probes.kernel_code --out $OUT/kernel_code column_stats lm_cross_entropy

Writes ``<name>.inductor.txt`` (``TORCH_LOGS=output_code`` of torch.compile in ``--mode``, then
the launch config each Inductor kernel settled on after its own autotuning) and
``<name>.autofuse.txt`` (``AUTOFUSE_LOGS=output_code`` of autofuse's greedy plan, with each
kernel's config) per function: the material for closing a codegen gap kernel by kernel. Each
function runs in its own process so one log holds one function. Names are the model-style
functions' and the public suite's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

_CHILD = """
import sys, torch
from experiments.bench.model_functions import MODEL_FUNCTIONS
from experiments.bench.workloads import BY_NAME
w = {**BY_NAME, **{w.name: w for w in MODEL_FUNCTIONS}}[sys.argv[1]]
args = w.inputs(device="cuda", dtype=torch.bfloat16)
if sys.argv[2] == "inductor":
    for _ in range(3):
        torch.compile(w.fn, mode=sys.argv[3])(*args)
    torch.cuda.synchronize()
    from experiments.probes.kernel_code import inductor_configs
    print(inductor_configs())
else:
    import autofuse
    autofuse.optimize(w.fn, args)(*args)
torch.cuda.synchronize()
"""


def inductor_configs() -> str:
    """Each loaded Inductor kernel's name and the config(s) its autotuner kept (one after
    autotuning), with the registers and spills of the compiled binary where known."""
    from torch._inductor.codecache import PyCodeCache

    lines = ["===== inductor launch configs ====="]
    mods = list(PyCodeCache.modules) + list(PyCodeCache.modules_no_attr.values())
    for mod in mods:
        for name, obj in vars(mod).items():
            launchers = getattr(obj, "launchers", None)
            if not name.startswith("triton_") or not launchers:
                continue
            for lz in launchers:
                regs, spills = getattr(lz, "n_regs", "?"), getattr(lz, "n_spills", "?")
                lines.append(f"{name}: {lz.config} regs={regs} spills={spills}")
    return "\n".join(lines)


def _dump(name: str, which: str, out: Path, timeout_s: float, mode: str) -> str:
    env = dict(os.environ)
    env["TORCH_LOGS" if which == "inductor" else "AUTOFUSE_LOGS"] = "output_code"
    path = out / f"{name}.{which}.txt"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, name, which, mode],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        path.write_text(proc.stdout + proc.stderr)
        return "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
    except subprocess.TimeoutExpired as e:  # keep what it printed before the bound
        parts = [b.decode() if isinstance(b, bytes) else b for b in (e.stdout, e.stderr) if b]
        path.write_text("".join(parts))
        return "timed out"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="+", help="model-style function or public suite names")
    p.add_argument("--mode", default="default", help="torch.compile mode for Inductor's code")
    p.add_argument("--which", default="inductor,autofuse", help="whose code: inductor,autofuse")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--timeout-s", type=float, default=90.0, help="per function and compiler")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    for name in a.names:
        for which in a.which.split(","):
            if which not in ("inductor", "autofuse"):
                p.error(f"--which: unknown compiler {which!r} (inductor, autofuse)")
            print(f"{name} {which}: {_dump(name, which, a.out, a.timeout_s, a.mode)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
