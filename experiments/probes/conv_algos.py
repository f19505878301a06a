"""How much cuDNN's algorithm search (``torch.backends.cudnn.benchmark``) changes a
convolution's time, per memory format: the heuristic's pick against the fastest measured one.

    python -m experiments.probes.conv_algos --out OUT.json

Each case is a KernelBench level 2 problem's first convolution at its own shape (fp32, TF32 as
torch's defaults: on for cuDNN); µs, median of 20 after warm-up, CUDA events.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CASES = {  # name: (input shape, out channels, kernel, transposed)
    "L2_82": ((128, 8, 256, 256), 64, 3, False),
    "L2_92": ((128, 8, 128, 128), 64, 3, False),
    "L2_52": ((64, 64, 128, 128), 128, 3, False),
    "L2_4": ((128, 8, 256, 256), 64, 3, False),
}


def _time(fn, reps: int = 20) -> float:
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return round(sorted(times)[reps // 2], 1)


def case(shape, cout, k) -> dict:
    import torch
    import torch.nn.functional as F

    x = torch.randn(shape, device="cuda")
    w = torch.randn(cout, shape[1], k, k, device="cuda")
    out = {}
    for fmt in ("contiguous", "channels_last"):
        mf = torch.contiguous_format if fmt == "contiguous" else torch.channels_last
        xs, ws = x.contiguous(memory_format=mf), w.contiguous(memory_format=mf)
        for bench in (False, True):
            with torch.backends.cudnn.flags(enabled=True, benchmark=bench, deterministic=False,
                                            allow_tf32=True):  # fmt: skip
                out[f"{fmt} benchmark={bench}"] = _time(lambda xs=xs, ws=ws: F.conv2d(xs, ws))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.probes.conv_algos", description=__doc__)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    from autofuse.tune.roofline import stamp

    doc = {"stamp": stamp(), "cases": {}}
    for name, (shape, cout, k, _) in CASES.items():
        doc["cases"][name] = case(shape, cout, k)
        print(name, doc["cases"][name], flush=True)
        a.out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
