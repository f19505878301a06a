"""How the differential fuzzer judges a float result that differs from eager's (experiments/fuzz
compare.py, reference.py): against a float64 run of the program that exists for programs making
float32 values of their own, with eager's error on nearby inputs as the measure of its rounding,
and the float64 run's finite value allowed where eager's NaN is an overflow of its own.

The programs are the fuzzer's layer_norm finds of seed 5, shrunk (graphs 7281, 5254, 337):
autofuse is as close to the float64 result as eager, or closer, in each."""

from __future__ import annotations

import pytest
import torch

from experiments.fuzz.compare import check_program, compare
from experiments.fuzz.program import InputSpec, OpNode, Program
from experiments.fuzz.reference import nearby, run_float64

# the true gradient is 0: terms of rstd * |dy| (1e3 |dy|) that cancel; eager's float32 sum of
# them is exactly 0 on these inputs by chance, autofuse's 1.5e-5 off (eager's is on 8 of 20
# draws of inputs an ulp or two away)
CONSTANT_ROW_GRAD = Program(
    (InputSpec("x0", (1, 2), "float32", seed=3954),),
    (OpNode("v0", "norm_const",
            "F.layer_norm({0}.amax(-1, keepdim=True).expand({0}.shape), [2], eps=1e-6)",
            ("x0",)),),
    ("v0",),
)  # fmt: skip

# a float32 row made from integers (``x * 0 + 0.3``): the float64 run failed (a float32 value
# beside float64 weights), so eager decided alone; eager's weight gradient is 0.03 from the
# true 0 (its float32 (sum(dy x) - mean sum(dy)) rstd, rstd 1e6), autofuse's 4e-11
INT_MADE_ROW = Program(
    (InputSpec("x0", (3, 1), "int32", kind="int", seed=54361),
     InputSpec("x1", (4,), "float32", seed=58104),
     InputSpec("x2", (4,), "float32", seed=57398)),
    (OpNode("v0", "where", "torch.where({0} > 0, {0}, 0.0)", ("x0",)),
     OpNode("v1", "norm_const", "F.layer_norm(({0} * 0 + 0.3).expand(3, 4), [4], {1}, {2}, "
            "eps=1e-12)", ("v0", "x2", "x1"))),
    ("v1",),
)  # fmt: skip

# a float16 constant row: the gradient at layer_norm's input is (-4e4, -1.9e5, 2e5, 3e4); eager's
# float16 backward gives NaN in all four, autofuse the float16 values (two overflow, and the
# softmax backward over the size-1 dim turns those into NaN); the float64 gradient of x0 is 0,
# autofuse's 0 where it has a number
HALF_CONSTANT_ROW = Program(
    (InputSpec("x0", (1, 4), "float16", seed=41091), InputSpec("x3", (4,), "float32", seed=16120)),
    (OpNode("v1", "norm_const", "F.layer_norm(torch.log(torch.softmax({0}.cumsum(-1), 0).abs()"
            " + 1), [4], eps=1e-5)", ("x0",)),
     OpNode("v4", "norm", "({0} * torch.rsqrt({0}.pow(2).mean(-1, keepdim=True) + 1e-6) * {1})",
            ("v1", "x3"))),
    ("v4",),
)  # fmt: skip


# fuzz graph 4355 of seed 7: a float16 constant row (0.3 rounded) normalized with eps 1e-12;
# eager's CPU float16 layer_norm gives the bias off by up to 0.04, autofuse the bias; the float64
# run keeps the program's float16 cast, so it repeats eager's rounding: the wide run judges
HALF_CAST_CONSTANT_ROW = Program(
    (InputSpec("x1", (1, 1, 1, 4), "float32", seed=34935),
     InputSpec("x2", (4,), "float16", seed=15400),
     InputSpec("x3", (4,), "float16", seed=31292)),
    (OpNode("v3", "compare_cast", "({0} >= 0.5).to(torch.float16)", ("x1",)),
     OpNode("v6", "norm_const", "F.layer_norm(({0} * 0 + 0.3), [4], {1}, {2}, eps=1e-12)",
            ("v3", "x3", "x2"))),
    ("v6",),
)  # fmt: skip


