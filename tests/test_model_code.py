"""Model code written the way people write it: each case once raised an exception eager does not
raise (or returned a stale result). CPU, interpreter, small shapes."""

import pytest
import torch
import torch.nn.functional as F

import autofuse
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


def _decode_attention(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1) @ v


@pytest.mark.parametrize("keys", [16, 40])
def test_decode_step_attention_single_query_row(keys):
    """A decode step: one query row against a cache of ``keys``; the program's row tile has
    no row term in its addresses, yet it stores a whole tile (rows past the first masked)."""
    q, k, v = torch.randn(2, 4, 1, 16), torch.randn(2, 4, keys, 16), torch.randn(2, 4, keys, 16)
    opt = autofuse.optimize(_decode_attention, (q, k, v))
    assert any(kern.name.startswith("autofuse_att_") for kern in opt.plan.kernels)
    torch.testing.assert_close(opt(q, k, v), _decode_attention(q, k, v))


def test_decode_step_attention_backward(fresh_dynamo):
    """The same single row through the backend with gradients: the softmax statistics stored
    and loaded per (batch, head) row, dQ stored as a whole tile."""
    ins = [torch.randn(1, 2, 1, 16), torch.randn(1, 2, 16, 16), torch.randn(1, 2, 16, 16)]
    results = []
    for fn in (_decode_attention, torch.compile(_decode_attention, backend="autofuse")):
        xs = [t.clone().requires_grad_() for t in ins]
        out = fn(*xs)
        out.sum().backward()
        results.append([out.detach()] + [x.grad for x in xs])
    for got, ref in zip(*results[::-1]):
        torch.testing.assert_close(got, ref)


def _per_head_bias_attention(q, k, v, s1, s2):
    bias = torch.cat([s1, s2]).view(1, -1, 1, 1)
    return torch.softmax(q @ k.transpose(-1, -2) * 0.25 + bias, -1) @ v


@pytest.mark.parametrize("rows", [1, 16])
def test_cat_built_per_head_bias_in_attention(rows):
    """A per-head bias made by ``torch.cat`` is read inside the attention kernel at an address
    of the (batch, head) alone, under the cat's branch mask: the pointer is made a block."""
    args = (torch.randn(2, 4, rows, 16), torch.randn(2, 4, 16, 16), torch.randn(2, 4, 16, 16))
    args += (torch.randn(2), torch.randn(2))
    opt = autofuse.optimize(_per_head_bias_attention, args)
    assert any(kern.name.startswith("autofuse_att_") for kern in opt.plan.kernels)
    torch.testing.assert_close(opt(*args), _per_head_bias_attention(*args))


def _one_hot_scaled(x):
    return F.one_hot(x, 5).float() * 2


def test_one_hot_asserts_run_as_eager_steps(fresh_dynamo):
    """``F.one_hot`` checks its classes with ``aten._assert_async.msg`` (no result): the check
    is an eager step of the plan, so a bad class still raises as it does in eager."""
    x = torch.tensor([0, 3, 4, 1])
    compiled = torch.compile(_one_hot_scaled, backend="autofuse")
    torch.testing.assert_close(compiled(x), _one_hot_scaled(x))
    opt = autofuse.optimize(_one_hot_scaled, (x,))  # make_fx reads .item(): the backend path
    torch.testing.assert_close(opt(x), _one_hot_scaled(x))
    bad = torch.tensor([0, 7, 4, 1])
    with pytest.raises(RuntimeError):
        _one_hot_scaled(bad)
    with pytest.raises(RuntimeError):
        compiled(bad)


def _made_inside(x):
    y = x * torch.tensor(0.5)
    y[y > 0.3] = 0.0  # the written value is a tensor made inside too
    return y + torch.zeros(8)


def test_uniform_tensors_made_inside_become_constants():
    x = torch.randn(4, 8)
    opt = autofuse.optimize(_made_inside, (x,))
    assert opt.plan.kernels  # a plan of its own, the constants in it
    torch.testing.assert_close(opt(x), _made_inside(x))


def test_varying_constant_and_closed_over_tensor_take_the_backend_path(fresh_dynamo):
    """A constant of varying values, and a tensor the function closes over (it may change
    between calls), are not baked into a plan: the call runs through the backend path."""
    table = torch.ones(3)

    def f(x):
        return x * torch.tensor([1.0, 2.0, 3.0]) + table

    x = torch.randn(2, 3)
    opt = autofuse.optimize(f, (x,))
    torch.testing.assert_close(opt(x), f(x))
    table.add_(1.0)
    torch.testing.assert_close(opt(x), f(x))


SCALE = 2.0


def _scaled(x):
    return x * SCALE


def _reads_a_global(x):
    return _scaled(x) + 1


def test_optimize_guards_the_globals_it_baked_in(fresh_dynamo):
    """A module-level float read by a helper the function calls: once rebound, calls take the
    backend path (its Dynamo guards see the new value); rebound back, the plan runs again."""
    global SCALE
    x = torch.randn(4, 8)
    opt = autofuse.optimize(_reads_a_global, (x,))
    torch.testing.assert_close(opt(x), x * 2.0 + 1)
    try:
        SCALE = 3.0
        torch.testing.assert_close(opt(x), x * 3.0 + 1)
    finally:
        SCALE = 2.0
    assert opt.py_guard.changed() is None
    torch.testing.assert_close(opt(x), x * 2.0 + 1)


def test_optimize_guards_closure_cells(fresh_dynamo):
    k = 0.5

    def f(x):
        return x + k

    x = torch.randn(3, 5)
    opt = autofuse.optimize(f, (x,))
    torch.testing.assert_close(opt(x), x + 0.5)
    k = -1.0
    torch.testing.assert_close(opt(x), x - 1.0)


def test_print_inside_the_function_warns_once_at_optimize():
    def f(x):
        print("shape", x.shape)
        return x.sin()

    x = torch.randn(2, 3)
    with pytest.warns(UserWarning, match="side effects ran once, at capture"):
        opt = autofuse.optimize(f, (x,))
    torch.testing.assert_close(opt(x), x.sin())
