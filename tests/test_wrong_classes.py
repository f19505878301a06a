"""Classes of programs that gave silently wrong values, through both front ends, forward and
backward where the inputs can require grad:

- numbers beside narrow tensors: a Python number is converted as eager converts it, to the
  promoted dtype of the operation (a bool tensor against ``2`` compares as int64: the number
  was taken as True) with that dtype's value (``u8 < 300`` compares with 44, ``f16 == 0.1``
  with 0.1's float16 value, ``i32 < 2**40`` with 0);
- an index with a negative constant (a pad's or a cat's offset) divided by a reshape's size
  (``F.pad(a @ b, ...)`` of a 3-D or 4-D ``a``: the matmul's [M, N] result read through its
  [B, M', N] view): the simplifier dropped the constant, reading outside the buffer;
- an in-place op through a call that returns its input itself (``v.type_as(v)``): its write
  was lost (the function, not its traced graph, was functionalized);
- an in-place op on a pad that only crops (every amount <= 0): eager's pad returns a new
  tensor, the decomposition returned a view of the input, so the write reached the input;
- the mean of a constant row in var / std / layer_norm / group_norm / batch_norm: a sum of
  equal values rounds, and ``(x - mean) * rsqrt(var + 1e-12)`` scaled that rounding by 1e6;
  the mean is now the row's first element plus the mean of the differences (exact), also in a
  split variance's chunk statistics and their combine.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import autofuse

from .helpers import FRONT_ENDS, assert_close, dtype_front_grid


def _front(fn, args, front: str):
    if front == "optimize":
        return autofuse.optimize(fn, args)
    torch._dynamo.reset()
    return torch.compile(fn, backend="autofuse", dynamic=False)


def _outs(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def _check(fn, args, front: str, grad: bool = False) -> tuple:
    """``fn`` through ``front`` equals eager (dtype-aware); with ``grad``, so do the gradients
    of its float outputs with respect to every input that requires grad."""
    ref_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    ref = _outs(fn(*ref_args))
    got = _outs(_front(fn, args, front)(*args))
    assert len(got) == len(ref)
    for k, (o, r) in enumerate(zip(got, ref)):
        assert o.dtype == r.dtype, f"output {k}: {o.dtype} != {r.dtype}"
        assert_close(o.detach(), r.detach(), r.dtype, f"{front} output {k}")
    if grad:
        torch.manual_seed(1)
        gys = [torch.randn_like(r) for r in ref if r.requires_grad]
        want = torch.autograd.grad([r for r in ref if r.requires_grad], ref_args, gys)
        have = torch.autograd.grad([o for o in got if o.requires_grad], list(args), gys)
        for k, (h, w) in enumerate(zip(have, want)):
            assert_close(h, w, w.dtype, f"{front} gradient {k}")
    return got


# -- numbers beside narrow tensors -------------------------------------------------------------


def _bool_forms(a):
    return (a >= 2, a < 2, a == 2, a != -1, a > 2.5, a <= -0.5, a + 2, a * 2.5, a // -3)


def _int_forms(u, i):
    return (
        u < 300,
        u >= 300,
        u == -200,
        u // 300,
        u % 300,
        u & 300,
        i > -200,
        i <= 300,
        i + 300,
        i * -200,
        torch.where(u > 100, u, -1),
    )


def _wide_int_forms(i):
    return i < 2**40, i == 2**40, i + 2**40, i > 2.5


def _half_forms(h, b):
    return h == 0.1, h < 0.1, h >= 65519.0, h != 65519.0, b == 0.1, b > 0.1, b <= 0.1


NUMBER_CASES = {
    "bool": (_bool_forms, lambda: (torch.tensor([True, False, True, False]).view(2, 1, 2),)),
    "uint8_int8": (
        _int_forms,
        lambda: (
            torch.tensor([0, 1, 44, 200, 255, 56], dtype=torch.uint8).view(2, 3),
            torch.tensor([-128, -1, 0, 44, 127, 56], dtype=torch.int8).view(2, 3),
        ),
    ),
    "int32": (_wide_int_forms, lambda: (torch.tensor([1, -5, 0, 7], dtype=torch.int32),)),
    "16bit": (
        _half_forms,
        lambda: (
            torch.tensor([0.1, 1.0, 65504.0, -3.0], dtype=torch.float16),
            torch.tensor([0.1, 1.0, 3e38, -3.0], dtype=torch.bfloat16),
        ),
    ),
}


@pytest.mark.parametrize("front", FRONT_ENDS)
@pytest.mark.parametrize("case", sorted(NUMBER_CASES))
def test_numbers_beside_narrow_tensors(case, front):
    fn, make = NUMBER_CASES[case]
    _check(fn, make(), front)


def test_the_bool_scalar_program():
    """The issue's program: ``a >= 2`` of a bool (2, 1, 1) tensor is all False."""
    a = torch.tensor([True, False]).view(2, 1, 1)
    for front in FRONT_ENDS:
        (out,) = _check(lambda a: a >= 2, (a,), front)
        assert not out.any()


