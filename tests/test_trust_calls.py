"""Stale results: ``load``'s call key sees what the function reads (module attributes, helpers
reached through modules, globals of a module's forward and of its helpers, constants several
calls deep, hooks) or refuses to key it (captured on every load, one note); a call record is
bound to its function's key. Tiny shapes through the interpreter on CPU."""

# ruff: noqa: E402

import os

import torch

if not torch.cuda.is_available():  # before triton is imported: kernels run in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import sys
import types
import warnings

import pytest

from autofuse import cache
from autofuse.cache.calls import UnkeyedCallNote, call_key
from autofuse.capture.trace import capture
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import build_plan

X = (torch.randn(4, 8),)
SCALE = 2.0


@pytest.fixture
def cfgmod(monkeypatch):
    mod = types.ModuleType("af_test_cfg")
    mod.scale = 2.0
    exec("def helper(x):\n    return x * 2.0\n", mod.__dict__)
    monkeypatch.setitem(sys.modules, "af_test_cfg", mod)
    monkeypatch.setitem(globals(), "af_test_cfg", mod)
    return mod


def by_attr(x):
    return x * af_test_cfg.scale  # noqa: F821 - the fixture's module


def by_helper(x):
    return af_test_cfg.helper(x) + 1.0  # noqa: F821


def test_a_module_attribute_the_function_reads_is_in_the_key(cfgmod):
    k = call_key(by_attr, X)
    assert k is not None and k == call_key(by_attr, X)
    cfgmod.scale = 3.0
    assert call_key(by_attr, X) != k


def test_a_helper_reached_through_a_module_is_in_the_key(cfgmod):
    k = call_key(by_helper, X)
    exec("def helper(x):\n    return x * 3.0\n", cfgmod.__dict__)  # edited
    assert call_key(by_helper, X) != k


def h5(x):
    return x * 1.5


def h4(x):
    return h5(x)


def h3(x):
    return h4(x)


def h2(x):
    return h3(x)


def h1(x):
    return h2(x)


def deep(x):
    return h1(x)


def test_a_constant_five_calls_deep_is_in_the_key(monkeypatch):
    k = call_key(deep, X)
    assert k is not None
    monkeypatch.setitem(globals(), "h5", lambda x: x * 2.5)
    assert call_key(deep, X) != k


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.act(self.lin(x)) * SCALE

    def act(self, y):
        return torch.tanh(y)


def test_globals_of_a_modules_forward_and_hooks_are_in_the_key(monkeypatch):
    m = Scaled()
    k = call_key(m, X)
    assert k is not None
    monkeypatch.setitem(globals(), "SCALE", 3.0)
    k3 = call_key(m, X)
    assert k3 != k
    h = m.register_forward_hook(lambda mod, args, out: out + 1)
    assert call_key(m, X) not in (k, k3)
    h.remove()
    assert call_key(m, X) == k3
    m.lin.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    assert call_key(m, X) != k3


def test_what_the_key_cannot_see_is_captured_with_one_note(tmp_path, monkeypatch):
    cfg = types.SimpleNamespace(scale=2.0)

    def fn(x):
        return x * cfg.scale

    assert call_key(fn, X) is None
    graph = capture(fn, X)
    plan = build_plan(graph.graph, Partitioner(graph.graph).greedy().groups)
    cache.save_plan(tmp_path, cache.key_for(graph, X), plan, {"function": "fn"})
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for _ in range(2):
            torch.testing.assert_close(cache.load(fn, X, cache_dir=tmp_path, strict=True)(*X),
                                       fn(*X))  # fmt: skip
    notes = [r for r in rec if issubclass(r.category, UnkeyedCallNote)]
    assert len(notes) == 1 and "SimpleNamespace" in str(notes[0].message)
    cfg.scale = 3.0  # captured again: the new constant's graph is another entry
    with pytest.raises(cache.CacheMiss):
        cache.load(fn, X, cache_dir=tmp_path, strict=True)


def test_load_recomputes_after_a_module_attribute_changes(tmp_path, cfgmod):
    from autofuse.api import optimize

    optimize(by_attr, X, cache_dir=tmp_path, trials=1, progress=False)
    fast = cache.load(by_attr, X, cache_dir=tmp_path, strict=True)
    torch.testing.assert_close(fast(*X), X[0] * 2.0)
    cfgmod.scale = 3.0
    with pytest.warns(cache.CacheMissWarning):
        out = cache.load(by_attr, X, cache_dir=tmp_path)(*X)
    torch.testing.assert_close(out, X[0] * 3.0)
