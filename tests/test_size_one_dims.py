"""Dims of size 1 in fused kernels: outputs of one group with different ranks or with size-1
dims in other places than the reduction's domain (``unsqueeze`` beside a keepdim reduction,
views to size-1 dims, a 1x1 feature map's group norm), through both front ends, forward and
backward, in this process and in a fresh one. A store placed by the output's rank alone wrote
only a[:, 0, 0] of a [2, 1, 8] output (the rest uninitialised) and wrote outside the gradient
buffers of group_norm on (2, 8, 1, 1)."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse.ir.indexing import Expr
from autofuse.kernels.common.render import tile_address
from tests.helpers import check_partitions

FRONT_ENDS = ("optimize", "compile")


def _front(fn, args, front: str):
    if front == "optimize":
        return autofuse.optimize(fn, args)
    torch._dynamo.reset()
    return torch.compile(fn, backend="autofuse")


def _check(fn, args, front: str) -> None:
    out = _front(fn, args, front)(*args)
    ref = fn(*args)
    for o, r in zip(out, ref):
        assert o.shape == r.shape and o.stride() == r.stride(), (o.shape, o.stride(), r.stride())
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)


# pointwise outputs with size-1 dims beside a reduction whose domain has them elsewhere
FORMS = {
    "unsqueeze1_vs_sum_keepdim": lambda t: (t.unsqueeze(1) * 2, t.unsqueeze(2).sum(2)),
    "view_2181_vs_sum": lambda t: (t.view(2, 1, 8, 1) * 2, t.view(2, 8, 1).sum(2)),
    "unsqueeze0_vs_amax": lambda t: (t.unsqueeze(0) + 1, t.unsqueeze(2).amax(2, keepdim=True)),
    "view_1281_vs_mean": lambda t: (t.view(1, 2, 8, 1) - 3, t.view(2, 8, 1, 1).mean((2, 3))),
    "unsqueeze_last_vs_sum0": lambda t: (t.unsqueeze(-1) * t.unsqueeze(-1), t.sum(0)),
    "three_ranks": lambda t: (t * 2, t.unsqueeze(1).sin(), t.view(2, 8, 1).sum(2, keepdim=True)),
}


@pytest.mark.parametrize("front", FRONT_ENDS)
@pytest.mark.parametrize("form", sorted(FORMS))
def test_size_one_outputs_beside_a_reduction(form, front):
    t = torch.arange(16.0).view(2, 8)
    _check(FORMS[form], (t,), front)


def _group_norm_grads(groups: int, affine: bool, front: str):
    torch.manual_seed(groups)
    x = torch.randn(2, 8, 1, 1, requires_grad=True)
    params = (torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True))
    args = (x, *params) if affine else (x,)

    def f(x, *wb):
        return F.group_norm(x, groups, *wb)

    fn = torch.compile(f, backend="autofuse") if front == "compile" else autofuse.optimize(f, args)
    torch._dynamo.reset()
    out, ref = fn(*args), f(*args)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    gy = torch.randn_like(ref)
    got = torch.autograd.grad(out, args, gy)
    want = torch.autograd.grad(ref, args, gy)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("front", FRONT_ENDS)
@pytest.mark.parametrize("groups,affine", [(2, True), (1, False), (4, True)])
def test_group_norm_on_a_1x1_map_forward_and_backward(groups, affine, front):
    _group_norm_grads(groups, affine, front)


def test_the_three_forms_in_a_fresh_process():
    """The reported forms, each after another graph was compiled in the same new process (where
    the out-of-bounds stores showed as heap corruption)."""
    script = textwrap.dedent(
        """
        import torch, torch.nn.functional as F, autofuse
        t = torch.arange(16.0).view(2, 8)
        warm = torch.compile(lambda a: (a * 3).sum(1), backend="autofuse")
        assert torch.allclose(warm(t), (t * 3).sum(1))
        for f in (lambda t: (t.unsqueeze(1) * 2, t.unsqueeze(2).sum(2)),
                  lambda t: (t.view(2, 1, 8, 1) * 2, t.view(2, 8, 1).sum(2))):
            for fn in (torch.compile(f, backend="autofuse"), autofuse.optimize(f, (t,))):
                for o, r in zip(fn(t), f(t)):
                    assert torch.equal(o, r), (o, r)
        torch.manual_seed(0)
        for groups in (2, 1):
            x = torch.randn(2, 8, 1, 1, requires_grad=True)
            w, b = torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)
            g = lambda x, w, b: F.group_norm(x, groups, w, b)
            out = torch.compile(g, backend="autofuse")(x, w, b)
            ref = g(x, w, b)
            gy = torch.randn_like(ref)
            for a, e in zip(torch.autograd.grad(out, (x, w, b), gy),
                            torch.autograd.grad(ref, (x, w, b), gy)):
                assert torch.allclose(a, e, atol=1e-4), (a, e)
        print("size-1 forms ok")
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "size-1 forms ok" in run.stdout


