"""Stale results from a module: ``optimize(model)`` builds its plan without moving buffers
(BatchNorm statistics as eager leaves them) and notices what torch.compile's guards notice (an
attribute, a replaced submodule, ``GELU.approximate``, a forward hook, one submodule switched to
train, a parameter set to None): such calls compute what eager computes. Tiny shapes through
the interpreter on CPU."""

# ruff: noqa: E402

import os

import torch

if not torch.cuda.is_available():  # before triton is imported: kernels run in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import copy
import warnings

import pytest

import autofuse
from autofuse.capture.state import ModuleState
from autofuse.routing import ModuleChangedWarning


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.bn = torch.nn.BatchNorm1d(6)
        self.act = torch.nn.GELU()
        self.scale = 2.0

    def forward(self, x):
        return self.act(self.bn(self.lin(x))) * self.scale


def _net():
    torch.manual_seed(0)
    m = Net()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2)
    return m


X = (torch.randn(4, 6),)


def test_optimize_moves_no_batchnorm_statistics():
    m = _net().train()
    ref = copy.deepcopy(m)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", ModuleChangedWarning)
        fast = autofuse.optimize(m, X)
        for k, v in ref.state_dict().items():
            assert torch.equal(m.state_dict()[k], v), k  # untouched by building the plan
        out, want = fast(*X), ref(*X)  # one call moves them once, as eager
    torch.testing.assert_close(out, want)
    assert m.bn.num_batches_tracked.item() == ref.bn.num_batches_tracked.item() == 1
    torch.testing.assert_close(m.bn.running_mean, ref.bn.running_mean)
    torch.testing.assert_close(m.bn.running_var, ref.bn.running_var)


CHANGES = {
    "attribute": lambda m: setattr(m, "scale", 3.0),
    "replaced submodule": lambda m: setattr(m, "act", torch.nn.ReLU()),
    "GELU.approximate": lambda m: setattr(m.act, "approximate", "tanh"),
    "forward hook": lambda m: m.act.register_forward_hook(lambda mod, a, out: out + 1.0),
    "submodule to train": lambda m: m.bn.train(),
    "bias None": lambda m: setattr(m.lin, "bias", None),
    "new weight": lambda m: setattr(m.lin, "weight", torch.nn.Parameter(torch.randn(6, 6))),
    "buffer rebound": lambda m: setattr(m.bn, "running_mean", torch.zeros(6)),
    "whole module to train": lambda m: m.train(),
}


def test_the_module_state_names_each_change():
    for how, change in CHANGES.items():
        m = _net().eval()
        state = ModuleState(m)
        assert state.changed() is None and state.unchanged() and state.check() is None
        change(m)
        assert state.changed() is not None, how
        assert not state.unchanged(), how  # the per-call identity check sees it too
        assert state.check() is not None, how
        assert not state.unchanged(), how  # and keeps seeing it (no new watch taken)


def test_a_module_call_checks_in_c_and_follows_its_parameters():
    """Calls after the first take the C-level checks (module identities, input guard) with
    the module's own parameters; a value rebound to an equal one is no change (no warning, a
    new watch); parameters written in place or through ``.data`` are read as they are now."""
    from autofuse.plan.runtime import input_guard

    m = _net().eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", ModuleChangedWarning)
        fast = autofuse.optimize(m, X)
        torch.testing.assert_close(fast(*X), m(*X))
        state = fast.module_state
        assert input_guard(fast.plan).exact((*X, *state.tensors))
        m.scale = float("2.0")  # another float object, the same value
        assert not state.unchanged() and state.check() is None and state.unchanged()
        m.lin.weight.add_(0.5)
        torch.testing.assert_close(fast(*X), m(*X))
        m.lin.weight.data = torch.randn(6, 6)  # the same Parameter, new storage
        torch.testing.assert_close(fast(*X), m(*X))
    for p in m.parameters():  # grad mode on, nothing requires grad: the plan runs
        p.requires_grad_(False)
    out = fast(*X)
    assert not out.requires_grad
    torch.testing.assert_close(out, m(*X))


def test_a_changed_module_computes_what_eager_computes():
    for how, change in CHANGES.items():
        m = _net().eval()
        with torch.no_grad():
            fast = autofuse.optimize(m, X)
            torch.testing.assert_close(fast(*X), m(*X))
            change(m)
            with pytest.warns(ModuleChangedWarning, match="changed since its plan was captured"):
                out = fast(*X)
            torch.testing.assert_close(out, m(*X), msg=how)


def _writes_a(a, b):
    a.add_(1)
    return a * b


def test_aliased_inputs_written_in_place_as_eager(tmp_path):
    from autofuse import cache

    args = (torch.ones(3), torch.ones(3))
    fast = autofuse.optimize(_writes_a, args, cache_dir=tmp_path)
    for opt in (fast, cache.load(_writes_a, args, cache_dir=tmp_path, retrace=True)):
        z, e = torch.ones(3), torch.ones(3)
        out, want = opt(z, z), _writes_a(e, e)
        assert torch.equal(out, want) and torch.equal(z, e)  # 4.0 and 2.0, as eager
        a, b = torch.ones(3), torch.ones(3)
        assert torch.equal(opt(a, b), torch.full((3,), 2.0)) and torch.equal(a, b + 1)
    opt = autofuse.runner.OptimizedFunction(fast.captured, fast.plan)  # no function to run
    with pytest.raises(autofuse.plan.InputError, match="share memory"):
        z = torch.ones(3)
        opt(z, z)


def test_negative_bit_and_conjugate_views_are_read_as_their_values():
    c = torch.randn(3, 2, dtype=torch.complex64)
    for x in (torch._neg_view(torch.randn(3, 2)), c.conj().imag):
        assert x.is_neg()
        example = torch.randn(3, 2, dtype=torch.complex64).imag if x.stride()[1] == 2 else \
            torch.randn(3, 2)  # fmt: skip
        fast = autofuse.optimize(lambda x: x * 2.0 + 1.0, (example,))
        torch.testing.assert_close(fast(x), x * 2.0 + 1.0)
        with torch.no_grad():
            torch.testing.assert_close(fast(x), x * 2.0 + 1.0)