@pytest.mark.parametrize(
    "program",
    [CONSTANT_ROW_GRAD, INT_MADE_ROW, HALF_CONSTANT_ROW, HALF_CAST_CONSTANT_ROW],
    ids=["7281", "5254", "337", "4355"],
)
def test_layer_norm_of_a_constant_row_passes(program, fresh_dynamo):
    for backward in (False, True):
        for v in check_program(program, backward, ["optimize", "compile"], timeout_s=120):
            assert v.status == "pass", v


def _off_by(delta: float):
    """A planted miscompilation: every float output moved by ``delta`` times its input's sum."""

    def compiler(fn, _inputs):
        def wrong(*xs):
            shift = sum(x.float().sum() for x in xs if x.is_floating_point()) * delta
            return tuple(o + shift if o.is_floating_point() else o for o in fn(*xs))

        return wrong

    return {"wrong": compiler}


def test_a_real_error_beside_a_cancellation_still_fails():
    """Eager's noise on nearby inputs (1.5e-5 here) excuses that much, not 100 times more."""
    for backward in (False, True):
        (v,) = check_program(CONSTANT_ROW_GRAD, backward, ["wrong"], compilers=_off_by(1e-3))
        assert v.status == "mismatch", v


def test_the_wide_run_excuses_no_real_error_through_a_float16_cast():
    """A planted error past REFERENCE_FACTOR (4) times eager's own (0.04 here) fails against both
    runs: 0.5 and 5 off."""
    for delta in (1e-1, 1.0):
        (v,) = check_program(HALF_CAST_CONSTANT_ROW, False, ["wrong"], compilers=_off_by(delta))
        assert v.status == "mismatch", (delta, v)


def test_the_float64_run_of_a_program_making_float32():
    p = Program(
        (InputSpec("x0", (4,), "int32", kind="int", seed=1), InputSpec("x1", (4,), "float32")),
        (OpNode("v0", "unary", "({0}.to(torch.float32) * 0.1 + {0} * 0.3)", ("x0",)),
         OpNode("v1", "binary", "({0} * {1})", ("v0", "x1"))),
        ("v1",),
    )  # fmt: skip
    from experiments.fuzz.program import compile_program
    from experiments.fuzz.reference import float64_program

    fn, make = compile_program(p)
    out, grads = run_float64(float64_program(p), make, True, [torch.float32])
    (r,) = out
    assert r.dtype == torch.float64 and grads[0].dtype == torch.float64
    x0, x1 = make()
    want = (x0.double() * 0.1 + x0.double() * 0.3) * x1.double()
    torch.testing.assert_close(r.detach(), want, rtol=1e-15, atol=0)
    assert torch.get_default_dtype() == torch.float32


def test_nearby_inputs_are_an_ulp_or_two_away_in_their_own_strides():
    base = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    x = base.clone().t()[:, ::2]
    ints = torch.arange(5)
    moved, same = nearby([x, ints], 3)
    assert moved is x and moved.stride() == (1, 12) and torch.equal(same, torch.arange(5))
    ulps = (moved.double() - base.t()[:, ::2].double()).abs() / base.t()[:, ::2].abs().double()
    eps = torch.finfo(torch.float32).eps
    assert (ulps > 0.4 * eps).all() and (ulps < 2.6 * eps).all()


def test_compare_takes_eager_noise_on_nearby_inputs():
    r = torch.zeros(2, dtype=torch.float64)
    e = torch.zeros(2)  # eager exact here by chance
    a = torch.tensor([1.5e-5, 0.0])
    assert "value 0" in compare((a,), (e,), lambda: (r,))
    assert compare((a,), (e,), lambda: (r,), None, lambda: [1.5e-5]) == ""
    assert "value 0" in compare((a * 100,), (e,), lambda: (r,), None, lambda: [1.5e-5])


def test_compare_takes_the_true_value_where_eager_overflows_to_nan():
    r = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)
    e = torch.tensor([float("nan"), float("nan"), 2.0])
    nan = float("nan")
    assert compare((torch.tensor([0.0, nan, 2.0]),), (e,), lambda: (r,)) == ""
    assert "value 0" in compare((torch.tensor([0.5, nan, 2.0]),), (e,), lambda: (r,))
    assert "value 0" in compare((torch.tensor([0.0, nan, nan]),), (e,), lambda: (r,))
    assert "value 0" in compare((torch.tensor([float("inf"), nan, 2.0]),), (e,), lambda: (r,))