def _select_by_number(h):
    return torch.where(h == 0.1, h * 2, h - 1)


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_a_comparison_with_a_number_backward(front):
    h = torch.tensor([0.1, 1.0, 0.1, 3.0], dtype=torch.float16, requires_grad=True)
    _check(_select_by_number, (h,), front, grad=True)


# -- pads (cat offsets) of a reshaped matmul result ---------------------------------------------


def _pad_matmul(pad):
    def fn(a, b):
        return F.pad(a @ b, pad)

    return fn


def _issue_program(a, b, c):
    v = a @ b
    v.sub_(c)
    return F.pad(v, [1, 2, 1, 3])


def _bmm_pad(a, b):
    return F.pad(torch.relu(a @ b) * 2, [0, 1, 2, 0, 1, 1])


PAD_CASES = {
    "2d": (_pad_matmul([1, 2, 1, 3]), ((4, 2), (2, 5))),
    "3d": (_pad_matmul([1, 2, 1, 3]), ((3, 4, 2), (2, 5))),
    "3d_top_only": (_pad_matmul([0, 0, 2, 0]), ((3, 4, 2), (2, 5))),
    "3d_negative": (_pad_matmul([-1, 2, 1, -1]), ((3, 4, 2), (2, 5))),
    "4d": (_pad_matmul([1, 2, 1, 3, 1, 0]), ((2, 3, 4, 2), (2, 5))),
    "4d_negative": (_pad_matmul([2, -1, -1, 2]), ((2, 3, 4, 2), (3, 2, 5))),
    "bmm": (_bmm_pad, ((3, 4, 2), (3, 2, 5))),
}


@pytest.mark.parametrize("front", FRONT_ENDS)
@pytest.mark.parametrize("case", sorted(PAD_CASES))
def test_pad_of_a_matmul(case, front):
    fn, shapes = PAD_CASES[case]
    torch.manual_seed(0)
    args = tuple(torch.randn(*s, requires_grad=True) for s in shapes)
    _check(fn, args, front, grad=True)


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_the_pad_program_on_a_permuted_view(front):
    """The issue's program: ``a`` (16, 1, 7, 2) a permuted view, ``v.sub_(c)`` in place."""
    torch.manual_seed(0)
    a = torch.randn(16, 2, 7, 1).permute(0, 3, 2, 1)
    b, c = torch.randn(2, 5), torch.randn(1, 1, 1, 1)
    _check(_issue_program, (a, b, c), front)
    grads = [t.detach().requires_grad_() for t in (a, b, c)]
    _check(_issue_program, grads, front, grad=True)


# -- in-place ops through a call that returns its input itself ----------------------------------

ALIASES = {
    "type_as": lambda v: v.type_as(v),
    "to_dtype": lambda v: v.to(v.dtype),
    "float": lambda v: v.float(),
    "contiguous": lambda v: v.contiguous(),
    "reshape": lambda v: v.reshape(-1),
    "view_as": lambda v: v.view_as(v),
    "expand_as": lambda v: v.expand_as(v),
    "type_as_contiguous": lambda v: v.type_as(v).contiguous(),
}


def _through(alias):
    def fn(x):
        v = x * 2
        w = ALIASES[alias](v)
        w.add_(1)
        w.mul_(3)
        return v * x

    return fn


@pytest.mark.parametrize("front", FRONT_ENDS)
@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_in_place_through_an_alias(alias, front):
    torch.manual_seed(0)
    _check(_through(alias), (torch.randn(4, 3),), front)


@pytest.mark.parametrize("front", FRONT_ENDS)
@pytest.mark.parametrize("alias", ["type_as", "float", "reshape"])
def test_in_place_through_an_alias_backward(alias, front):
    torch.manual_seed(0)
    x = torch.randn(4, 3, requires_grad=True)
    _check(_through(alias), (x,), front, grad=True)


def _crop_then_scale(x, s):
    v = F.pad(x, [-2, -1])
    v.mul_(s)
    return v, x


