"""Model code written the way people write it: each case once raised an exception eager does not
raise (or returned a stale result). CPU, interpreter, small shapes."""

import torch
import torch.nn.functional as F

from autofuse.capture.trace import capture
from autofuse.partition.partitioner import CYCLE_REASON, Partitioner
from autofuse.plan.runtime import build_plan, execute


def _crossed(x, y):
    a1 = x * 2
    b1 = a1 + y
    b2 = y * 3
    a2 = x + b2
    return b1, a2


def test_convex_groups_that_need_each_other_are_split():
    """{x*2, x+b2} and {a1+y, y*3} are each convex (both fused as readers of one tensor), but
    each reads the other's result: the second merge is refused with its reason."""
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    g = capture(_crossed, (x, y)).graph
    space = Partitioner(g)
    part = space.from_decisions({e.name: e.kind == "horizontal" for e in space.edges})
    assert space.acyclic(part.groups)
    assert any(r.reason == CYCLE_REASON for r in part.refusals)
    plan = build_plan(g, part.groups)
    for got, ref in zip(execute(plan, [x, y]), _crossed(x, y)):
        torch.testing.assert_close(got, ref)
    assert all(space.acyclic(p.groups) for p in space.enumerate())


def _roberta_embed(ids, wemb, pemb, w, b):
    mask = ids.ne(1).int()
    pos = (torch.cumsum(mask, 1).type_as(mask) * mask).long() + 1
    e = F.embedding(ids, wemb, padding_idx=1) + F.embedding(pos, pemb)
    return F.layer_norm(e, (8,), w, b), mask


def test_roberta_position_ids_training_forward(fresh_dynamo):
    """One mask feeds a cumsum (the position ids) and the returned tensor, and the embedding's
    backward reads it too: the greedy plan used to hold two convex groups in a cycle."""
    ids = torch.randint(2, 20, (2, 8))
    ids[0, -2:] = 1
    params = [torch.randn(20, 8), torch.randn(12, 8), torch.randn(8), torch.randn(8)]
    grads = []
    for fn in (_roberta_embed, torch.compile(_roberta_embed, backend="autofuse")):
        ps = [p.clone().requires_grad_() for p in params]
        out, mask = fn(ids, *ps)
        out.sum().backward()
        grads.append((out.detach(), mask, [p.grad for p in ps]))
    (o1, m1, g1), (o2, m2, g2) = grads
    torch.testing.assert_close(o2, o1)
    assert torch.equal(m2, m1)
    for a, b in zip(g2, g1):
        torch.testing.assert_close(a, b)
