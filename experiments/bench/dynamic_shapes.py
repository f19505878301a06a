"""Dynamic shapes through ``torch.compile(fn, backend="autofuse", dynamic=True)``: what a new
shape costs, on CPU (Triton's interpreter) or a GPU.

    python -m experiments.bench.dynamic_shapes --out results/ --tag dynamic_shapes_<commit>
    python -m experiments.bench.dynamic_shapes --quick          # 6 lengths x 2 batches, 4 lengths

Cases: ``function``: ``layer_norm(softmax(x))`` on x of (batch, length, 32), every length of
``--lengths`` at every batch of ``--batches``; ``llama``: a tiny Llama-style model (one decoder
layer: attention and MLP, random weights) at batch 2 over ``--llama-lengths``.

Per case: the shapes run and how many disagree with eager; the AOTAutograd traces, partitions
made (``backend.counts["plans"]``), shapes built from a known partition (``bucket_instances``)
and kernels built (the loader's count), in all and at the new shapes of a known bucket; and
per shape its first call (the compile of that shape, process CPU seconds, which other processes
on the host barely move) against its steady call (the median of ``--reps`` more calls).
``new_shape_over_steady``: the median, over the shapes whose bucket (power-of-two range of
every size) an earlier shape opened, of first call / steady call. JSON to ``<out>/<tag>.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

LENGTHS = (3, 5, 6, 7, 9, 11, 12, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31, 33, 37, 41, 45, 49,
           53, 57, 61)  # fmt: skip
BATCHES = (1, 2, 3, 5)
LLAMA_LENGTHS = (5, 6, 7, 9, 10, 11, 12, 13, 14, 15)


def softmax_norm(x: Any, w: Any, b: Any) -> Any:
    import torch
    import torch.nn.functional as F

    return F.layer_norm(torch.softmax(x, -1), (x.shape[-1],), w, b)


def _cpu_seconds(fn: Callable, args: tuple) -> tuple[float, Any]:
    t0 = time.process_time()
    out = fn(*args)
    return time.process_time() - t0, out


def sweep(fast: Callable, ref: Callable, shapes: list[tuple], make: Callable, reps: int,
          backend: Any) -> dict:  # fmt: skip
    """Every shape: first call, steady calls, the check against eager; the compile counts."""
    import torch
    from torch._dynamo.utils import counters

    from autofuse.kernels.common.loader import kernels_built
    from autofuse.kernels.common.sizes import size_bucket

    counters.clear()
    rows, seen, built0 = [], set(), kernels_built()
    for shape in shapes:
        args = make(shape)
        bucket = tuple(size_bucket(s) for s in shape)
        before = kernels_built()
        first, out = _cpu_seconds(fast, args)
        steady = statistics.median(_cpu_seconds(fast, args)[0] for _ in range(reps))
        want = ref(*args)
        ok = torch.allclose(out, want, rtol=1e-4, atol=1e-4)
        rows.append({"shape": list(shape), "bucket_known": bucket in seen, "first_s": first,
                     "steady_s": steady, "kernels_built": kernels_built() - before,
                     "wrong": not ok})  # fmt: skip
        seen.add(bucket)
    known = [r for r in rows if r["bucket_known"]]
    return {
        "shapes": len(rows),
        "wrong": sum(r["wrong"] for r in rows),
        "aot_traces": int(counters["aot_autograd"]["total"]),
        "partitions_made": backend.counts["plans"],
        "bucket_instances": backend.counts["bucket_instances"],
        "kernels_built": kernels_built() - built0,
        "kernels_built_at_known_buckets": sum(r["kernels_built"] for r in known),
        "buckets": len(seen),
        "new_shape_over_steady": statistics.median(r["first_s"] / r["steady_s"] for r in known)
        if known
        else None,
        "first_s_known_median": statistics.median(r["first_s"] for r in known) if known else None,
        "steady_s_median": statistics.median(r["steady_s"] for r in rows),
        "per_shape": rows,
    }


def function_case(lengths: list[int], batches: list[int], reps: int) -> dict:
    import torch

    from autofuse.frontend import make_backend

    torch._dynamo.reset()
    backend = make_backend()
    fast = torch.compile(softmax_norm, backend=backend, dynamic=True)
    w, b = torch.randn(32), torch.randn(32)
    shapes = [(batch, length) for batch in batches for length in lengths]
    return sweep(fast, softmax_norm, shapes, lambda s: (torch.randn(*s, 32), w, b), reps, backend)


def llama_case(lengths: list[int], reps: int) -> dict:
    import torch
    import transformers

    from autofuse.frontend import make_backend

    torch._dynamo.reset()
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, vocab_size=64,
                                   max_position_embeddings=256)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaModel(cfg).eval()
    backend = make_backend()
    fast = torch.compile(model, backend=backend, dynamic=True)

    def run(f: Callable) -> Callable:
        def call(ids: Any) -> Any:
            with torch.no_grad():
                return f(ids).last_hidden_state

        return call

    def make(shape: tuple) -> tuple:
        return (torch.randint(0, 64, shape, generator=torch.Generator().manual_seed(shape[1])),)

    return sweep(run(fast), run(model), [(2, n) for n in lengths], make, reps, backend)


def _csv(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results")
    p.add_argument("--tag", default="dynamic_shapes")
    p.add_argument("--lengths", type=_csv, default=list(LENGTHS))
    p.add_argument("--batches", type=_csv, default=list(BATCHES))
    p.add_argument("--llama-lengths", type=_csv, default=list(LLAMA_LENGTHS))
    p.add_argument("--reps", type=int, default=5, help="steady calls per shape")
    p.add_argument("--cases", default="function,llama")
    p.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    if a.quick:
        a.lengths, a.batches, a.llama_lengths = [5, 6, 9, 11, 17, 19], [2, 3], [5, 6, 7, 9]
    result: dict[str, Any] = {"args": vars(a)}
    if "function" in a.cases:
        result["function"] = function_case(a.lengths, a.batches, a.reps)
    if "llama" in a.cases:
        result["llama"] = llama_case(a.llama_lengths, a.reps)
    for case in ("function", "llama"):
        if case in result:
            r = {k: v for k, v in result[case].items() if k != "per_shape"}
            print(case, json.dumps(r))
    out = Path(a.out) / f"{a.tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