def _crop_2d_then_add(x):
    v = F.pad(x, [0, -1, -1, 0])
    v.add_(1)
    return v * 2, x * 3


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_in_place_on_a_crop_only_pad_leaves_the_input(front):
    x = torch.arange(8, dtype=torch.int32)
    _check(_crop_then_scale, (x, torch.tensor(3, dtype=torch.int32)), front)
    assert torch.equal(x, torch.arange(8, dtype=torch.int32))
    torch.manual_seed(0)
    _check(_crop_2d_then_add, (torch.randn(4, 5, requires_grad=True),), front, grad=True)


def _issue_alias_program(x):
    v = x * 2
    w = v.type_as(v)
    w.add_(1)
    return v


def test_the_type_as_program():
    x = torch.randn(4, 3)
    for front in FRONT_ENDS:
        (out,) = _check(_issue_alias_program, (x,), front)
        torch.testing.assert_close(out, x * 2 + 1)


# -- the mean and variance of constant rows -----------------------------------------------------


def _constant_rows(dtype, shape=(2, 4, 7)):
    """Rows of one value each (a different one per leading index), of ``dtype``."""
    values = torch.tensor([0.1, -3.3, 0.7, 17.25])[: shape[0]].to(dtype)
    return values.view(-1, *([1] * (len(shape) - 1))).expand(shape).contiguous()


def _norms(x):
    return (
        F.layer_norm(x, x.shape[-2:], eps=1e-12),
        F.layer_norm(x, x.shape[-1:], eps=1e-12),
        F.group_norm(x, 2, eps=1e-12),
        x.var(-1),
        x.var((1, 2), correction=0),
        x.std((1, 2)),
        torch.var_mean(x, -1)[0],
    )


DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.mark.parametrize("dtype,front", dtype_front_grid(DTYPES))
def test_constant_rows_normalize_to_zero(dtype, front):
    x = _constant_rows(dtype)
    for k, (out, ref) in enumerate(zip(_check(_norms, (x,), front), _norms(x))):
        assert not ref.any(), f"eager's output {k} is not 0"
        assert not out.any(), f"output {k}: {out.abs().max().item()} where eager gives 0"


def _batch_norm(x):
    return F.batch_norm(x, None, None, training=True, eps=1e-12)


@pytest.mark.parametrize("dtype,front", dtype_front_grid(DTYPES))
def test_constant_channels_batch_norm_to_zero(dtype, front):
    """A constant channel of a training batch norm normalizes to 0 (as eager's Welford moments
    on CUDA; eager's CPU sum / N itself rounds there, so only the zeros are checked)."""
    x = _constant_rows(dtype, (4, 2, 3)).transpose(0, 1).contiguous()
    out = _front(_batch_norm, (x,), front)(x)
    assert out.shape == x.shape and not out.any(), out.abs().max().item()


def _issue_norm_program(a, b):
    v = torch.log(torch.softmax(a.cumsum(2), 0).abs() + 1)
    return F.layer_norm(v, [16, 7], None, b, eps=1e-12)


@pytest.mark.parametrize("dtype,front", dtype_front_grid(DTYPES))
def test_the_layer_norm_program(dtype, front):
    """The issue's program: softmax over a dim of size 1 is 1, so every row is log(2)."""
    torch.manual_seed(0)
    a, b = torch.randn(1, 16, 7, dtype=dtype), torch.randn(16, 7, dtype=dtype)
    (out,) = _check(_issue_norm_program, (a, b), front)
    assert torch.equal(out, b.expand_as(out))


def _normalized(x, w):
    return F.layer_norm(x, x.shape[-1:], w, eps=1e-3), F.group_norm(x, 2, eps=1e-3) * 2


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_constant_rows_backward(front):
    """(eps 1e-3: eager's CPU backward recomputes the normalized rows from moments that round,
    which a tiny eps would scale past any tolerance; ours are 0)"""
    x = _constant_rows(torch.float32).requires_grad_()
    w = torch.randn(7, requires_grad=True)
    _check(_normalized, (x, w), front, grad=True)


def test_a_split_variance_of_constant_columns(split_on):
    """The split statistics (per-chunk means and M2s, Chan's combine) of constant columns: a
    variance of exactly 0, the mean the columns' value."""
    from autofuse.capture.trace import capture

    def var_mean0(x):
        return torch.var_mean(x, 0)

    for dtype in DTYPES:
        x = _constant_rows(dtype, (4, 4096)).t().contiguous()
        assert any(n.name.endswith("chunk_m2") for n in capture(var_mean0, (x,)).graph.nodes)
        var, mean = autofuse.optimize(var_mean0, (x,))(x)
        assert not var.any() and torch.equal(mean, x[0])
