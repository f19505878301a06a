"""Split reductions (``ir/split.py``): a long reduction with few outputs runs as two reductions,
a (k, ...) partial per chunk then one over k, and still equals eager.

The pipeline splits by default only for CUDA inputs; these tests turn it on for the interpreter
(``AUTOFUSE_SPLIT_REDUCTIONS=1``) with a low threshold (``AUTOFUSE_SPLIT_MIN_RNUMEL=1024``) so
small shapes such as (5000, 7) split."""

import pytest
import torch

import autofuse
from autofuse import settings as af_settings
from autofuse.capture.trace import capture
from autofuse.ir.split import SplitPolicy, plan_splits, split_reductions
from autofuse.partition.partitioner import Partitioner

from .helpers import assert_close

POLICY = SplitPolicy(min_rnumel=1024)


def column_stats(x):
    return x.mean(dim=0), x.var(dim=0, unbiased=False)


def shifted_stats(x):
    """Column mean and sum of squares around a constant: no variance (the centre is not x's
    mean), so both sums split as plain reductions."""
    d = x - 3.0
    return x.mean(dim=0), (d * d).sum(dim=0) / 5000.0


def global_avg_pool(x):
    return torch.flatten(x.mean(dim=(2, 3), keepdim=True), 1)


def _parts(graph):
    """(first stage, second stage) reduction node pairs of a split graph."""
    out = []
    for i, n in enumerate(graph.nodes):
        if n.kind == "reduction" and n.name.endswith(".part"):
            users = [u for u in graph.compute_users[i] if graph[u].kind == "reduction"]
            assert len(users) == 1, f"{n.name}: one second stage expected, got {users}"
            out.append((i, users[0]))
    return out


def _check(fn, x, dtype):
    out = autofuse.optimize(fn, (x,))(x)
    ref = fn(x.float()) if dtype != torch.float32 else fn(x)
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    for k, (o, r) in enumerate(zip(outs, refs)):
        assert o.dtype == x.dtype or not o.is_floating_point()
        assert_close(o.float(), r.float(), dtype, f"output {k}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_column_sums_split_in_two_stages_and_equal_eager(split_on, dtype):
    x = torch.randn(5000, 7).to(dtype) + 3.0
    g = capture(shifted_stats, (x,)).graph
    parts = _parts(g)
    assert len(parts) == 2  # the mean and the sum of squares
    for first, _second in parts:
        assert g[g[first].inputs[0]].op == "reshape"  # (k, R / k, 7): a view, no copy
        k = g[first].shape[0]
        assert g[first].shape == (k, 7) and 2 <= k < 5000 and 5000 % k == 0
        assert g[first].dtype == "float32"  # 16-bit partials are kept in float32
    _check(shifted_stats, x, dtype)


def test_split_stages_fuse_with_prologue_and_epilogue(split_on):
    x = torch.randn(5000, 7)
    g = capture(shifted_stats, (x,)).graph
    groups = Partitioner(g).greedy().groups
    where = {n: grp for grp in groups for n in grp}
    ops = {g[n].name: n for n in range(len(g))}
    # the (x - 3)^2 runs in its first stage's kernel, its division by N in the second's
    assert {ops["sub"], ops["mul"], ops["sum_1.part"]} <= where[ops["sum_1.part"]]
    assert ops["div"] in where[ops["sum_1"]]
    # the mean's first stage and the sum's read x in one kernel
    assert ops["mean.part"] in where[ops["sum_1.part"]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_full_sum(split_on, dtype):
    x = torch.randn(5000, 7).to(dtype)
    g = capture(lambda t: t.sum(), (x,)).graph
    ((first, second),) = _parts(g)
    assert g[second].shape == () and g[first].shape[0] >= 2
    _check(lambda t: t.sum(), x, dtype)


def test_amax_over_dim0(split_on):
    x = torch.randn(5000, 7)
    x[1234, 3] = 100.0
    fn = lambda t: t.amax(dim=0)  # noqa: E731
    assert len(_parts(capture(fn, (x,)).graph)) == 1
    _check(fn, x, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_global_avg_pool_over_hw(split_on, dtype):
    x = torch.randn(2, 3, 64, 64).to(dtype)
    g = capture(global_avg_pool, (x,)).graph
    ((first, second),) = _parts(g)
    # (H, W) merged and cut in k: (2, 3, k) partials, viewed (2, 3, k, 1) for the second stage
    k = g[first].shape[-1]
    assert g[first].shape == (2, 3, k) and (64 * 64) % k == 0
    assert g[g[second].inputs[0]].shape == (2, 3, k, 1)
    _check(global_avg_pool, x, dtype)


def test_non_adjacent_dims_cut_the_first(split_on):
    x = torch.randn(4096, 3, 2)
    fn = lambda t: t.sum(dim=(0, 2))  # noqa: E731
    g = capture(fn, (x,)).graph
    ((first, second),) = _parts(g)
    assert g[second].shape == (3,)
    _check(fn, x, torch.float32)


def test_prime_extent_is_left_alone(split_on):
    x = torch.randn(4999, 7)  # 4999 is prime: no view cuts it in equal chunks
    g0 = capture(column_stats, (x,)).graph
    assert not _parts(g0)
    decisions = plan_splits(capture(lambda t: t.sum(0), (x,)).graph, POLICY)
    (dec,) = decisions.values()
    assert dec.k == 1 and "no divisor" in dec.reason
    _check(column_stats, x, torch.float32)


def test_enough_outputs_are_not_split(split_on):
    x = torch.randn(300, 5000)  # 300 row sums of 5000: enough programs already
    g = capture(lambda t: t.sum(1), (x,)).graph
    assert not _parts(g)
    (dec,) = plan_splits(g, POLICY).values()
    assert dec.k == 1 and "fill" in dec.reason
    short = capture(lambda t: t.sum(0), (torch.randn(500, 7),)).graph
    assert split_reductions(short, POLICY) is short  # 500 rows: under min_rnumel


def test_inner_reduction_with_a_row_per_sm_is_not_split():
    # group_norm's statistics on the H200: 256 groups of 65536 (8 x 32 groups); one kernel
    # beat the split (the split wrote the groups' float32 inputs out between its stages)
    policy = SplitPolicy(num_sm=132)
    assert policy.wanted_k(65536, 256, inner=True)[0] == 1
    assert policy.wanted_k(65536, 132, inner=True)[0] == 1
    assert policy.wanted_k(65536, 64, inner=True)[0] > 1  # half the SMs idle: split


def test_default_splits_only_for_cuda_inputs(monkeypatch):
    monkeypatch.delenv("AUTOFUSE_SPLIT_REDUCTIONS", raising=False)
    monkeypatch.setenv("AUTOFUSE_SPLIT_MIN_RNUMEL", "1024")
    af_settings.reload_settings()
    try:
        g = capture(lambda t: t.sum(0), (torch.randn(5000, 7),)).graph
        assert not _parts(g)  # CPU inputs: the interpreter keeps one reduction
    finally:
        monkeypatch.undo()
        af_settings.reload_settings()


def test_pass_is_deterministic_and_readable():
    g = capture(column_stats, (torch.randn(5000, 7),)).graph
    a, b = split_reductions(g, POLICY), split_reductions(g, POLICY)
    assert a.key == b.key and a.key != g.key
    names = [n.name for n in a.nodes]
    # the variance's chunk statistics and combine (tests/test_split_variance.py)
    assert {"sum_2.chunks", "sum_2.chunk_mean", "sum_2.chunk_m2", "sum_2.m2"} <= set(names)
    assert [a[o].shape for o in a.outputs] == [g[o].shape for o in g.outputs]
