"""Regression tests: plans give eager's values where integer, bool, slice and layout semantics
are easy to get subtly wrong (bool arithmetic, integer wrap-around, empty slices, strides an
eager op reads, bitcast views), through both front ends: ``autofuse.optimize`` and
``torch.compile(backend="autofuse")``. Integer and bool results must be equal bit for bit."""

import pytest
import torch

import autofuse
from tests.helpers import assert_close

aten = torch.ops.aten


def _same(got, want, what):
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want), what
        for k, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{what} out {k}")
        return
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, eager gives {want.dtype}"
    if want.dtype.is_floating_point:
        assert_close(got, want, want.dtype, what)
    else:
        assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
        assert torch.equal(got, want), f"{what}: {got.flatten()[:8]} != {want.flatten()[:8]}"


def both(fn, inputs, *, kernels=True, compile_too=True):
    """``fn`` through optimize (and the backend) equals eager; ``kernels``: the plan runs at
    least one generated kernel (the case is not passed by running everything in eager)."""
    want = fn(*[x.clone() for x in inputs])
    fast = autofuse.optimize(fn, inputs)
    _same(fast(*inputs), want, f"optimize({fn.__name__})")
    if kernels:
        assert fast.plan.kernels, f"{fn.__name__}: no generated kernel ran"
    if compile_too:
        torch._dynamo.reset()
        _same(torch.compile(fn, backend="autofuse")(*inputs), want, f"compile({fn.__name__})")
    return fast


# ---------------------------------------------------------------------------------------------
# bool and integer arithmetic
# ---------------------------------------------------------------------------------------------

A = torch.tensor([True, False, True, False, True])
B = torch.tensor([True, True, False, False, True])


def test_bool_add_is_logical_or():
    def bool_add(a, b):
        return a + b

    both(bool_add, (A, B))


def test_bool_mul_sum_and_int_cast():
    def bool_ops(a, b):
        s = a + b
        return a * b, s.sum(), s.to(torch.int32) + 1, (s * a).to(torch.int64).cumsum(0)

    both(bool_ops, (A, B))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_integer_pow_by_a_scalar_wraps_around(dtype):
    lo = 0 if dtype == torch.uint8 else -100

    def int_pow(x):
        return torch.pow(x, 87), x**3, torch.pow(x, 0), torch.pow(x + 1, 12)

    both(int_pow, (torch.arange(lo, lo + 200, dtype=dtype),), compile_too=dtype == torch.int32)


def test_integer_division_and_remainder_signs():
    def int_div(x, y):
        return (
            x // y,
            x % y,
            torch.div(x, y, rounding_mode="trunc"),
            x / y,
            torch.remainder(x, 3),
            x << 2,
            x >> 1,
        )

    x = torch.arange(-10, 10)
    both(int_div, (x, torch.tensor([3, -3, 7, -2] * 5)))


# ---------------------------------------------------------------------------------------------
# empty, reversed and out-of-range slices
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("start,end", [(2, 0), (5, 5), (-3, -7), (-100, 2), (8, 100), (-2, None)])
def test_slice_scatter_with_empty_reversed_and_clamped_bounds(start, end):
    def scatter_slice(a, b):
        return aten.slice_scatter(a * 2, b + 1, 1, start, end)

    a = torch.randn(3, 10)
    n = len(range(10)[slice(start, end)])
    both(scatter_slice, (a, torch.randn(3, n)), compile_too=(start, end) == (2, 0))


def test_slices_with_reversed_and_out_of_range_negative_bounds():
    def slices(a):
        y = a + 1
        return y[:, -100:3] * 2, y[:, 5:2] * 3, y[-50:, -4:] - 1, y[:, -100:-90] + 1

    both(slices, (torch.randn(4, 10),))


# ---------------------------------------------------------------------------------------------
# dtypes kernels do not compute in: eager steps beside the generated kernels
# ---------------------------------------------------------------------------------------------


