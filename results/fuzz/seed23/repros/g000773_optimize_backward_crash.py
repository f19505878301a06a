"""Reproduction found by the autofuse fuzzer (experiments/fuzz), graph 773 of seed 23 (program seed 23000773).

Front end optimize, backward mode: crash (TorchRuntimeError).
TorchRuntimeError: RuntimeError when making fake tensor call Explanation: Dynamo failed to run
FX node with fake tensors: call_function <built-in function rshift>(*(FakeTensor(..., size=(1,
0), dtype=torch.bool), 1), **{}): got RuntimeError('rshift: Expected input tensor to have an
integral dtype. Got torch.bool') Hint: Your code may result in an error when running in eager.
Please double check th

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
BACKWARD = True
N_OUT = 1
LOWEST = None


def make_inputs(device="cpu"):
    g = torch.Generator()
    g.manual_seed(61480)
    x0 = torch.randn((1, 0), generator=g).to(torch.float32).to(device)
    return [x0]


def program(x0):
    v0 = (~(x0 > 0) ^ True)
    v1 = (v0 >> 1)
    return (v1,)


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
