"""Reproduction found by the autofuse fuzzer (experiments/fuzz), graph 542 of seed 21 (program seed 21000542).

Front end optimize, forward mode: crash (KernelBuildWarning).
KernelBuildWarning: autofuse: kernel autofuse_sct_fused_scatter_0 could not be built
(InterpreterError: ValueError('atomic_add does not support uint8')); its 1 ops run in eager from
now on

Exits non-zero while autofuse differs from eager; prints a line and exits 0 once fixed.
"""

import os

os.environ.setdefault("AUTOFUSE_CHECK_BOUNDS", "1")

import torch
import torch.nn.functional as F  # noqa: F401

import autofuse  # noqa: F401 - the backend registered

DEVICE = 'cpu'
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
BACKWARD = False
N_OUT = 2
LOWEST = None


def make_inputs(device="cpu"):
    g = torch.Generator()
    g.manual_seed(21969)
    x0 = torch.randint(-4, 5, (1, 1, 2), generator=g).to(torch.int32).to(device)[..., ::2]
    g.manual_seed(52208)
    x1 = torch.randint(-4, 5, (1, 1, 1), generator=g).to(torch.int32).to(device)
    g.manual_seed(25035)
    x2 = torch.randint(0, 1, (1, 1, 1), generator=g).to(device)
    g.manual_seed(58248)
    x3 = torch.randint(-4, 5, (1, 1, 2), generator=g).to(torch.uint8).to(device)[..., ::2]
    return [x0, x1, x2, x3]


def program(x0, x1, x2, x3):
    v0 = torch.ne(x0, x1).to(torch.uint8)
    v1 = (lambda t: t.__setitem__(0, 7) or t)(x0.clone())
    v2 = v0.scatter_add(1, x2, x3)
    v3 = v2.masked_fill((v2 > 0), -1)
    v4 = (v3 > 1)
    return (v4, v1)


def COMPILED():
    return autofuse.optimize(program, make_inputs(DEVICE))


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
