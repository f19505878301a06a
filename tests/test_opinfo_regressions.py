"""Regression tests for what the OpInfo sweep (``experiments/correctness/opinfo_sweep.py``) found."""

from __future__ import annotations

import pytest
import torch


def test_an_op_with_ordered_side_effects_runs_as_traced(fresh_dynamo):
    """linalg.inv's error check is threaded through effect tokens (``with_effects``), which are
    None at run time: the forward graph runs as traced, results and errors as eager's (it failed
    in capture), and the backward is still planned."""
    from experiments.correctness.opinfo_check import graph_mark, graphs_since

    inv = torch.compile(torch.linalg.inv, backend="autofuse")
    x = torch.randn(4, 4) + 4 * torch.eye(4)
    torch.testing.assert_close(inv(x), torch.linalg.inv(x))
    with pytest.raises(torch.linalg.LinAlgError):
        inv(torch.zeros(4, 4))
    first = graph_mark()  # compiled_graphs() keeps the last 512: a count stops moving
    a = x.clone().requires_grad_()
    inv(a).sum().backward()
    b = x.clone().requires_grad_()
    torch.linalg.inv(b).sum().backward()
    torch.testing.assert_close(a.grad, b.grad)
    assert [g.kind for g in graphs_since(first)] == ["backward"]
