"""Generated kernels compiled for a GPU target (sm_90) without a GPU and without launching them.

The interpreter runs a kernel's Python body; a real GPU compiles it through Triton's passes
(TTIR, TTGIR, LLVM IR, PTX, cubin), which reject constructs the interpreter takes: an assert on
an integer, a literal of the wrong type, an op on a block of zero elements. Triton's compiler
runs on a machine with no driver when it is given the target, so the kernels a program launches
in the interpreter are compiled here as a launch on an H100 would compile them: the same
source, argument dtypes, integer values (Triton specializes on 1 and on multiples of 16) and
constexprs, in plain and in bounds-guarded form (what ``AUTOFUSE_CHECK_BOUNDS`` builds on a
GPU: a device assert before each access, debug mode).

Use ``with recording_launches() as launches:`` around a run, then
``compile_for_gpu(launches)``: the errors of the kernels that do not compile. The compiler runs
in a child process: the interpreter patches ``triton.language`` in this one.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

TARGET = ("cuda", 90, 32)


def _arg(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return ["tensor", str(a.dtype).removeprefix("torch.")]
    if isinstance(a, bool) or not isinstance(a, (int, float)):
        return ["value", a if isinstance(a, bool) or a is None else str(a)]
    return ["int" if isinstance(a, int) else "float", a]


def _launch(fn: Any, args: Sequence[Any], meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The compile jobs of one launch: the plain kernel, and its guarded form when it has one."""
    from autofuse.kernels.common.guards import guard_source, span

    py = getattr(fn, "fn", fn)
    source = sys.modules[py.__module__].__loader__.get_source(py.__module__)
    name = py.__name__
    jobs = [{"source": source, "name": name, "args": [_arg(a) for a in args], "meta": meta}]
    guarded = guard_source(source, name)
    if guarded.extents:
        params = [p for p in py.__code__.co_varnames[: py.__code__.co_argcount]]
        bound = dict(zip([p for p in params if p not in {e for _, e in guarded.extents}], args))
        extents = {e: span(bound.get(p)) for p, e in guarded.extents}
        meta = {**meta, **extents, "debug": True}
        jobs.append({"source": guarded.source, "name": name, "args": jobs[0]["args"], "meta": meta})
    return jobs


@contextlib.contextmanager
def recording_launches() -> Iterator[list[dict[str, Any]]]:
    """The compile jobs of every kernel launched inside (each code text and signature once)."""
    from autofuse.plan.launcher import Launcher

    jobs: list[dict[str, Any]] = []
    seen: set[str] = set()
    first = Launcher._first  # noqa: SLF001 - the launch the interpreter takes

    def record(self: Any, args: Sequence[Any]) -> None:
        for job in _launch(self.fn, args, self.meta):
            key = json.dumps(job, sort_keys=True, default=str)
            if key not in seen:
                seen.add(key)
                jobs.append(job)
        first(self, args)

    Launcher._first = record  # noqa: SLF001
    try:
        yield jobs
    finally:
        Launcher._first = first  # noqa: SLF001


def compile_for_gpu(jobs: list[dict[str, Any]], timeout: float = 600) -> list[str]:
    """The errors of the ``jobs`` (from :func:`recording_launches`) compiled for sm_90."""
    if not jobs:
        return []
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    res = subprocess.run(
        [sys.executable, str(Path(__file__).resolve())], input=json.dumps(jobs), text=True,
        capture_output=True, env=env, timeout=timeout,
    )  # fmt: skip
    if res.returncode != 0:
        return [f"compiler process failed: {res.stderr[-2000:]}"]
    return json.loads(res.stdout.splitlines()[-1])


def _compile_job(job: dict[str, Any], folder: Path, k: int) -> None:
    """One job compiled (in the child process: ``triton.jit`` builds real JIT functions)."""
    import importlib.util

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile, make_backend
    from triton.runtime.jit import create_function_from_signature

    path = folder / f"kernel_{k}.py"
    path.write_text(job["source"])
    spec = importlib.util.spec_from_file_location(f"gpu_compile_kernel_{k}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    jit = getattr(module, job["name"])
    target = GPUTarget(*TARGET)
    backend = make_backend(target)
    args = []
    for kind, v in job["args"]:
        args.append(torch.empty(1, dtype=getattr(torch, v)) if kind == "tensor" else v)
    kwargs = {**job["meta"], "debug": bool(job["meta"].get("debug", False) or jit.debug)}
    binder = create_function_from_signature(jit.signature, jit.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = jit._pack_args(  # noqa: SLF001 - Triton's own
        backend, kwargs, bound, specialization, options
    )
    compile(ASTSource(jit, signature, constexprs, attrs), target=target, options=options.__dict__)


def _main() -> None:
    import tempfile

    jobs = json.loads(sys.stdin.read())
    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, job in enumerate(jobs):
            try:
                _compile_job(job, Path(tmp), k)
            except Exception as e:  # noqa: BLE001 - every error is reported
                guarded = " (bounds-guarded)" if job["meta"].get("debug") else ""
                errors.append(f"{job['name']}{guarded}: {type(e).__name__}: {str(e)[-800:]}")
    print(json.dumps(errors))


if __name__ == "__main__":
    _main()
