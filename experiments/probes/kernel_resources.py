"""What a generated kernel costs the GPU's resources, without a GPU: the kernel compiled for a
CUDA target (default sm_90, the H200's) by Triton's own toolchain, and ``ptxas -v``'s account
of it: registers per thread, bytes spilled to local memory, shared memory. A kernel that spills
or that holds few warps per SM is slow before it is timed; this finds it on any machine.

    python -m experiments.probes.kernel_resources --variant causal [--seq 1024 --head-dim 128]

builds the backward plan of ``attention_bench``'s eager-written attention (the plan only: its
steps run in eager) and reports every config of its ``attention_bwd`` kernel's space.
``resources([spec(kernel, graph), ...])`` does the same for any kernels of any plan.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_PTR = {"float32": "*fp32", "bfloat16": "*bf16", "float16": "*fp16", "int64": "*i64",
        "int32": "*i32", "int8": "*i8", "uint8": "*u8", "bool": "*i1", "float64": "*fp64"}  # fmt: skip


def signature(kernel: Any, graph: Any) -> dict[str, str]:
    """Triton's signature of the kernel's parameters: buffers by their node's dtype, extents
    as 32-bit integers, the launch constants as constexprs."""
    fn_params = re.search(rf"def {kernel.name}\((.*?)\):", kernel.source, re.S).group(1)
    names = [p.split(":")[0].strip() for p in fn_params.split(",") if p.strip()]
    info, out = kernel.info, {}
    consts = dict(kernel.launch_kw)
    args = iter(kernel.layout)
    for name in names:
        if name in consts:
            out[name] = "constexpr"
            continue
        kind, k = next(args)
        node = info.loads[k] if kind == "in" else info.stored[k] if kind == "out" else None
        out[name] = _PTR[graph[node].dtype] if node is not None else "i32"
    return out


def _import_compiled(source: str, name: str) -> Any:
    """The kernel as a ``JITFunction`` (never the interpreter's), from a file of its own."""
    path = Path(tempfile.mkdtemp(prefix="autofuse_res_")) / f"{name}.py"
    path.write_text(source)
    was = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        spec = importlib.util.spec_from_file_location(f"autofuse_res_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if was is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = was
    return getattr(module, name)


def _ptxas_report(ptx: str, arch: int) -> dict:
    from triton.backends.nvidia import compiler as nv

    ptxas = nv.get_ptxas(arch).path
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.ptx"
        src.write_text(ptx)
        res = subprocess.run([ptxas, f"-arch=sm_{arch}a", "-v", str(src), "-o", str(Path(d) / "k.o")],
                             capture_output=True, text=True, check=True)  # fmt: skip
    text = res.stderr + res.stdout
    num = lambda pat: int(m.group(1)) if (m := re.search(pat, text)) else 0  # noqa: E731
    return {"registers": num(r"Used (\d+) registers"),
            "spill_stores_bytes": num(r"(\d+) bytes spill stores"),
            "spill_loads_bytes": num(r"(\d+) bytes spill loads"),
            "stack_frame_bytes": num(r"(\d+) bytes stack frame")}  # fmt: skip


def spec(kernel: Any, graph: Any) -> dict:
    """What compiling ``kernel`` needs, as plain data (for a process without the interpreter:
    Triton's interpreter patches ``triton.language`` in the process that ran it)."""
    sig = signature(kernel, graph)
    return {"name": kernel.name, "source": kernel.source, "signature": sig,
            "constexprs": {k: v for k, v in kernel.launch_kw if sig.get(k) == "constexpr"},
            "options": {k: v for k, v in kernel.launch_kw if k in ("num_warps", "num_stages")},
            "config": kernel.config.label()}  # fmt: skip


def _aligned(signature: dict[str, str]) -> dict:
    """Triton's specialization of a launch on 16-byte aligned buffers (what the JIT passes for
    them, and what lets loads be vectorized and pipelined with ``cp.async``): every pointer
    parameter divisible by 16."""
    return {(k,): [["tt.divisibility", 16]] for k, t in enumerate(signature.values())
            if t.startswith("*")}  # fmt: skip


def compile_spec(sp: dict, arch: int = 90) -> dict:
    """Registers, spills and shared memory of one kernel ``spec`` compiled for ``sm_<arch>``
    on aligned buffers (in this process: it must not have run Triton's interpreter)."""
    import triton
    from triton.backends.compiler import GPUTarget

    fn = _import_compiled(sp["source"], sp["name"])
    src = triton.compiler.ASTSource(fn=fn, signature=sp["signature"], constexprs=sp["constexprs"],
                                    attrs=_aligned(sp["signature"]))  # fmt: skip
    c = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=sp["options"])
    rep = _ptxas_report(c.asm["ptx"], arch)
    rep["shared_bytes"] = c.metadata.shared
    rep["warps"] = sp["options"].get("num_warps", 4)
    regs = max(rep["registers"], 1) * 32 * rep["warps"]
    rep["blocks_per_sm_by_registers"] = 65536 // regs
    return rep


def resources(specs: list[dict], arch: int = 90, python: str | None = None) -> list[dict]:
    """``compile_spec`` of each spec, in a fresh process without the interpreter (``python``:
    another interpreter, e.g. one with the Triton version of the GPU host; it needs only
    Triton); a spec that does not compile gives its error."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[2]), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "specs.json"
        path.write_text(json.dumps(specs))
        res = subprocess.run(
            [python or sys.executable, "-m", "experiments.probes.kernel_resources", "--compile",
             str(path), "--arch", str(arch)],
            capture_output=True, text=True, env=env, check=False,
        )  # fmt: skip
        out = Path(d) / "specs.out.json"
        if not out.exists():
            raise RuntimeError(f"compiling the kernels failed: {res.stderr[-2000:]}")
        return json.loads(out.read_text())


def _compile_all(path: str, arch: int) -> None:
    rows = []
    for sp in json.loads(Path(path).read_text()):
        try:
            rows.append({"config": sp["config"], **compile_spec(sp, arch)})
        except Exception as e:  # noqa: BLE001 - a config that does not compile is a row too
            first = (str(e).strip().splitlines() or [""])[0]  # no paths of this machine
            rows.append({"config": sp["config"], "error": f"{type(e).__name__}: {first[:300]}"})
    Path(path).with_suffix(".out.json").write_text(json.dumps(rows))


def attention_bwd_kernels(variant: str, seq: int, head_dim: int) -> tuple[Any, list]:
    """(graph, [kernel per config]) of the attention_bwd group of ``variant``'s backward plan
    (built on CPU tensors of one head; the plan's steps run in eager)."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    import autofuse  # noqa: F401 - registers the backend
    import autofuse.frontend.dynamo as dyn
    from autofuse.frontend import compiled_graphs
    from autofuse.kernels import config_space, generate
    from experiments.bench.attention_bench import make

    build = dyn.AutofuseBackend.compile_graph

    def plan_only(self, kind, gm, example_inputs):
        build(self, kind, gm, example_inputs)
        return gm

    dyn.AutofuseBackend.compile_graph = plan_only
    try:
        fn, args, _, _ = make(variant, 1, 2, seq, head_dim, device="cpu")
        for a in args[:3]:  # q, k, v, as the bench's training step (a mask needs none)
            a.requires_grad_()
        torch.compile(fn, backend="autofuse")(*args).float().sum().backward()
    finally:
        dyn.AutofuseBackend.compile_graph = build
    bw = [g for g in compiled_graphs() if g.kind == "backward"][-1]
    (k,) = [k for k in bw.plan.kernels if k.info.kind == "attention_bwd"]
    graph = bw.plan.graph
    return graph, [generate(graph, k.info, c) for c in config_space(k.info, graph)]


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", default="causal")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    p.add_argument("--triton-python", default=None,
                   help="compile with this Python interpreter (another Triton version)")  # fmt: skip
    p.add_argument("--compile", default=None, help=argparse.SUPPRESS)  # the child process
    a = p.parse_args(argv)
    if a.compile:
        _compile_all(a.compile, a.arch)
        return []
    graph, kernels = attention_bwd_kernels(a.variant, a.seq, a.head_dim)
    rows = resources([spec(k, graph) for k in kernels], a.arch, a.triton_python)
    for r in rows:
        print(json.dumps(r), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