def test_compare_takes_the_true_value_where_eager_overflows_to_infinity():
    """Fuzz graph 7984 (seed 5): eager rounds each float16 intermediate of an RMS-norm chain's
    backward and overflows to -inf where the float64 gradient is 1e-3; autofuse's value, kept
    in float32 as Inductor keeps it, is that gradient. Where the float64 value is infinite
    too, or autofuse's number is far from it, eager's infinity stands."""
    inf = float("inf")
    r = torch.tensor([1e-3, 2.0, inf], dtype=torch.float64)
    e = torch.tensor([-inf, 2.0, inf], dtype=torch.float16)
    ok = torch.tensor([1e-3, 2.0, inf], dtype=torch.float16)
    assert compare((ok,), (e,), lambda: (r,)) == ""
    far = torch.tensor([5.0, 2.0, inf], dtype=torch.float16)
    assert "value 0" in compare((far,), (e,), lambda: (r,))
    finite_overflow = torch.tensor([-inf, 2.0, 6e4], dtype=torch.float16)
    assert "value 0" in compare((finite_overflow,), (e,), lambda: (r,))


def test_compare_takes_the_dtypes_infinity_where_eager_overflows_to_nan_past_its_range():
    """Fuzz graph 1414 (seed 7): eager's float16 ``copysign`` gradient of ``x / 3e-39`` is
    inf / inf = NaN; the float64 value, 3.3e38, is past float16's range, so float16 holds it as
    inf, which is autofuse's value. A finite float64 value in range still judges an inf."""
    inf, nan = float("inf"), float("nan")
    r = torch.tensor([3.3e38, 2.0, 1.0], dtype=torch.float64)
    e = torch.tensor([nan, 2.0, nan], dtype=torch.float16)
    assert compare((torch.tensor([inf, 2.0, 1.0], dtype=torch.float16),), (e,), lambda: (r,)) == ""
    wrong_sign = torch.tensor([-inf, 2.0, 1.0], dtype=torch.float16)
    assert "value 0" in compare((wrong_sign,), (e,), lambda: (r,))
    in_range = torch.tensor([inf, 2.0, inf], dtype=torch.float16)
    assert "value 0" in compare((in_range,), (e,), lambda: (r,))


def test_compare_takes_a_nan_the_exact_program_has_too():
    """Fuzz graph 7182 (seed 7): eager's float16 layer_norm of one element is -5.7e-6, not 0, so
    its ``fmod(v, v)`` is -0.0; autofuse's v is the exact 0 and its fmod 0 / 0 NaN, as the
    float64 run's. A NaN where the float64 value is a number still fails."""
    nan = float("nan")
    e = torch.tensor([-0.0, 1.0], dtype=torch.float16)
    got = torch.tensor([nan, 1.0], dtype=torch.float16)
    assert compare((got,), (e,), lambda: (torch.tensor([nan, 1.0], dtype=torch.float64),)) == ""
    assert "value 0" in compare((got,), (e,), lambda: (torch.tensor([0.0, 1.0]).double(),))


def test_where_eager_has_nan_its_relative_error_elsewhere_scales():
    """Fuzz graph 9037 (seed 7): layer_norm of a padded row over 3e-39 is ill-conditioned;
    eager's gradient is 4e-3 off the float64 one at 1e33 and NaN at -2.2e35, where autofuse's
    is 4e-4 off (8.6e31). Judged by eager's relative error there, not its absolute error at the
    smaller value; an error past that scale still fails."""
    nan = float("nan")
    r = torch.tensor([1.12164e33, -2.171803e35], dtype=torch.float64)
    e = torch.tensor([1.11667e33, nan])
    ok = torch.tensor([1.11374e33, -2.170946e35])
    assert compare((ok,), (e,), lambda: (r,)) == ""
    far = torch.tensor([1.11374e33, -1.9e35])
    assert "value 0" in compare((far,), (e,), lambda: (r,))
    assert "value 0" in compare((torch.tensor([1.3e33, -2.170946e35]),), (e,), lambda: (r,))
    # eager's noise where the float64 value is 0 scales nothing
    r0 = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)
    e0 = torch.tensor([1e-9, 1.0, nan])
    assert "value 0" in compare((torch.tensor([1e-9, 1.0, 50.0]),), (e0,), lambda: (r0,))
