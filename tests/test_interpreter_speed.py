"""Row ops that Triton's interpreter runs vectorized: a ``tl.reduce`` or ``tl.associative_scan``
with a combine function of the kernel's own runs there element by element in Python (minutes
for a 1000 x 1000 argmax), so arg reductions and scans use Triton's standard reductions and
``tl.cumsum`` / ``tl.cumprod``. CPU, interpreter, small shapes."""

import pytest
import torch

from autofuse.capture.trace import capture
from autofuse.kernels import config_space, default_config
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import build_plan, execute

aten = torch.ops.aten


def _args(x):
    return aten.argmax(x, 0), aten.argmin(x, 0), aten.argmax(x, 1), aten.argmin(x, 1)


def _scans(x):
    return x.cumsum(0), x.cumsum(1), x.cumprod(1)


def _plans(fn, args):
    """The greedy plan under default configs and under each group's first looped config."""
    g = capture(fn, args).graph
    groups = Partitioner(g).greedy().groups
    plan = build_plan(g, groups)
    infos = [k.info for k in plan.kernels]
    looped = [
        next((c for c in config_space(i, g) if i.reduces and c.RBLOCK < i.rnumel), None)
        or default_config(i, g)
        for i in infos
    ]
    return plan, build_plan(g, [frozenset(i.nodes) for i in infos], configs=looped)


def _duplicates():
    return torch.randint(3, size=(24, 40)).float()


def _nans():
    x = torch.randn(24, 40)
    x[:, 5] = float("nan")
    x[:, 17] = float("nan")
    x[3, :] = float("nan")
    return x


@pytest.mark.parametrize(
    "make", [_duplicates, _nans, lambda: torch.randint(4, size=(24, 40))], ids=["dup", "nan", "int"]
)
def test_argmax_argmin_ties_and_nans_without_custom_combines(make):
    x = make()
    for plan in _plans(_args, (x,)):
        for k in plan.kernels:
            assert "tl.reduce(" not in k.source
        for got, ref in zip(execute(plan, [x]), _args(x)):
            assert torch.equal(got, ref)


def test_scans_without_custom_combines():
    x = torch.rand(8, 300) + 0.5
    for plan in _plans(_scans, (x,)):
        for k in plan.kernels:
            assert "tl.associative_scan(" not in k.source
        for got, ref in zip(execute(plan, [x]), _scans(x)):
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
