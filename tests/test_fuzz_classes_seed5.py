"""Classes of programs the differential fuzzer found autofuse to get wrong (or to crash on), one
test per class of cause, through both front ends, forward and backward where inputs can
require grad:

- an empty view whose offset lies past its base's end (``x[4:3:2]`` of a 2-element ``x``): a
  reshape of it mapped every index to constants, so a kernel recomputing a value through it
  loaded ``base + offset`` unmasked, outside the buffer; an empty value is now never loaded;
- a division by a constant that float32 holds as a subnormal (``x / 3e-39``): it was rendered
  as a multiply by the reciprocal of the Python double, which is not the reciprocal of the
  float32 divisor eager divides by (``sin`` of the quotient then differs wholly) or overflows
  in float32 (``x / 2e-39`` of a small ``x``: inf where eager's quotient is finite); such a
  division is now rendered as a division, and a row divisor (``x / x.sum(-1)``) under 2^-64
  is scaled by 2^64 before its reciprocal is taken (``1 / 1e-39`` is inf: inf and NaN where
  eager's quotients are finite);
- a 16-bit value computed in a kernel (in float32) and then cast to another dtype: the cast
  converted the float32 value, not the 16-bit one eager holds, so layer_norm's upcast of a
  bfloat16 ``x * 0 + 0.3`` (0.30078125) saw 0.3 beside its saved mean 0.30078125 and the
  backward scaled the difference by rsqrt(eps); a cast now rounds its 16-bit operand first;
- an in-place op through an ``expand`` to the tensor's own shape (seed 7, graph 162:
  ``x.masked_fill(m, inf).expand(x.shape).view_as(...).relu_()``): functionalization writes it
  back as ``base + (written - base)``, NaN where the base is infinite (eager: inf); such an
  expand is now a plain view before functionalizing (``capture/overlap.py``);
- attention written out whose operand is a constant (a query filled in place: ``fill_``
  makes it a ``full``) or an empty tensor (seed 7, graphs 2747 and 1205): the attention
  kernels looked for a buffer to load and raised KeyError at plan time; such an operand now
  refuses the attention kind, and its matmuls run otherwise;
- a gather / index_select along a dim of size 1 (every index 0) was typed as a block while its
  code loads one scalar: ``x_bool | (v < y)`` of two such scalars failed to build in Triton's
  interpreter (seed 7, graph 1918: a warning and eager's values); its value is the load's now.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from .helpers import FRONT_ENDS, through

TOL = {torch.float32: (1.3e-5, 1e-5), torch.float16: (1e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2)}

pytestmark = pytest.mark.usefixtures("checked_strict")


def _run(fn, args, grad: bool) -> list:
    """The outputs and, with ``grad``, the gradients of the float inputs (fixed cotangents)."""
    args = [a.detach().clone().requires_grad_(grad and a.is_floating_point()) for a in args]
    outs = fn(*args)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    diff = [o for o in outs if o.requires_grad]
    leaves = [a for a in args if a.requires_grad]
    if not grad or not diff or not leaves:
        return outs
    g = torch.Generator().manual_seed(1234)
    cots = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in diff]
    return outs + list(torch.autograd.grad(diff, leaves, cots, allow_unused=True))


def _check(fn, args, front: str, grad: bool) -> None:
    """``fn`` through ``front`` gives eager's values, NaN and inf in the same places."""
    want = _run(fn, args, grad)
    have = _run(through(front, fn, args), args, grad)
    assert len(have) == len(want)
    for k, (h, w) in enumerate(zip(have, want)):
        assert (h is None) == (w is None), f"value {k}"
        if w is None:
            continue
        rtol, atol = TOL.get(w.dtype, (0.0, 0.0))
        torch.testing.assert_close(h.detach(), w.detach(), rtol=rtol, atol=atol, equal_nan=True)


# -- an empty view past its base's end ---------------------------------------------------------


def _empty_past_end(x, w, b, y):
    v = F.layer_norm(x[4:3:2], (0,), w, b, eps=1e-5)
    return (v.float().sub_(y), v)[1].relu_()


def _empty_reshaped(x, y):
    v = x[:, 5:4].reshape(0, 3).transpose(0, 1)
    return (v * 2).relu_().sum(0) + y, (v + 1).exp()


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("front", FRONT_ENDS)
def test_empty_view_past_end_not_loaded(front, grad):
    x, y = torch.randn(2), torch.randn(1)
    _check(_empty_past_end, [x, torch.randn(0), torch.randn(0), y], front, grad)
    _check(_empty_reshaped, [torch.randn(3, 4), torch.randn(1)], front, grad)


# -- a division by a subnormal constant --------------------------------------------------------


def _by_subnormal(x):
    return torch.sin(x / 3e-39), (x * 1e-6) / 2e-39, x / -1e-40


