"""Split variances (``ir/split_variance.py``): a split ``sum((x - mean(x))^2)`` runs as per-chunk
means and M2s in one pass over x, combined by Chan's formula, and still equals eager.

As in ``test_split_reduction.py`` the split is forced on for the interpreter with a low threshold
so small shapes split. Inputs have large means (``1000 + randn``): the naive
``E[x^2] - E[x]^2`` is ~20% off there in float32; the tolerances below are far tighter."""

import copy

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse.capture.trace import capture
from autofuse.ir.split import SplitPolicy, plan_splits, split_reductions

POLICY = SplitPolicy(min_rnumel=1024)
RTOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}


def column_stats(x):
    return x.mean(dim=0), x.var(dim=0, unbiased=False)


def var_mean0(x):
    return torch.var_mean(x, dim=0)


def std0(x):
    return x.std(dim=0)


def bn_stats(x):  # BatchNorm-style NCHW statistics: over (N, H, W), kept
    return torch.var_mean(x, dim=(0, 2, 3), keepdim=True, correction=0)


def hw_stats(x):  # over the adjacent (H, W): merged before the cut
    return torch.var_mean(x, dim=(2, 3), keepdim=True)


def bn_train(x):
    return F.batch_norm(x, None, None, training=True)


def pow_var(x):  # (x - mean)^2 written as a pow, the mean not kept
    return ((x - x.mean(0)) ** 2).sum(0)


def _large(shape, dtype):
    torch.manual_seed(0)
    return (1000.0 + torch.randn(*shape)).to(dtype)


def _x_readers(plan):
    """The kernels of ``plan`` that load the function's input."""
    x = plan.graph.inputs[0]
    return [step.kernel for step in plan.steps if x in step.kernel.info.loads]


def _moments_in(kernel, graph) -> bool:
    """Whether ``kernel`` computes the chunk means and M2s."""
    names = {graph[n].name.rsplit(".", 1)[-1] for n in kernel.info.nodes}
    return {"chunk_m2"} <= names


def _close(out, ref, dtype, what):
    """Each output against float64 eager, relative to its own scale (a variance is not judged
    on its mean's scale)."""
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    for k, (o, r) in enumerate(zip(outs, refs)):
        assert o.shape == r.shape and o.dtype == dtype, f"{what} output {k}"
        err = ((o.double() - r).abs().max() / r.abs().max()).item()
        assert err <= RTOL[dtype], f"{what} output {k}: relative error {err:.3g}"


