"""In-place writes into a view whose elements share memory (``capture/overlap.py``).

``x.expand(2, 2).masked_fill_(m, 0)`` writes the one element of ``x`` four times in eager;
functionalizing it (AOTAutograd, ``make_fx``'s functional pass) scatters four values back into
it and gave 45.9 or -15.3 where eager gives 0 (the fuzzer's graph 981). Such a graph runs as
captured, in eager, with a warning, through both front ends; a write into a view that shares
no memory is compiled as before."""

from __future__ import annotations

import warnings

import pytest
import torch

from autofuse.capture.overlap import shares_memory
from autofuse.frontend import dynamo

from .helpers import FRONT_ENDS, settings_env, through


def _masked_fill_expanded(x0):
    v = x0.expand((2, 2))
    return (v.type_as(v).masked_fill_(v > 0, 0.0), v)[1]


def _index_put_into_expanded(x0):
    v = x0[:, None].expand(4, 3)
    v[v < 0] = 0.5  # index_put_, which eager takes on an expand (deprecated, as masked_fill_)
    return v * 2


def _eager_and_ours(fn, args, front):
    compiled = through(front, fn, [a.clone() for a in args])
    mine = [a.clone() for a in args]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ours = compiled(*mine)
    theirs_in = [a.clone() for a in args]
    theirs = fn(*theirs_in)
    return ours, theirs, mine, theirs_in, seen


@pytest.mark.parametrize("front", FRONT_ENDS)
@pytest.mark.parametrize("value", [5.1, -2.0])
def test_masked_fill_into_an_expand_is_eagers(front, value):
    args = [torch.tensor([value])]
    ours, theirs, mine, theirs_in, _ = _eager_and_ours(_masked_fill_expanded, args, front)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(mine, theirs_in)  # the input written as eager writes it


@pytest.mark.parametrize("front", FRONT_ENDS)
@pytest.mark.parametrize("fn", [_index_put_into_expanded])
def test_other_in_place_ops_into_an_expand_are_eagers(front, fn):
    args = [torch.tensor([-1.0, 2.0, -3.0, 4.0])]
    ours, theirs, mine, theirs_in, _ = _eager_and_ours(fn, args, front)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(mine, theirs_in)


def test_the_backend_says_why_it_runs_the_graph_as_captured():
    torch._dynamo.reset()
    before = dynamo.compiled_count()
    with pytest.warns(RuntimeWarning, match="masked_fill_ writes into a view whose elements"):
        torch.compile(_masked_fill_expanded, backend="autofuse")(torch.tensor([3.0]))
    assert not dynamo.compiled_since(before)  # no plan: the graph ran as captured


def test_strict_mode_raises(monkeypatch):
    with settings_env(monkeypatch, AUTOFUSE_STRICT="1"):
        torch._dynamo.reset()
        with pytest.raises(Exception, match="share memory"):
            torch.compile(_masked_fill_expanded, backend="autofuse")(torch.tensor([3.0]))


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_a_write_into_a_view_that_shares_no_memory_is_compiled(front):
    def fn(x):
        x[:, 1:].mul_(2)
        return x.sin()

    args = [torch.randn(3, 4)]
    ours, theirs, mine, theirs_in, seen = _eager_and_ours(fn, args, front)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(mine, theirs_in)
    assert not [w for w in seen if "share memory" in str(w.message)]


def test_shares_memory():
    x = torch.randn(3)
    assert shares_memory(x.expand(2, 3))
    assert shares_memory(x[:, None].expand(3, 5))
    assert not shares_memory(x)
    assert not shares_memory(x.expand(1, 3))  # a size-1 dim of stride 0 holds one element
    assert not shares_memory(torch.randn(4, 4).t())
    assert not shares_memory(3.0)