def _by_subnormal_row(x):
    t = x.abs() * 1e-39
    return t / t.sum(-1, keepdim=True), x / x.sum(-1, keepdim=True)


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("front", FRONT_ENDS)
def test_division_by_subnormal_divisor(front, grad):
    g = torch.Generator().manual_seed(0)
    _check(_by_subnormal, [torch.randn(4, 7, generator=g)], front, grad)
    x = torch.randn(4, 7, generator=g)
    x[1, 2:] = 0.0  # zeros divided by a subnormal row sum: 0, not 0 * inf
    _check(_by_subnormal_row, [x], front, grad)


# -- a cast of a 16-bit value computed in the kernel -------------------------------------------


def _norm_of_constant_row(x, w, b):
    return F.layer_norm(x * 0 + 0.3, [3], w, b, eps=1e-12)


def _norm_of_row_mean(x):
    return F.layer_norm(x.mean(-1, keepdim=True).expand_as(x), [3], eps=1e-5)


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("front", FRONT_ENDS)
def test_cast_of_16_bit_value_rounds_it_first(front, grad):
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(s, generator=g).bfloat16() for s in ((2, 3), (3,), (3,)))
    _check(_norm_of_constant_row, [x, w, b], front, grad)
    _check(_norm_of_row_mean, [torch.randn(1, 3, generator=g).bfloat16()], front, grad)


# -- an in-place op through an expand that broadcasts nothing -----------------------------------


def _through_no_op_expand(x):
    v = x.masked_fill(x > 0, float("inf"))
    w = v.expand(x.shape)
    return (w.view_as(w).relu_(), w)[1] * 2


def _through_no_op_expand_as(x, y):
    v = (x * 3).masked_fill(x < 0, float("-inf"))
    v.expand_as(y).mul_(y)
    return v


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("front", FRONT_ENDS)
def test_in_place_through_an_expand_to_the_same_shape(front, grad):
    _check(_through_no_op_expand, [torch.randn(5, 8)], front, grad)
    _check(_through_no_op_expand_as, [torch.randn(4, 6), torch.rand(4, 6) + 0.5], front, grad)


# -- attention whose operand is a constant or empty --------------------------------------------


def _attention_of_filled_query(x, k, v):
    q = torch.stack([x, x], dim=-1)
    q[...].fill_(-1.0)
    s = (q @ k.transpose(-2, -1) * 0.5).masked_fill(torch.ones(1, 2, dtype=torch.bool).triu(1),
                                                     float("-inf"))  # fmt: skip
    return torch.softmax(s, dim=-1) @ v


def _attention_of_empty_head(q, k, v, d):
    return torch.div(torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v, d, rounding_mode="trunc")


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("front", FRONT_ENDS)
def test_attention_whose_operand_is_no_buffer(front, grad):
    _check(_attention_of_filled_query, [torch.randn(1, 1), torch.randn(1, 2, 2),
                                        torch.randn(1, 2, 1)], front, grad)  # fmt: skip
    _check(_attention_of_empty_head, [torch.randn(1, 1, 0), torch.randn(1, 2, 0),
                                      torch.randn(1, 2, 1), torch.randn(1, 1, 1)], front, grad)  # fmt: skip


# -- an indexed read along a dim of size 1 ------------------------------------------------------


def _select_along_a_unit_dim(x0, x1, x2, x3):
    v = torch.index_select(x0.unsqueeze(-2), 1, x2)
    return x3 | (v < x1), torch.gather(x0.unsqueeze(-1), 1, x2[:1].view(1, 1)) * 2


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_an_indexed_read_along_a_unit_dim_builds(front):
    args = [torch.randn(1), torch.randn(2)[::2], torch.zeros(4, dtype=torch.long),
            torch.rand(1, 1, 4) > 0.5]  # fmt: skip
    _check(_select_along_a_unit_dim, args, front, False)


def _stacked_scalar_comparisons(x0, x1, x2, x3):
    v = torch.index_select(torch.logaddexp(x0, x1).unsqueeze(-2), 1, x2) < x1
    s = torch.stack([v, v], dim=-2)  # a where of two 0-d comparisons over a block
    return x3 | s, s


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_a_block_of_scalar_comparisons_builds(front):
    """Graph 1918 unshrunk: Triton's interpreter typed a 0-d comparison as its float operands,
    so broadcast to the stack's block it held float32 data, which ``|`` with a bool block
    refused (autofuse.interpreter types it int1)."""
    args = [torch.randn(1), torch.randn(2)[::2], torch.zeros(4, dtype=torch.long),
            (torch.rand(1, 4, 1) > 0.5).transpose(-2, -1)]  # fmt: skip
    _check(_stacked_scalar_comparisons, args, front, False)
