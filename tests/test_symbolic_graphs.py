"""A graph traced once with symbolic sizes, specialized to each call's sizes
(``frontend/symbolic.py``): the fake values it gets at new sizes are those the graph's ops give
when they run again on those sizes, by the traced size expressions or, where those hold a
symbol the inputs do not bind, by running the ops."""

import copy

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from autofuse.frontend import symbolic
from autofuse.frontend.dynamo import backend_decompositions

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py


def f(x, w):
    y = (x.transpose(1, 2) @ w).reshape(x.shape[0], -1)
    return torch.softmax(y, -1)[:, 1:] * x.shape[1]


def _traced(fn, args, again):
    """The ATen graph of ``fn`` traced once at ``args`` with symbolic sizes, and the arguments
    it is called with at the sizes of ``again``."""
    graphs, calls = [], []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return lambda *a: calls.append(list(a)) or gm(*a)

    compiler = aot_autograd(fw_compiler=keep, decompositions=backend_decompositions())
    compiled = torch.compile(fn, backend=compiler, dynamic=True)
    compiled(*args)
    compiled(*again)
    (gm,) = graphs
    return gm, calls[-1]


def _layout(val):
    if isinstance(val, torch.Tensor):
        return (tuple(val.shape), val.stride(), val.dtype)
    if isinstance(val, (list, tuple)):
        return tuple(_layout(v) for v in val)
    return val


@pytest.mark.parametrize("bind", [True, False])
def test_specialized_values_are_those_of_the_ops_at_the_new_sizes(bind, monkeypatch):
    gm, args = _traced(f, (torch.randn(3, 5, 4), torch.randn(5, 6)),
                       (torch.randn(6, 7, 4), torch.randn(7, 6)))  # fmt: skip
    if bind:  # every size from the traced expressions: the ops do not run again
        monkeypatch.setattr(symbolic, "FakeTensorProp", None)
    else:  # no symbol bound: the ops run again
        monkeypatch.setattr(symbolic, "_bindings", lambda graph, fakes: {})
    mode = FakeTensorMode(shape_env=ShapeEnv())
    fakes = symbolic.static_args(args, mode)
    got = symbolic.specialized_copy(gm, fakes)
    want = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    FakeTensorProp(want, mode=mode).propagate_dont_convert_inputs(*fakes)
    for a, b in zip(got.graph.nodes, want.graph.nodes):
        if a.op != "output":  # the traced output holds no value
            assert _layout(a.meta.get("val")) == _layout(b.meta.get("val")), a.name
    assert got(*args)[0].shape == (6, 6 * 4 - 1)
