"""cumsum / cumprod (the ``scan`` kind: tl.associative_scan over a row held in one block) and
argmax / argmin (a (value, index) reduction: the first max, a NaN winning) through the
interpreter, fused with their neighbours, with no eager step, equal to eager."""

import random

import pytest
import torch

from autofuse.capture.trace import capture
from autofuse.kernels import config_space, default_config
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import build_plan, execute

from .helpers import assert_close, check_partitions

ROW_OPS = {"cumsum", "cumprod", "argmax", "argmin"}


def _special(x: torch.Tensor) -> torch.Tensor:
    """Rows with ties, NaN, -inf / inf and one all-equal row (a float tensor of >= 5 rows)."""
    x = x.clone()
    x[0, 3] = x[0, 20] = x[0].max() + 1  # a tie for the max: the first index wins
    x[1, 7] = x[1, 30] = float("nan")  # the first NaN wins argmax and argmin
    x[2] = float("-inf")
    x[2, 11] = x[2, 12] = float("inf")
    x[3] = 0.5  # all equal
    x[4, 0] = float("-inf")
    return x


def run_plan(fn, args, n_configs=3, seed=0, looped=False, fused=None):
    """The greedy plan of ``fn`` under its default configs and ``n_configs - 1`` sampled ones
    (and, with ``looped``, every reduction group's first looped config): no row op runs in
    eager, and every output equals eager's (exact for integer outputs)."""
    graph = capture(fn, args).graph
    assert ROW_OPS & {n.op for n in graph.nodes}, "no scan / arg reduction was captured"
    space = Partitioner(graph)
    part = space.greedy()
    infos = [space.check(g) for g in part.groups]
    if fused is not None:  # the ops that must share one kernel
        assert any(fused <= {graph[i].op for i in g} for g in part.groups), part.groups
    rng = random.Random(seed)
    trials = [[default_config(i, graph) for i in infos]]
    trials += [[rng.choice(config_space(i, graph)) for i in infos] for _ in range(n_configs - 1)]
    if looped:
        trials.append(
            [
                next((c for c in config_space(i, graph) if i.reduces and c.RBLOCK < i.rnumel),
                     default_config(i, graph))
                for i in infos
            ]
        )  # fmt: skip
    refs = fn(*args)
    refs = refs if isinstance(refs, tuple) else (refs,)
    flat = [a for a in args if isinstance(a, torch.Tensor)]
    for cfgs in trials:
        plan = build_plan(graph, part.groups, cfgs)
        eager = [graph[s.node].op for s in plan.fallbacks]
        assert not ROW_OPS & set(eager), f"row ops in eager: {plan.fallbacks}"
        outs = execute(plan, flat)
        for k, (o, r) in enumerate(zip(outs, refs)):
            assert o.dtype == r.dtype, f"out {k}: {o.dtype} != {r.dtype}"
            assert_close(o, r, r.dtype, f"{fn.__name__} out {k} under {cfgs}")
    return graph, plan


def scans(x):
    return (
        torch.cumsum(x, -1), torch.cumprod(x, 0), torch.cumsum(x, 0), x.cumprod(-1),
        torch.cumsum(x, -1, dtype=torch.float64),
    )  # fmt: skip


def int_scans(x):
    return torch.cumsum(x, -1), torch.cumprod(x, 0), (x > 0).cumsum(1), x.int().cumsum(-1)


def args_(x):
    return (
        x.argmax(-1), x.argmin(-1), x.argmax(0, keepdim=True), x.argmin(1, keepdim=True),
        x.argmax(), x.argmin(), x.t().argmax(-1),
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cumsum_cumprod_floats(dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(5, 37, generator=g) * 0.4 + 0.8).to(dtype)  # products stay in range
    x[1, 5] = -1.0
    graph, plan = run_plan(scans, (x,))
    assert all(k.name.startswith("autofuse_scan_") for k in plan.kernels)
    assert all(k.config.RBLOCK >= k.info.rnumel for k in plan.kernels)  # one block per row


def test_cumsum_cumprod_integers():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-3, 4, (5, 37), generator=g)
    x[:, 1::3] = 1  # cumprod along 37 stays within int64 (|x| <= 3 on 25 of them)
    out = run_plan(int_scans, (x,))[1]
    assert all(o.dtype == torch.int64 for o in execute(out, [x]))


