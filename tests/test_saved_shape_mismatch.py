"""A backward graph whose saved tensor has another shape at run time than its trace gave it
(a real kernel that disagrees with its meta function: ``embedding_bag``'s ``offset2bag`` is
empty in bfloat16 on CPU, traced with one entry per index; OpInfo's all-samples sweep) runs as
captured, in eager, with one warning, never an error eager would not raise."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F


def bag(weight, idx, offsets, psw):
    return F.embedding_bag(idx, weight, offsets, mode="sum", per_sample_weights=psw)


def test_embedding_bag_bf16_backward_through_the_backend_matches_eager():
    torch.manual_seed(0)
    weight = torch.randn(10, 5, dtype=torch.bfloat16)
    idx, offsets = torch.tensor([1, 4, 2, 9, 0]), torch.tensor([0, 3])
    psw = torch.randn(5, dtype=torch.bfloat16)

    def step(fn):
        w, p = weight.clone().requires_grad_(), psw.clone().requires_grad_()
        out = fn(w, idx, offsets, p)
        out.sum().backward()
        return out, w.grad, p.grad

    ref = step(bag)
    torch._dynamo.reset()
    compiled = torch.compile(bag, backend="autofuse")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = step(compiled)
        again = step(compiled)
    for g, a, r in zip(got, again, ref):
        torch.testing.assert_close(g, r)
        torch.testing.assert_close(a, r)
    notes = [str(w.message) for w in seen if "runs the graph as captured" in str(w.message)]
    assert len(notes) == 1 and "traced [5]" in notes[0], notes
