"""Reproduction found by the autofuse fuzzer (experiments/fuzz), graph 9 of seed 21 (program seed 21000009).

Front end optimize, backward mode: mismatch in the backward values.
value 0: Tensor-likes are not close! Mismatched elements: 16 / 16 (100.0%) Greatest absolute
difference: 0.1015625 at index (0,) (up to 0.001 allowed) Greatest relative difference:
0.1739501953125 at index (10,) (up to 0.001 allowed)

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
N_OUT = 3
LOWEST = torch.float16


def make_inputs(device="cpu"):
    g = torch.Generator()
    g.manual_seed(34250)
    x0 = torch.randn((16,), generator=g).to(torch.float16).to(device)
    g.manual_seed(8446)
    x1 = torch.randn((4, 8, 1), generator=g).to(torch.float32).to(device)
    return [x0, x1]


def program(x0, x1):
    v0 = (x1 + x0)
    v1 = F.layer_norm(x0.mean(-1, keepdim=True).expand_as(x0), [16], eps=1e-6)
    v2 = torch.copysign(v1, -0.0)
    return (v2, v0, v1)


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
