"""Split reductions with few, long rows (``ir/split.py``): BatchNorm's batch statistics in
training mode, GroupNorm with few (N, group) rows, plain sums / means / variances / maxima.

BatchNorm reduces over (N, H, W) or (N, D, H, W): not adjacent, so the cut is the first reduced
dim N or, where N has no divisor near the wanted chunk count, the merged spatial run (the H100's
L2_72, ConvTranspose3d's (64, 16, 63, 63, 63) result: 16 channels of 16M elements, ~122 chunks
wanted, N = 64 has no divisor near 122, D x H x W = 250047 has 147). Values equal eager's,
forward and backward, through both front ends; a constant channel or row still normalizes to
exactly 0. The split is on for the interpreter from 1024 reduced elements (the ``split_on``
fixture), so tiny shapes take the split path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse.capture.trace import capture
from autofuse.frontend import dynamo
from autofuse.ir.split import SplitPolicy, plan_splits

from .helpers import assert_close, dtype_front_grid

POLICY = SplitPolicy(min_rnumel=1024)
DTYPES = [torch.float32, torch.bfloat16]


def _split(graph) -> bool | None:
    """Whether ``graph`` holds a split reduction's stages or split variance statistics (None:
    it reduces nothing, as the backward of a sum)."""
    if not any(n.kind == "reduction" for n in graph.nodes):
        return None
    return any(n.name.endswith((".part", ".chunk_m2")) for n in graph.nodes)


def _run(fn, args, front):
    """``fn`` through ``front``: its outputs and a function listing, for every graph compiled
    for it so far (the backward's once it ran), whether the graph is split."""
    if front == "optimize":
        opt = autofuse.optimize(fn, args)
        out = opt(*args)
        records = lambda: opt.autograd.records if opt.autograd is not None else []  # noqa: E731
        return out, lambda: [_split(r.plan.graph) for r in records()] or [_split(opt.plan.graph)]
    torch._dynamo.reset()
    before = dynamo.compiled_count()
    out = torch.compile(fn, backend="autofuse", dynamic=False)(*args)
    return out, lambda: [_split(c.plan.graph) for c in dynamo.compiled_since(before)]


def _grads(out, args):
    torch.manual_seed(1)
    return torch.autograd.grad(out, [a for a in args if a.requires_grad], torch.randn_like(out))


def _equal_eager(fn, args, front, dtype, grad=True, reducing=2):
    """``fn`` through ``front`` equals eager forward (and backward with ``grad``); the
    ``reducing`` graphs compiled for it that reduce (the backward's included) are split."""
    ref_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    ref = fn(*ref_args)
    got, split = _run(fn, args, front)
    assert got.dtype == ref.dtype
    assert_close(got.detach().float(), ref.detach().float(), dtype, f"{front} output")
    if grad:
        for k, (h, w) in enumerate(zip(_grads(got, args), _grads(ref, ref_args))):
            assert_close(h.float(), w.float(), dtype, f"{front} grad {k}")
    reduce = [s for s in split() if s is not None]
    assert len(reduce) == reducing and all(reduce), f"{front}: {split()}"


def _x(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (3.0 + torch.randn(*shape, generator=g)).to(dtype).requires_grad_()


def test_batchnorm_statistics_cut_the_spatial_run():
    # N = 2 has no divisor near the 3 chunks wanted; D x H x W = 3375 has 3
    g = capture(lambda t: t.sum(dim=(0, 2, 3, 4)), (torch.ones(2, 3, 15, 15, 15),)).graph
    (dec,) = plan_splits(g, POLICY).values()
    assert (dec.k, dec.dim, dec.last) == (3, 2, 4), dec
    # the H100's L2_72: 16 channels of 64 x 63^3 want ~122 chunks (4 programs per SM)
    assert SplitPolicy(num_sm=132).wanted_k(64 * 63**3, 16, inner=True)[0] == 122


@pytest.mark.parametrize("dims,dtype,front", dtype_front_grid(DTYPES, lead=(2, 3)))
def test_training_batch_norm(split_on, dims, dtype, front):
    shape = (2, 3, 48, 48) if dims == 2 else (2, 3, 15, 15, 15)
    x = _x(shape, dtype)
    w = torch.rand(3, dtype=dtype).add(0.5).requires_grad_()
    b = torch.randn(3, dtype=dtype).requires_grad_()

    def bn(x, w, b):
        return F.batch_norm(x, None, None, w, b, training=True)

    _equal_eager(bn, (x, w, b), front, dtype)


@pytest.mark.parametrize("dtype,front", dtype_front_grid(DTYPES))
def test_group_norm_with_few_rows(split_on, dtype, front):
    # 2 rows (N, group) of 2 x 64 x 64 elements; the backward's per-(N, C) sums over 64 x 64
    x = _x((1, 4, 64, 64), dtype)
    w = torch.rand(4, dtype=dtype).add(0.5).requires_grad_()

    def gn(x, w):
        return F.group_norm(x, 2, w)

    _equal_eager(gn, (x, w), front, dtype)


def _plain(fn):
    return {
        "sum": lambda x: x.sum(dim=(0, 2)),
        "mean": lambda x: x.mean(dim=(0, 2)),
        "var": lambda x: x.var(dim=(0, 2)),
        "amax": lambda x: x.amax(dim=(0, 2)) * 2.0,
    }[fn]


@pytest.mark.parametrize(
    "fn,dtype,front", dtype_front_grid(DTYPES, lead=("sum", "mean", "var", "amax"))
)
def test_plain_reductions_over_few_long_rows(split_on, fn, dtype, front):
    x = _x((3, 2, 4096), dtype)
    # the backward of a sum or a mean reduces nothing (a broadcast of the gradient); amax's
    # counts the row's maxima, var's sums through the mean
    _equal_eager(_plain(fn), (x,), front, dtype, reducing=2 if fn in ("var", "amax") else 1)


@pytest.mark.parametrize("dtype,front", dtype_front_grid(DTYPES))
def test_constant_channels_stay_exact(split_on, dtype, front):
    """A constant channel's batch variance is exactly 0 and it normalizes to exactly 0; a
    constant row's var is 0 (the split chunk means are exact, Chan's combine adds 0)."""
    x = torch.tensor([0.7, -3.3]).view(1, 2, 1, 1).expand(2, 2, 48, 48).contiguous().to(dtype)

    def stats(x):
        return F.batch_norm(x, None, None, training=True, eps=1e-12), x.var(dim=(0, 2, 3))

    (y, var), split = _run(stats, (x,), front)
    assert all(split()) and not y.any() and not var.any(), (y.abs().max(), var)


def _winners(dtype):
    x = torch.randn(3, 8192, generator=torch.Generator().manual_seed(2)).to(dtype)
    x[0, 100] = x[0, 5000] = 50.0  # a tie across chunks: the first wins
    x[1, 3000] = x[1, 7000] = float("nan")  # a NaN wins, the first of them
    x[2] = 1.0  # a constant row: index 0
    return x


@pytest.mark.parametrize("dtype,front", dtype_front_grid(DTYPES))
def test_argmax_argmin_from_chunk_winners(split_on, dtype, front):
    """argmax / argmin over few long rows (and over every element) split: per-chunk winners,
    the first chunk holding the row's best (a NaN first) gives the index, as eager's."""
    x = _winners(dtype)

    def arg(x):
        return x.argmax(-1), x.argmin(-1, keepdim=True), x.argmax(), (-x).argmin()

    got, split = _run(arg, (x,), front)
    assert split() == [True]
    for k, (o, r) in enumerate(zip(got, arg(x))):
        assert o.dtype == torch.int64 and torch.equal(o, r), (k, o, r)


def test_float32_batch_norm_is_three_kernels(split_on):
    """The statistics in one pass over x (the chunk means, M2s and the overflow rescue's scaled
    M2s), their combine, the normalization: the rescue was a split sum of its own, two more
    kernels, the first writing x - mean out for the normalization (L2_52 on the H100: 6.1 of
    its 16 ms)."""
    x = _x((2, 3, 48, 48), torch.float32).detach()
    plan = autofuse.optimize(lambda t: F.batch_norm(t, None, None, training=True), (x,)).plan
    src = plan.graph.inputs[0]
    kernels = [s.kernel for s in plan.steps if hasattr(s, "kernel")]
    assert len(kernels) == 3, [k.name for k in kernels]
    assert [src in k.info.loads for k in kernels] == [True, False, True]