def test_scan_specials_nan_inf():
    x = _special(torch.randn(5, 37, generator=torch.Generator().manual_seed(2)))
    run_plan(lambda x: (x.cumsum(-1), x.cumprod(-1)), (x,), n_configs=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_argmax_argmin_floats(dtype):
    x = _special(torch.randn(5, 37, generator=torch.Generator().manual_seed(3))).to(dtype)
    run_plan(args_, (x,), looped=True)


def test_argmax_argmin_int64_ties():
    x = torch.randint(0, 3, (5, 37), generator=torch.Generator().manual_seed(4))
    x[2] = torch.iinfo(torch.int64).min  # all equal, to the identity of argmax's masked lanes
    x[3, 30] = torch.iinfo(torch.int64).min
    x[4, 9] = torch.iinfo(torch.int64).max
    run_plan(args_, (x,), looped=True)


def test_argmax_over_every_dim_of_3d():
    x = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(5))
    x[2, 4, 1] = x[1, 0, 6] = 9.0  # a tie across rows: the first flat index wins
    run_plan(lambda x: (x.argmax(), x.argmin(1), x.argmax(keepdim=True)), (x,), looped=True)


def max_min_dim(x):
    v, i = x.max(-1)
    w, j = torch.min(x, 0, keepdim=True)
    return v, i, w, j


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_max_min_with_dim_return_values_and_indices(dtype):
    x = _special(torch.randn(5, 37, generator=torch.Generator().manual_seed(10)))
    x = x if dtype == torch.float32 else torch.randint(-2, 3, (5, 37))
    graph, plan = run_plan(max_min_dim, (x,), n_configs=2, fused={"amax", "argmax"})
    assert not plan.fallbacks
    graph, plan = run_plan(lambda x: x.max(-1)[1] + 1, (x,), n_configs=1)  # the values unread
    assert not plan.fallbacks and "amax" not in {n.op for n in graph.nodes}


def fused_scan(x):
    return torch.cumsum(x.exp(), -1) / x.sum(-1, keepdim=True), x.cumsum(-1).amax(-1)


def fused_arg(x, y):
    return (x * 2).argmax(-1), (x + y).argmin(-1, keepdim=True) + 1, x.argmax(-1) == y.argmax(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_with_neighbours(dtype):
    g = torch.Generator().manual_seed(6)
    x, y = (torch.randn(5, 37, generator=g).to(dtype) for _ in range(2))
    _, plan = run_plan(fused_scan, (x,), fused={"exp", "cumsum", "sum", "div", "amax"})
    assert len(plan.kernels) == 1
    _, plan = run_plan(fused_arg, (x, y), fused={"mul", "argmax"}, looped=True)
    assert len(plan.kernels) == 1  # every row op of the function in one kernel


def test_every_partition_of_a_fused_scan():
    x = torch.randn(5, 37, generator=torch.Generator().manual_seed(7))
    check_partitions(fused_scan, (x,), configs_per_group=2, max_enumerate=1, sample=4)


def test_long_rows_scan_in_a_looped_kernel():
    # past 32768 elements the row is scanned in chunks with a carry (tests/test_ops_scan_long.py)
    x = torch.randn(2, 40000, generator=torch.Generator().manual_seed(8))
    space = Partitioner(capture(lambda x: x.cumsum(-1), (x,)).graph)
    assert not space.eager, space.eager


def test_no_scan_or_argmax_in_a_gemm_epilogue():
    g = torch.Generator().manual_seed(9)
    a, b = torch.randn(16, 8, generator=g), torch.randn(8, 24, generator=g)
    graph, plan = run_plan(lambda a, b: ((a @ b).cumsum(-1), (a @ b).argmax(-1)), (a, b), 1)
    assert not plan.fallbacks  # torch.mm, then the row ops
    assert [s.implementation for s in plan.library] == ["cublas.mm"]