CASES = [
    (column_stats, (6000, 7)),
    (var_mean0, (4096, 5)),
    (std0, (3000, 3)),
    (bn_stats, (64, 3, 8, 8)),
    (hw_stats, (2, 3, 64, 64)),
    (pow_var, (4096, 3)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fn,shape", CASES, ids=[c[0].__name__ for c in CASES])
def test_variance_split_equals_eager(split_on, fn, shape, dtype):
    x = _large(shape, dtype)
    g = capture(fn, (x,)).graph
    names = {n.name for n in g.nodes}
    assert {"chunk_mean", "chunk_m2"} <= {n.rsplit(".", 1)[-1] for n in names}, "not rewritten"
    opt = autofuse.optimize(fn, (x,))
    readers = _x_readers(opt.plan)
    # the chunk moments in one pass over x; a float32 variance's overflow rescue (the sum of
    # (diff * 2^-k)^2, in the decomposition) is one more chunk M2 of that pass
    assert len(readers) == 1
    assert any(_moments_in(r, opt.plan.graph) for r in readers)
    _close(opt(x), fn(x.double()), dtype, fn.__name__)


def test_batch_norm_training_bf16(split_on):
    x = _large((64, 3, 8, 8), torch.bfloat16)
    g = capture(bn_train, (x,)).graph
    assert any(n.name.endswith(".chunk_m2") for n in g.nodes)
    # statistics in one pass, the normalization reads x again (as unsplit)
    assert len(_x_readers(autofuse.optimize(bn_train, (x,)).plan)) == 2
    out = autofuse.optimize(bn_train, (x,))(x)
    ref = bn_train(x.double())
    assert (out.double() - ref).abs().max().item() < 0.05  # y ~ N(0, 1): bf16 rounding


def test_naive_moments_would_fail_these_tolerances():
    x = _large((6000, 7), torch.float32)
    naive = (x * x).mean(0) - x.mean(0) ** 2
    ref = x.double().var(0, unbiased=False)
    assert ((naive.double() - ref).abs().max() / ref.abs().max()).item() > RTOL[torch.float32]


def test_column_stats_reads_x_once(split_on):
    """The chunk means and M2s are one kernel reading x; the combine reads the partials. The
    float32 variance's overflow rescue (the sum of (diff * 2^-k)^2) is a scaled chunk M2 of the
    same kernel, combined as the M2 is (it was a second pass over x)."""
    x = _large((6000, 7), torch.float32)
    plan = autofuse.optimize(column_stats, (x,)).plan
    g = plan.graph
    (reader,) = _x_readers(plan)
    assert _moments_in(reader, g)
    ops = {g[n].name: n for n in range(len(g))}
    m2s = {ops["sum_2.chunk_mean.sum"], ops["sum_2.chunk_m2"], ops["sum_2.scaled1.chunk_m2"]}
    assert m2s <= set(reader.info.nodes)
    k = g[ops["sum_2.chunk_m2"]].shape[0]
    assert 2 <= k < 6000 and 6000 % k == 0


def test_decisions_explain_the_rewrite():
    g = capture(column_stats, (torch.randn(6000, 7),)).graph
    decisions = plan_splits(g, POLICY)
    roles = {g[i].name: d for i, d in decisions.items()}
    assert roles["sum_2"].role == "m2" and "Chan" in roles["sum_2"].reason
    assert roles["sum_2"].k > 1
    # x.mean(0) and the variance's own (moment) mean both become the combined mean
    assert roles["mean"].role == "mean" and roles["sum_1"].role == "mean"
    assert "combined mean" in roles["mean"].reason
    a, b = split_reductions(g, POLICY), split_reductions(g, POLICY)
    assert a.key == b.key
    live = set(a.outputs) | set(a.inputs)  # the replaced statistics are pruned
    for i in range(len(a) - 1, -1, -1):
        if i in live:
            live.update(a[i].inputs)
    assert len(live) == len(a)


def test_other_centres_are_split_as_before():
    # the mean over other dims, a mean of another tensor: plain two-stage sums
    def other_dims(x):
        return ((x - x.mean(1, keepdim=True)) ** 2).sum(0)

    def other_tensor(x, y):
        return ((x - y.mean(0, keepdim=True)) ** 2).sum(0)

    x, y = torch.randn(6000, 7), torch.randn(6000, 7)
    for fn, args in ((other_dims, (x,)), (other_tensor, (x, y))):
        g = capture(fn, args).graph
        decisions = plan_splits(g, POLICY)
        assert not any(d.role for d in decisions.values())
        split = split_reductions(g, POLICY)
        assert any(n.name.endswith(".part") for n in split.nodes)
        assert not any("chunk_m2" in n.name for n in split.nodes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_variance_near_the_dtypes_max_is_rescued_as_unsplit(split_on, dtype):
    """(x - mean)^2 past the dtype's max: Chan's M2 overflows, and the decomposition's rescue
    (the sum of (diff * 2^-k)^2, a scaled M2 of the same chunks) gives eager's finite value."""
    g = torch.Generator().manual_seed(1)
    x = ((torch.rand(3, 4096, generator=g, dtype=torch.float64) * 2 - 1) * 2e19).to(dtype)
    for fn in (lambda x: x.var(-1), lambda x: x.std(-1)):
        assert any(n.name.endswith(".chunk_m2") for n in capture(fn, (x,)).graph.nodes)
        got, eager = autofuse.optimize(fn, (x,))(x), fn(x)
        assert torch.isfinite(got).all() and torch.isfinite(eager).all()
        _close(got, fn(x.double()), dtype, "var / std")


@pytest.fixture
def split_small(monkeypatch):
    """Split on for CPU inputs from 64 reduced elements: a variance row of 512 or more is long
    (``SplitPolicy.long_row``), cut in chunks of 128..256."""
    from tests.conftest import _settings_with

    yield from _settings_with(
        monkeypatch, AUTOFUSE_SPLIT_REDUCTIONS="1", AUTOFUSE_SPLIT_MIN_RNUMEL="64"
    )


def group_norm2(x):
    return F.group_norm(x, 2)


LONG_ROWS = [  # rows that fill the 132 SMs (no split for parallelism), each long
    (group_norm2, (66, 4, 16, 16)),  # 132 groups of 512
    (bn_train, (4, 140, 16, 16)),  # 140 channels of 1024: N (4) cut
    (bn_stats, (2, 133, 24, 24)),  # 133 channels of 1152: the plane cut
]


@pytest.mark.parametrize(
    "fn,shape", LONG_ROWS, ids=[f"{c[0].__name__}-{c[1][1]}" for c in LONG_ROWS]
)
def test_long_variance_rows_are_cut_for_the_cache(split_small, fn, shape):
    """A variance whose rows fill the GPU is still cut when each row is long: unsplit, its
    kernel walks every row four times (maximum, sum, squares, output), each re-read from
    memory once the rows in flight outgrow the cache."""
    x = _large(shape, torch.float32)
    m2 = [n for n in capture(fn, (x,)).graph.nodes if n.name == "sum_2.chunk_m2"]
    rows = shape[0] * 2 if fn is group_norm2 else shape[1]
    k = m2[0].shape[-2] if fn is group_norm2 else m2[0].shape[0]
    lo, hi = SplitPolicy(min_rnumel=64).variance_chunk
    assert k > 1 and lo <= x.numel() // rows // k <= 4 * hi
    _close(autofuse.optimize(fn, (x,))(x), fn(x.double()), torch.float32, fn.__name__)
    got = torch.compile(fn, backend="autofuse")(x)
    _close(got, fn(x.double()), torch.float32, fn.__name__ + " (backend)")


def test_long_rows_decision_says_why():
    x = torch.randn(66, 4, 16, 16)
    g = capture(group_norm2, (x,)).graph
    dec = {g[i].name: d for i, d in plan_splits(g, SplitPolicy(min_rnumel=64)).items()}
    assert dec["sum_2"].role == "m2" and "re-read from cache" in dec["sum_2"].reason
    assert dec["sum_2"].k == 2 and dec["sum_1"].role == "mean"


def test_batch_norm_cut_along_n_for_whole_planes():
    """BatchNorm's (N, H, W) rows are cut along N where that gives chunks of the wanted size:
    each chunk is whole planes, contiguous in memory (not N rows of a plane's slice)."""
    x = torch.randn(64, 140, 12, 12)
    g = capture(bn_stats, (x,)).graph
    dec = {g[i].name: d for i, d in plan_splits(g, SplitPolicy(min_rnumel=64)).items()}
    assert dec["sum_2"].dim == 0 and dec["sum_2"].last == 0
    assert dec["sum_2"].k in (32, 64)  # 144 x 2 or 144 elements a chunk


def test_short_variance_rows_stay_whole():
    """Rows that fill the GPU and are short (one kernel keeps them in cache) are not split."""
    x = torch.randn(66, 4, 8, 8)
    g = capture(group_norm2, (x,)).graph
    assert all(d.k == 1 for d in plan_splits(g, SplitPolicy(min_rnumel=64)).values())


def test_training_group_norm_with_long_rows(split_small):
    m = torch.nn.GroupNorm(2, 4)
    x = _large((66, 4, 16, 16), torch.float32).requires_grad_()
    ref = copy.deepcopy(m).double()(x.double())
    ref.sum().backward()
    ref_grad, x.grad = x.grad.clone(), None
    out = torch.compile(m, backend="autofuse")(x)
    out.sum().backward()
    _close(out.detach(), ref.detach(), torch.float32, "group_norm forward")
    assert torch.allclose(x.grad, ref_grad, atol=1e-3)