def test_complex_tensors_run_as_eager_steps():
    def complex_ops(z, x):
        w = torch.add(z, z, alpha=2) * 3 + 1j
        return w, w.abs() + x, torch.view_as_complex(torch.stack([x, x * 2], -1)) * z

    z = torch.tensor([1 + 1j, -1 + 1j, -2 + 2j, 3 - 3j, 0, 1j, 1, -1])
    x = torch.randn(8)
    want = complex_ops(z, x)
    for got in (
        autofuse.optimize(complex_ops, (z, x))(z, x),
        torch.compile(complex_ops, backend="autofuse")(z, x),
    ):
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            torch.testing.assert_close(g, w)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_float8_casts_run_as_eager_steps(fp8):
    def to_fp8(x):
        y = (x * 2 + 1).to(fp8)
        return y, y.float() * 3

    x = torch.randn(16)
    want = to_fp8(x)
    fast = autofuse.optimize(to_fp8, (x,))
    for got in (fast(x), torch.compile(to_fp8, backend="autofuse")(x)):
        assert got[0].dtype == fp8
        assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
        assert torch.equal(got[1], want[1])
    assert fast.plan.kernels


# ---------------------------------------------------------------------------------------------
# division by zero and reductions of a 0-d tensor
# ---------------------------------------------------------------------------------------------


def test_division_of_constants_by_zero_gives_inf_and_nan():
    def div_zero(x, zero, neg_zero):
        z = torch.zeros_like(x)
        return x / 0.0, x / -0.0, z / 0.0, x / z, z / z, x / zero, zero / neg_zero, z / -0.0

    both(div_zero, (torch.randn(10), torch.zeros(10), -torch.zeros(10)))


def test_integer_division_by_zero_as_eager():
    def int_div_zero(x, y):
        return x / y, x / 0, torch.zeros_like(x) / 0

    both(int_div_zero, (torch.arange(-4, 4), torch.zeros(8, dtype=torch.int64)))


def test_reductions_of_a_0d_tensor():
    def reduce_0d(x, i):
        y = x + 1
        return (
            y.mean(0),
            y.sum(-1, keepdim=True),
            y.amax(0),
            y.max(),
            y.prod(0),
            (i + 1).sum(0),
            y.var(),
            y.std(0),
        )

    both(reduce_0d, (torch.tensor(3.0), torch.tensor(4)))


# ---------------------------------------------------------------------------------------------
# bitcast views (x.view(dtype))
# ---------------------------------------------------------------------------------------------


def test_bitcast_view_of_an_intermediate_returns_its_bits():
    def bits(x, h):
        f = (x + 1).float()
        return f.view(torch.int32), f.view(torch.int32) * 2, (h * 2).view(torch.int16) + 1

    x, h = torch.randn(4, 8), torch.randn(4, 8, dtype=torch.float16)
    both(bits, (x, h))


@pytest.mark.parametrize("dtype", [torch.int16, torch.int32, torch.int64])
def test_uint8_view_through_a_wider_dtype(dtype):
    def through(x):
        return (x + 1).view(dtype).view(torch.uint8) + 1, (x * 3).view(dtype)

    both(through, (torch.randint(0, 16, (4, 32), dtype=torch.uint8),), kernels=True)


FLOATS = [torch.float32, torch.float16, torch.bfloat16]


_FAST = {(torch.float32, torch.float16), (torch.bfloat16, torch.float32)}
PAIRS = [
    pytest.param(x, y, marks=() if (x, y) in _FAST else pytest.mark.exhaustive)
    for x in FLOATS
    for y in FLOATS
]


@pytest.mark.parametrize("dtype_x,dtype_y", PAIRS)
def test_bitcast_views_feeding_matmuls(dtype_x, dtype_y):
    def viewed_mm(x, y, x2, view_dtype):
        a = x.view(view_dtype)
        b = y.view(view_dtype) + 1
        c = x2.view(view_dtype) + 1
        return a @ b, c @ a

    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 2, generator=g).to(dtype_x)
    y = torch.rand(2, 2, generator=g).to(dtype_y)
    ran = 0
    for view_dtype in FLOATS:
        try:
            viewed_mm(x, y, x.clone(), view_dtype)
        except RuntimeError:
            continue  # eager rejects it (the viewed shapes do not multiply)
        ran += 1
        fn = lambda a, b, c, d=view_dtype: viewed_mm(a, b, c, d)  # noqa: E731
        fn.__name__ = f"viewed_mm_{view_dtype}"
        both(fn, (x, y, x.clone()), kernels=False)
    assert ran, "no view dtype multiplies"


# ---------------------------------------------------------------------------------------------
# eager ops that read an intermediate's memory (as_strided) get it in eager's layout
# ---------------------------------------------------------------------------------------------