def _attention_ones(x0, x2, x3, x4):
    return (torch.softmax((x0 @ x2.transpose(-2, -1)) * 0.5 + x4, dim=-1) @ x3,)


def _broadcast_scores(x1, x2, x3):
    mask = torch.ones(8, 3, dtype=torch.bool).triu(1)
    s = (x1 @ x2.transpose(-2, -1) * 0.5).masked_fill(mask, float("-inf"))
    return (torch.softmax(s, dim=-1) @ x3,)


def _empty_log_softmax(x0):
    return (torch.log_softmax(x0[1:0:2], dim=0),)


def _slice_of_empty(x0, x1):
    return ((x0 - x1)[-2::1],)


def _group_norm_of_empty(x0, x1, x2):
    return (F.group_norm(x0, 1, x1, x2),)


def _expand_channels_last(x1):
    return ((x1 - x1).expand((3, -1, -1, -1, 3)),)


def _one_row_head_dim_one(x0, x2, x3):
    s = (x0 @ x2.transpose(-2, -1) * 0.5).masked_fill(
        torch.ones(1, 1, dtype=torch.bool).triu(1), -1e9
    )
    return (torch.softmax(s, dim=-1) @ x3,)


def _bmm_per_batch_bias(a, b, c):
    return (torch.relu(torch.bmm(a, b) + c),)


CASES = {  # found by experiments.fuzz: size-1 and size-0 dims in matmul, attention and reductions
    "attention_of_ones": (_attention_ones, [(1, 1, 1), (1, 1, 1), (1, 1, 1), (1, 1)], True),
    "scores_broadcast_by_a_mask": (_broadcast_scores, [(1, 1, 4), (1, 1, 4), (1, 3, 1)], False),
    "log_softmax_of_an_empty_slice": (_empty_log_softmax, [(1, 0)], True),
    "attention_one_row_value_head_dim_1": (
        _one_row_head_dim_one,
        [(1, 1, 1, 2), (1, 1, 1, 2), (1, 1, 1, 1)],
        True,
    ),
    "slice_of_an_empty_difference": (_slice_of_empty, [(0,), (1,)], True),
    "group_norm_of_an_empty_batch": (_group_norm_of_empty, [(0, 1), (1,), (1,)], True),
    "expand_of_a_channels_last_result": (_expand_channels_last, [(1, 2, 2, 1)], True),
    # the epilogue reads one value per batch: an address with neither tile axis
    "bmm_plus_a_per_batch_value": (_bmm_per_batch_bias, [(3, 5, 7), (3, 7, 6), (3, 1, 1)], True),
}


@pytest.mark.parametrize("front", FRONT_ENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_fuzzer_found_size_one_and_empty_forms(case, front):
    fn, shapes, backward = CASES[case]
    torch.manual_seed(0)
    args = [torch.randn(s) for s in shapes]
    if case == "expand_of_a_channels_last_result":
        args = [a.contiguous(memory_format=torch.channels_last) for a in args]
    args = [a.requires_grad_(backward) for a in args]
    out = _front(fn, args, front)(*args)
    ref = fn(*args)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)
        live = [(a, b) for a, b, n in zip(o.stride(), r.stride(), r.shape) if n > 1]
        assert all(a == b for a, b in live) or not r.numel(), (o.stride(), r.stride())
    if backward and ref[0].numel():
        gy = torch.randn_like(ref[0])
        got = torch.autograd.grad(out[0], args, gy, allow_unused=True)
        want = torch.autograd.grad(ref[0], args, gy, allow_unused=True)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_a_per_batch_value_in_every_partition_of_a_batched_gemm():
    """A GEMM epilogue reading ``c[b, 0, 0]`` addressed it by ``pid_b`` alone: a scalar
    pointer under the tile's block mask, which Triton refuses (the fused partition raised)."""
    torch.manual_seed(0)
    args = tuple(torch.randn(s) for s in ((3, 5, 7), (3, 7, 6), (3, 1, 1)))
    check_partitions(_bmm_per_batch_bias, args)


def test_an_address_that_lost_axes_takes_the_tile_shape():
    row = Expr.dim("xindex", 1, 8, True)
    assert tile_address(row.scale(4), ("xindex", "rindex")) == "4 * xindex + 0 * rindex"
    assert tile_address(Expr.constant(3), ("xindex",)) == "3 + 0 * xindex"
    assert tile_address(row, ("xindex",)) == "xindex"


def test_one_rule_for_tile_addresses():
    """No kernel module gives an address a tile's shape by a rule of its own."""
    kernels = Path(autofuse.__file__).parent / "kernels"
    own = [
        f"{path.relative_to(kernels)}:{n}"
        for path in kernels.rglob("*.py")
        if path.name != "render.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "+ 0 * " in line or ("broadcast_to(" in line and "ptr" in line)
    ]
    assert not own, own
