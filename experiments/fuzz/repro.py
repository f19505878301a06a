"""A failing program written out as a standalone script: it builds the inputs (on the CPU, moved
to the run's device), runs the program in eager and through the failing front end, and asserts
that they agree (so it exits non-zero while the failure is there, and 0 once it is fixed). The
script sets the run's bounds mode and TF32 flags."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from experiments.fuzz.compare import Verdict, lowest_precision
from experiments.fuzz.program import Program, inputs_source, program_source

FRONT_END_CODE = {
    "optimize": "autofuse.optimize(program, make_inputs(DEVICE))",
    "compile": 'torch.compile(program, backend="autofuse", dynamic=False)',
}

RUNNER = '''

TOL = {torch.float32: (1.3e-5, 1e-5), torch.float16: (1e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2)}


def inputs():
    xs = make_inputs(DEVICE)
    return [x.requires_grad_() if BACKWARD and x.is_floating_point() else x for x in xs]


def run(fn, xs):
    """The outputs and, with BACKWARD, the float inputs' gradients (fixed cotangents)."""
    outs = list(fn(*xs))
    if not BACKWARD:
        return outs
    diff = [o for o in outs if o.requires_grad and o.dtype.is_floating_point]
    leaves = [x for x in xs if x.requires_grad]
    if not diff or not leaves:
        return outs
    g = torch.Generator().manual_seed(1234)
    cots = [torch.randn(o.shape, generator=g).to(device=o.device, dtype=o.dtype) for o in diff]
    return outs + list(torch.autograd.grad(diff, leaves, cots, allow_unused=True))


def main():
    expected = run(program, inputs())
    compiled = COMPILED()
    actual = run(compiled, inputs())
    assert len(actual) == len(expected), f"{len(actual)} values, eager gives {len(expected)}"
    for k, (a, e) in enumerate(zip(actual, expected)):
        assert (a is None) == (e is None), f"value {k}: {a!r} where eager gives {e!r}"
        if e is None:
            continue
        rtol, atol = TOL.get(e.dtype, (0.0, 0.0))
        if LOWEST is not None and e.dtype.is_floating_point:  # the program passes through it
            rtol, atol = max(rtol, TOL[LOWEST][0]), max(atol, TOL[LOWEST][1])
        torch.testing.assert_close(
            a.detach(),
            e.detach(),
            rtol=rtol,
            atol=atol,
            equal_nan=True,
            msg=lambda m, k=k: f"value {k} ({'output' if k < N_OUT else 'gradient'}): {m}",
        )
    print("autofuse agrees with eager")


if __name__ == "__main__":
    main()
'''


@dataclass(frozen=True)
class Target:
    """Where a run checks: the device, the bounds mode, TF32 for eager's float32 matmuls."""

    device: str = "cpu"
    check_bounds: bool = True
    tf32: bool = False


def repro_source(p: Program, v: Verdict, origin: str, target: Target = Target()) -> str:
    backward = v.mode == "backward"
    bounds = "1" if target.check_bounds else "0"
    head = [
        f'"""Reproduction found by the autofuse fuzzer (experiments/fuzz), {origin}.',
        "",
        f"Front end {v.front_end}, {v.mode} mode: {v.status}"
        + (f" in the {v.phase} values" if v.phase else "")
        + (f" ({v.error})" if v.error else "")
        + ".",
        *_wrap(v.detail),
        "",
        "Exits non-zero while autofuse differs from eager; prints a line and exits 0 once fixed.",
        '"""',
        "",
        "import os",
        "",
        f'os.environ.setdefault("AUTOFUSE_CHECK_BOUNDS", "{bounds}")',
        "",
        "import torch",
        "import torch.nn.functional as F  # noqa: F401",
        "",
        "import autofuse  # noqa: F401 - the backend registered",
        "",
        f"DEVICE = {target.device!r}",
        f"torch.backends.cuda.matmul.allow_tf32 = {target.tf32}",
        f"torch.backends.cudnn.allow_tf32 = {target.tf32}",
        f"BACKWARD = {backward}",
        f"N_OUT = {len(p.outputs)}",
        f"LOWEST = {lowest_precision(p)}",
        "",
        "",
        inputs_source(p),
        "",
        program_source(p),
        "",
        f"def COMPILED():\n    return {FRONT_END_CODE.get(v.front_end, 'program')}\n",
    ]
    return "\n".join(head) + RUNNER


def _wrap(text: str, width: int = 96) -> list[str]:
    words, lines, cur = text.replace('"""', "'''").split(), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}".strip()
    return lines + ([cur] if cur else [])


def write_repro(path: Path, p: Program, v: Verdict, origin: str, target: Target = Target()) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(repro_source(p, v, origin, target))
    return path
