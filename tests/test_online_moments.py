"""The moment mean's shifted sum rides its maximum's loop (``kernels/common/online.py``): a
looped reduction kernel computing a variance (var, layer_norm, group_norm, batch_norm's
statistics) walks each row twice, not three times, and stays exact where the two-loop sum was:
0 on a constant row, finite near the dtype's maximum, eager's infinities and NaNs.

Rows of 8192 elements take the looped kernel (RBLOCK 4096) in Triton's interpreter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse.kernels.common.online import shift_scale
from autofuse.kernels.common.reads import online_pairs
from tests.test_numerics import check

ROW = 8192


def var_mean(x):
    return torch.var_mean(x, dim=-1)


def layer_norm(x):
    return F.layer_norm(x, x.shape[-1:], eps=1e-12)


def group_norm(x):
    return F.group_norm(x, 2, eps=1e-12)


def looped_plan(fn, x):
    """The greedy plan of ``fn`` on ``x``, each of its reductions looped (asserted)."""
    plan = check(fn, [x])
    reds = [k for k in plan.kernels if k.info.kind == "reduction"]
    assert reds and all(k.config.RBLOCK < k.info.rnumel for k in reds), [
        (k.config, k.info.rnumel) for k in reds
    ]
    return plan


@pytest.mark.parametrize("fn", [var_mean, layer_norm])
def test_the_shifted_sum_rides_the_max_loop_and_each_row_is_read_twice(fn):
    x = torch.randn(4, ROW) * 3 + 100
    plan = looped_plan(fn, x)
    (k,) = [k for k in plan.kernels if k.info.kind == "reduction"]
    pairs = online_pairs(plan.graph, k.info)
    assert [plan.graph[m].op for m in pairs.values()] == ["amax"]
    assert all(shift_scale(plan.graph, s) is not None for s in pairs)
    x_node = next(i for i, n in enumerate(plan.graph.nodes) if n.op == "input")
    x_load = k.info.loads.index(x_node)
    # the max and the shifted sum in one loop, the squares in the second (layer_norm: and its
    # normalized output in a third)
    assert k.meta.load_passes[x_load] == (2 if fn is var_mean else 3), k.meta.load_passes


@pytest.mark.parametrize("fn", [var_mean, layer_norm, group_norm])
def test_a_constant_row_has_variance_exactly_zero(fn):
    x = torch.full((2, 2, ROW), 0.1)
    x[1] = -7.3  # one more constant, whose sum of 8192 copies rounds
    shape = (2, 2, ROW) if fn is group_norm else (4, ROW)
    x = x.reshape(shape)
    looped_plan(fn, x)
    out = autofuse.optimize(fn, [x])(x)
    if fn is var_mean:
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        assert torch.equal(out[1], x.reshape(-1, ROW)[:, 0].reshape(out[1].shape))
    else:  # the row minus its mean is 0: normalized with eps 1e-12, still 0
        assert torch.equal(out, torch.zeros_like(out))


def test_the_maximum_moving_up_row_by_row_matches_float64():
    """A rising row (each tile raises the running max), a falling one (only the first), a
    rotated one and a wide random one: the moments within float32 rounding of the values'
    scale (the random row's mean is a cancellation: 0.7 out of values of 3e3)."""
    up = torch.linspace(-50, 50, ROW)
    x = torch.stack([up, up.flip(0), up.roll(ROW // 3), torch.randn(ROW) * 1e3])
    var, mean = autofuse.optimize(var_mean, [x])(x)
    var64, mean64 = var_mean(x.double())
    scale = x.abs().amax(-1).double()
    assert ((mean.double() - mean64).abs() <= 1e-6 * scale).all(), (mean, mean64)
    torch.testing.assert_close(var.double(), var64, rtol=1e-5, atol=0)
    looped_plan(layer_norm, x[:3])


def test_values_near_the_maximum_stay_finite_where_the_mean_is():
    """3e38 and -3e38 in a row of randn: the sum of squares overflows (var inf, as eager's),
    the mean is finite and within float32 rounding of its scale (float64 Welford itself lands
    4e19 off the true ~0.01 there)."""
    x = torch.randn(2, ROW)
    x[0, 0], x[0, 5000] = 3e38, -3e38
    var, mean = autofuse.optimize(var_mean, [x])(x)
    ref_var, _ = var_mean(x)
    assert torch.equal(var[0], ref_var[0]) and var[0] == float("inf")
    true = x.double()[0].sum() / ROW  # exact cancellation of the two, then randn's mean
    assert mean[0].isfinite() and abs(mean[0].item() - true.item()) <= 1e-6 * 3e38
    torch.testing.assert_close(mean[1], x[1].mean(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "fill, mean",
    [
        pytest.param({7: float("inf")}, float("inf"), id="inf"),
        pytest.param({7: float("-inf")}, float("-inf"), id="-inf"),
        pytest.param({7: float("inf"), 6000: float("-inf")}, float("nan"), id="both-infs"),
        pytest.param({4100: float("nan")}, float("nan"), id="nan"),
    ],
)
def test_infinities_and_nan_in_a_later_tile(fill, mean):
    """The variance is NaN as eager's; the mean is the row's limit (eager's Welford mean is NaN
    for a row holding one infinity, by where it lies: results/fuzz's class 2494)."""
    x = torch.randn(2, ROW)
    for j, v in fill.items():
        x[0, j] = v
    var, got = autofuse.optimize(var_mean, [x])(x)
    assert var[0].isnan()
    assert got[0].isnan() if mean != mean else got[0] == mean
    ref_var, ref_mean = var_mean(x)
    torch.testing.assert_close(var[1], ref_var[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], ref_mean[1], rtol=1e-5, atol=1e-6)


def test_bf16_rows_and_a_training_step_match_eager():
    x = (torch.randn(4, ROW) * 2 + 5).to(torch.bfloat16)
    looped_plan(layer_norm, x)
    w = torch.randn(ROW, requires_grad=True)
    xs = torch.randn(2, ROW, requires_grad=True)

    def norm(a, w):
        return F.layer_norm(a, (ROW,), w, eps=1e-5)

    ref = norm(xs, w)
    ref.sum().backward()
    gx, gw = xs.grad.clone(), w.grad.clone()
    xs.grad = w.grad = None
    torch._dynamo.reset()
    out = torch.compile(norm, backend="autofuse")(xs, w)
    out.sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(xs.grad, gx, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(w.grad, gw, rtol=1e-3, atol=1e-3)


def test_a_row_gemm_with_a_long_layer_norm_matches_eager():
    """Linear -> LayerNorm over 8192 columns: the GEMM + row kind (where it takes the group)
    folds the moment mean's shifted sum into its max's loop too."""
    a, w = torch.randn(8, 64), torch.randn(ROW, 64) / 8

    def fn(a, w):
        return F.layer_norm(a @ w.t(), (ROW,), eps=1e-12)

    check(fn, [a, w], fused=False)


@pytest.mark.gpu
@pytest.mark.parametrize("fn", [var_mean, layer_norm, group_norm])
def test_gpu_long_rows_match_float64(fn):
    """Rows of a million elements on the GPU (looped kernels, split where the rows are few):
    the moments within float32 rounding of the float64 ones; a constant row exactly 0."""
    torch.manual_seed(0)
    x = torch.randn(4, 2, 1 << 19, device="cuda") * 5 + 3
    x[1] = 0.1  # a constant row
    arg = x if fn is group_norm else x.reshape(8, -1)
    got = autofuse.optimize(fn, [arg])(arg)
    ref = fn(arg.double())
    for g, r in zip(
        got if isinstance(got, tuple) else (got,), ref if isinstance(ref, tuple) else (ref,)
    ):
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-4)
    if fn is var_mean:
        assert torch.equal(got[0][2:4], torch.zeros_like(got[0][2:4]))


@pytest.mark.gpu
def test_gpu_a_pool_takes_the_strided_config_and_matches_eager():
    from autofuse.kernels.pointwise.kind import STRIDED_CONFIG
    from autofuse.plan.steps import KernelStep

    pool = torch.nn.AvgPool3d(2)
    x = torch.rand(4, 8, 16, 64, 64, device="cuda")
    run = autofuse.optimize(pool, [x])
    steps = [s for s in run.plan.steps if isinstance(s, KernelStep)]
    # the rule's config, unless the untuned plan timed the kinds' configs and kept another
    assert any(s.kernel.config == STRIDED_CONFIG or "configs timed alone" in s.reason
               for s in steps)  # fmt: skip
    torch.testing.assert_close(run(x), pool(x))


def softmax_and_max(x):
    m = x.amax(-1, keepdim=True)
    return torch.softmax(x, -1), m, torch.exp(x - m).sum(-1)


@pytest.mark.parametrize(
    "fill",
    [
        pytest.param({0: float("nan")}, id="nan-first-tile"),
        pytest.param({5000: float("nan")}, id="nan-later-tile"),
        pytest.param(
            {j: float("-inf") for j in range(ROW - 1)} | {ROW - 1: float("nan")},
            id="minus-infs-then-nan",
        ),
        pytest.param({j: float("-inf") for j in range(ROW)}, id="all-minus-inf"),
    ],
)
@pytest.mark.parametrize("lanes", [True, False], ids=["interpreter-form", "gpu-form"])
def test_the_riding_sums_maximum_skips_nan_and_the_result_does_not(
    fill, lanes, monkeypatch, tmp_path
):
    """Both forms of the running maximum (``online.lanes_keep_max``): the interpreter's (the
    tiles' shift takes ``tl.max``, a NaN skipped, the maximum kept per lane beside it) and a
    GPU's (the row's accumulator, each tile's maximum a NaN-propagating reduction): the maximum
    the graph returns and every sum of a row holding a NaN are NaN as eager's, with a row of
    ``-inf`` and one NaN (the shift stays ``-inf`` there) among them."""
    from autofuse.kernels.common import emitter

    monkeypatch.setattr(emitter, "lanes_keep_max", lambda: lanes)
    x = torch.randn(3, ROW)
    for j, v in fill.items():
        x[1, j] = v
    plan = looped_plan(softmax_and_max, x)
    assert any(online_pairs(plan.graph, k.info) for k in plan.kernels if k.info.kind == "reduction")
    assert ("tl.max(" in plan.kernels[0].source) == lanes  # the tiles' shift of the form asked
    opt = autofuse.optimize(softmax_and_max, [x], cache_dir=str(tmp_path))
    got, ref = opt(x), softmax_and_max(x)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, equal_nan=True)
    opt = autofuse.optimize(var_mean, [x], cache_dir=str(tmp_path))
    (var, mean), (ref_var, ref_mean) = opt(x), var_mean(x)
    assert var[1].isnan() and ref_var[1].isnan()
    assert mean[1].isnan() if any(v != v for v in fill.values()) else mean[1] == float("-inf")
    torch.testing.assert_close(var[0::2], ref_var[0::2], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mean[0::2], ref_mean[0::2], rtol=1e-5, atol=1e-6)


def test_the_gpu_form_compiles_for_sm90(monkeypatch, tmp_path):
    """The GPU form of the online maximum (each tile's maximum a NaN-propagating reduction into
    the row's accumulator) compiles for an H100 as its launches would (``tests/gpu_compile.py``),
    the softmax and the shifted-sum forms, plain and bounds-guarded."""
    from autofuse.kernels.common import emitter

    from .gpu_compile import compile_for_gpu, recording_launches

    monkeypatch.setattr(emitter, "lanes_keep_max", lambda: False)
    x = torch.randn(3, ROW)
    with recording_launches() as jobs:
        for fn in (softmax_and_max, var_mean):
            opt = autofuse.optimize(fn, [x], cache_dir=str(tmp_path))
            for g, r in zip(opt(x), fn(x)):
                torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
    sources = [j["source"] for j in jobs]
    assert any("running max" in s and "tl.max(" not in s for s in sources)
    assert compile_for_gpu(jobs) == []