def test_as_strided_of_a_channels_last_intermediate():
    def strided(x):
        y = x + 1  # channels_last in eager, as x
        return aten.as_strided(y, (2, 3, 4, 5), (60, 1, 15, 3)) + 2, aten.as_strided(
            y, (2, 3, 10), (60, 1, 3), 2
        ) * 3

    both(strided, (torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),))


def test_as_strided_of_views_of_an_intermediate():
    def of_views(x):
        y = (x * 2).t()[1:]  # a slice of a transpose: storage offset and strides not its own
        a = aten.as_strided(y, (3, 4), (1, 8))
        p = aten.constant_pad_nd(x - 1, [1, 1, 1, 1], 0.0)
        b = aten.as_strided(aten.as_strided(p, (2, 5), (10, 2)), (2, 2, 2), (10, 2, 1), 3)
        c = aten.as_strided(x.t()[2:], (2, 3), (2, 8))  # views of an input: its own storage
        return a + 1, b * 2, c - 1

    both(of_views, (torch.randn(8, 8),))


def test_as_strided_scatter_into_a_permuted_intermediate():
    def scatter_strided(a, b):
        base = (a * 8 + 10).t()
        return aten.as_strided_scatter(base, b * 2 - 4, (4, 3), (1, 8), 1) + 1

    both(scatter_strided, (torch.randn(6, 8), torch.randn(4, 3)))


# ---------------------------------------------------------------------------------------------
# scatters whose every lane writes one place
# ---------------------------------------------------------------------------------------------


def test_scatter_of_a_one_element_index():
    def scatter_one(a, index, b):
        return aten.scatter(a * 2, -1, index, b), aten.scatter_add(a + 1, 1, index, b + 1)

    both(scatter_one, (torch.zeros(2, 3), torch.tensor([[0]]), torch.ones(2, 3)))


def test_index_put_of_one_index_in_a_fused_loop():
    def put_one(x, i, v):
        y = x * 2
        y[i] = v
        z = x + 1
        z.index_put_((i,), v * 3, accumulate=True)
        return y + 1, z

    both(put_one, (torch.randn(5), torch.tensor([2]), torch.tensor([7.0])))


def test_logical_op_of_a_scalar_read_bool_and_a_block():
    def scalar_and(x, s):
        z = x == 0
        return z & (s >= 0), ((x * 2 + z) * (s >= 0)).sum()

    both(scalar_and, (torch.tensor([0.0, 1.0, 0.0, -2.0, 3.0]), torch.tensor(1.5)))


def test_pow_by_a_tensor_exponent_backward():
    x = (torch.rand(5) + 0.5).requires_grad_()
    e = torch.tensor(1.7, requires_grad=True)
    torch._dynamo.reset()
    torch.compile(torch.pow, backend="autofuse")(x, e).sum().backward()
    got = (x.grad, e.grad)
    x.grad = e.grad = None
    torch.pow(x, e).sum().backward()
    torch.testing.assert_close(got, (x.grad, e.grad))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_amax_backward_of_a_computed_16_bit_value(dtype):
    """amax's backward recomputes ``x == max`` with the max saved in 16 bits: x computed in
    float32 inside the kernel must be rounded as eager holds it, or no element equals the max
    (0 / 0: NaN gradients; found by experiments.fuzz)."""
    g = torch.Generator().manual_seed(32561)
    x = torch.randn((1, 7), generator=g).to(dtype).requires_grad_()

    def f(x):
        v = torch.log1p(torch.abs(x))
        w = torch.sqrt(torch.abs(x)).unsqueeze(1).squeeze(1)  # compared through views
        return v - torch.amax(v, dim=-1, keepdim=True) + torch.amax(w, dim=-1, keepdim=True)

    gy = torch.randn(1, 7, generator=torch.Generator().manual_seed(1234)).to(dtype)
    want = torch.autograd.grad(f(x), x, gy)[0]
    got = torch.autograd.grad(autofuse.optimize(f, (x,))(x), x, gy)[0]
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


def test_index_add_into_a_bool_tensor():
    """index_add on a bool tensor with alpha: eager's op (the decomposition scaled the source
    into an integer it could not put back; found by experiments.fuzz)."""
    g = torch.Generator().manual_seed(0)
    x, src = torch.rand(2, 3, 4, generator=g) < 0.5, torch.rand(2, 3, 2, generator=g) < 0.5
    index = torch.tensor([3, 0])

    def f(x, index, src):
        return x.index_add(2, index, src, alpha=2)

    assert torch.equal(autofuse.optimize(f, (x, index, src))(x, index, src), f(x, index, src))
