"""Regression tests for bugs found in review: each one returned wrong values before its fix."""

import pytest
import torch

import autofuse
from autofuse.capture.trace import capture
from autofuse.kernels import KernelConfig
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import build_plan, execute

NAN = float("nan")


def _same(out, ref):
    out, ref = (
        (out if isinstance(out, tuple) else (out,)),
        (ref if isinstance(ref, tuple) else (ref,)),
    )
    for o, r in zip(out, ref):
        if r.is_floating_point():
            torch.testing.assert_close(o, r, equal_nan=True, atol=1e-5, rtol=1e-5)
        else:
            assert torch.equal(o, r), (o, r)


LOOPED = (KernelConfig(1, 4, 1), KernelConfig(2, 16, 1))  # RBLOCK below the row: looped kernels


def _looped(fn, x, configs=LOOPED):
    graph = capture(fn, (x,)).graph
    groups = Partitioner(graph).greedy().groups
    for cfg in configs:
        _same(tuple(execute(build_plan(graph, groups, [cfg] * len(groups)), [x])), fn(x))


def test_two_sums_share_one_running_max():
    def f(a):
        m = a.amax(1, keepdim=True)
        e = torch.exp(a - m)
        return e / e.sum(1, keepdim=True), e.sum(1)

    _looped(f, torch.randn(2, 50))


def test_online_softmax_not_through_a_transpose():
    def f(a):
        m = a.amax(1, keepdim=True)
        return torch.exp(a - m).t().sum(1)

    _looped(f, torch.randn(33, 33))


@pytest.mark.parametrize(
    "fn, x",
    [
        (lambda u: u.amin(1), torch.randint(0, 100, (3, 5), dtype=torch.uint8)),
        (lambda u: u.amax(1), torch.randint(0, 100, (3, 5), dtype=torch.uint8)),
        (lambda b: b.amin(1), torch.ones(3, 5, dtype=torch.bool)),
        (lambda a: (a < a + 1e-12, a == a + 1e-12), torch.ones(4, dtype=torch.float64)),
        (torch.relu, torch.tensor([NAN, 1.0, -1.0])),
        (lambda t: t.clamp(-0.5, 0.5), torch.tensor([NAN, 1.0, -1.0])),
        (lambda t: (t.amax(0), t.amin(0)), torch.tensor([NAN, 1.0, -1.0])),
        (torch.log1p, torch.full((4,), 1e-10)),
        (torch.expm1, torch.full((4,), 1e-10)),
        (torch.round, torch.tensor([8388609.0, 2.5, -2.5, 0.5])),
        (lambda t: torch.floor(t) * 2, torch.arange(-3, 4)),
        (lambda t: t**9 + 1, torch.arange(-3, 4)),
    ],
)
def test_op_semantics_match_torch(fn, x):
    _same(autofuse.optimize(fn, (x,))(x), fn(x))


def test_comparisons_promote_like_torch():
    def f(a, b):
        return a < b, a == b

    a, b = torch.zeros(4, dtype=torch.int32), torch.full((4,), 2**33)
    _same(autofuse.optimize(f, (a, b))(a, b), f(a, b))
    m, i = torch.tensor([True, False, True, True]), torch.tensor([2, 0, 1, 3])
    _same(autofuse.optimize(f, (m, i))(m, i), f(m, i))


def test_unlowerable_op_runs_in_eager_with_a_reason():
    x = torch.randn(7)
    opt = autofuse.optimize(lambda t: torch.atan2(t, t + 1) + 1, (x,))
    assert any("aten.atan2" in s.reason for s in opt.plan.fallbacks)
    x = torch.arange(-3, 4)  # an integer power is generated (test_eager_semantics: wrap-around)
    opt = autofuse.optimize(lambda t: t**9 + 1, (x,))
    assert not opt.plan.fallbacks and torch.equal(opt(x), x**9 + 1)


def test_kernel_that_cannot_be_built_falls_back_to_eager_with_one_warning():
    import dataclasses
    import warnings

    from autofuse.plan.runtime import KernelBuildWarning, KernelStep

    from .workloads import cases

    fn, args = cases()["softmax"]
    plan = autofuse.optimize(fn, args).plan
    k = plan.kernels[0]
    bad = dataclasses.replace(k, source=k.source.replace("tl.load(", "tl.no_such_op(", 1))
    broken = dataclasses.replace(plan, steps=(KernelStep(bad),))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", KernelBuildWarning)
        outs = [execute(broken, list(args))[0] for _ in range(2)]
    assert [w.category for w in seen].count(KernelBuildWarning) == 1
    assert "could not be built" in str(seen[0].message)
    for o in outs:
        _same(o, fn(*args))
