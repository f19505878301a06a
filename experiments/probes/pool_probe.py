"""One pooling op alone on the GPU: eager, torch.compile default and autofuse's greedy plan
timed with ``do_bench`` (its L2 flush), and torch.compile's generated kernel printed, to compare
its indexing and launch config with autofuse's (``AUTOFUSE_LOGS=output_code``).

    python -m experiments.probes.pool_probe --shape 32,32,32,64,64 --kernel 2 --out OUT.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    import torch
    from torch._inductor.utils import run_and_get_code
    from triton.testing import do_bench

    import autofuse
    from autofuse.tune.roofline import stamp

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", default="32,32,32,64,64")
    p.add_argument("--kernel", type=int, default=2)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    shape = [int(s) for s in a.shape.split(",")]
    pool = {4: torch.nn.AvgPool2d, 5: torch.nn.AvgPool3d}[len(shape)](a.kernel)
    x = torch.rand(*shape, device="cuda")
    compiled = torch.compile(pool)
    _, codes = run_and_get_code(compiled, x)
    arms = {
        "eager": pool,
        "compile default": compiled,
        "autofuse greedy": autofuse.optimize(pool, [x]),
    }
    ref = pool(x)
    rec = {"stamp": stamp(), "shape": shape, "kernel": a.kernel, "arms": {}}
    for name, fn in arms.items():
        err = (fn(x) - ref).abs().max().item()
        rec["arms"][name] = {"us": do_bench(lambda fn=fn: fn(x)) * 1e3, "max_abs_err": err}
    rec["bytes"] = (x.numel() + ref.numel()) * 4
    rec["compile_code"] = [c for c in codes[0].split("\n") if "tl." in c or "def " in c
                           or "XBLOCK" in c or "num_warps" in c][:60]  # fmt: skip
    Path(a.out).write_text(json.dumps(rec, indent=2))
    print(json.dumps({k: v for k, v in rec.items() if k != "compile_code"}, indent=1))
    print("\n".join(rec["compile_code"]))


if __name__ == "__main__":
    main()
