"""The lean host path of a plan call (one guard check, no routing, no pytree for flat calls)
and ``cuda_graph=True`` (its replay needs CUDA: tests/test_gpu.py territory; here the note)."""

# ruff: noqa: E402

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import warnings

import pytest

import autofuse
from autofuse.frontend import routing
from autofuse.plan import runtime
from autofuse.plan.graphs import CudaGraphNote

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


def two(x, w):
    y = torch.sigmoid(x * w + 1.0)
    return y.sum(-1), y


def _args():
    return tuple(torch.randn(4, 8, device=DEVICE) for _ in range(2))


def test_a_plain_call_checks_once_and_skips_routing(monkeypatch):
    args = _args()
    opt = autofuse.optimize(two, args)
    want = two(*args)

    def boom(*a, **k):
        raise AssertionError("the fast path must not get here")

    monkeypatch.setattr(routing, "route", boom)
    monkeypatch.setattr(runtime, "check_inputs", boom)
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            got = opt(*args)
        assert type(got) is tuple and len(got) == 2
        for g, w in zip(got, want):
            assert torch.allclose(g, w, atol=1e-5)
    monkeypatch.undo()
    x = args[0].clone().requires_grad_()
    got = opt(x, args[1])  # requires grad in grad mode: the backend path, as before
    assert got[0].requires_grad
    with pytest.raises(autofuse.InputError, match="input 0"):
        opt(args[0][:2], args[1])  # a mismatch still gets the named error


def test_cuda_graph_is_off_with_one_note_under_the_interpreter():
    if DEVICE == "cuda":
        pytest.skip("on CUDA the graph is captured (tests/test_gpu.py)")
    args = _args()
    opt = autofuse.optimize(two, args, cuda_graph=True)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        outs = [opt(*args) for _ in range(3)]
    notes = [r for r in rec if issubclass(r.category, CudaGraphNote)]
    assert len(notes) == 1 and "interpreter" in str(notes[0].message)
    for got in outs:
        assert all(torch.allclose(g, w, atol=1e-5) for g, w in zip(got, two(*args)))
    assert opt.graphs.off and opt.graphs.graph is None


@pytest.mark.gpu
def test_cuda_graph_replays_the_plan_on_cuda():
    args = tuple(torch.randn(64, 128, device="cuda") for _ in range(2))
    opt = autofuse.optimize(two, args, cuda_graph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CudaGraphNote)
        first = opt(*args)
        kept = [t.clone() for t in first]
        for _ in range(3):
            xs = tuple(torch.randn_like(a) for a in args)
            got = opt(*xs)
            for g, w in zip(got, two(*xs)):
                torch.testing.assert_close(g, w)
    assert opt.graphs.graph is not None and opt.graphs.off is None
    assert opt.graphs.copied is not None  # other tensors: copied into the second graph's inputs
    for a, b in zip(first, kept):  # results are copies: the next replay does not change them
        assert torch.equal(a, b)
    for _ in range(2):  # the first call's own tensors, refilled in place: replay, no copy
        for a in args:
            a.normal_()
        for g, w in zip(opt(*args), two(*args)):
            torch.testing.assert_close(g, w)
    assert opt.graphs.graph.holds(args)
