"""Numerics at the edges: boolean masks, rows whose max is huge or infinite, empty dims, NaN.

Each check runs the generated kernels through Triton's interpreter and compares them with eager:
NaN where eager has NaN (and nowhere else), the same infinities, finite values within a
dtype-aware tolerance.
"""

import pytest
import torch

import autofuse
from autofuse.capture import capture
from autofuse.kernels import KernelConfig, default_config
from autofuse.partition import Partitioner
from autofuse.plan import build_plan, execute

DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


# ---------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------


def _tuple(x):
    return x if isinstance(x, (tuple, list)) else (x,)


def eager_ref(fn, args):
    """Eager in the inputs' own dtype (``torch.finfo(x.dtype)`` must stay bf16's in bf16)."""
    return list(_tuple(fn(*args)))


def assert_matches(out, ref, what=""):
    """NaN exactly where eager has NaN, the same infinities, finite values within tolerance."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert out.dtype == ref.dtype, f"{what}: dtype {out.dtype} != {ref.dtype}"
    if not ref.is_floating_point():
        assert torch.equal(out, ref), f"{what}: {out} != eager {ref}"
        return
    o, r = out.double(), ref.double()
    bad = torch.isnan(o) != torch.isnan(r)
    assert not bad.any(), (
        f"{what}: NaN positions differ at {bad.nonzero()[:4].tolist()}: "
        f"got {o[bad][:4].tolist()}, eager {r[bad][:4].tolist()}"
    )
    inf = torch.isinf(r) | torch.isinf(o)
    assert torch.equal(o[inf], r[inf]), f"{what}: infinities differ: {o[inf]} vs eager {r[inf]}"
    fin = ~torch.isnan(r) & ~inf
    if fin.any():
        tol = TOL.get(ref.dtype, 1e-5)
        err = (o[fin] - r[fin]).abs()
        lim = tol * torch.maximum(r[fin].abs(), torch.ones_like(err))
        if (err > lim).any():
            k = int((err - lim).argmax())
            raise AssertionError(
                f"{what}: {o[fin][k].item()!r} where eager gives {r[fin][k].item()!r} "
                f"(err {err[k].item():.3g} > {lim[k].item():.3g})"
            )


def greedy_plan(fn, args, config=None):
    """``fn``'s greedy plan, ``config`` for its reduction kernels (default configs if None)."""
    graph = capture(fn, args).graph
    space = Partitioner(graph)
    groups = space.greedy().groups
    kinds = [space.check(g).kind for g in groups]
    return build_plan(graph, groups, [config if k == "reduction" else None for k in kinds])


def run_plan(fn, args, configs=None):
    """Capture ``fn``, build its greedy plan (``configs`` for its reduction kernels, else the
    defaults), run it; returns (outputs, plan)."""
    plan = greedy_plan(fn, args, configs)
    flat = [a for a in args if isinstance(a, torch.Tensor)]
    return execute(plan, flat), plan


def check(fn, args, configs=(None,), fused=True):
    """Every config in ``configs`` (None: the default one) matches eager."""
    refs = eager_ref(fn, args)
    for cfg in configs:
        outs, plan = run_plan(fn, args, cfg)
        if fused:
            assert not plan.fallbacks, [s.reason for s in plan.fallbacks]
        for k, (o, r) in enumerate(zip(outs, refs)):
            assert_matches(o, r, f"{getattr(fn, '__name__', 'fn')} out {k} config {cfg}")
    return plan


# ---------------------------------------------------------------------------------------------
# 1. Boolean logic stays boolean
# ---------------------------------------------------------------------------------------------


def _neg_tril(x):
    n = x.shape[-1]
    keep = torch.ones(n, n, dtype=torch.bool).tril()
    return x.masked_fill(~keep, torch.finfo(x.dtype).min), ~keep


def _triu_and_cmp(x):
    k = torch.ones(x.shape, dtype=torch.bool).triu(1)
    pos = x > 0
    return torch.where(k & ~pos, x, 0.0), torch.where(k | pos, x, -1.0), (k ^ pos).float()


def _logical(x):
    k = torch.ones(x.shape, dtype=torch.bool).tril(-1)
    pos = x > 0.5
    a = torch.logical_and(k, torch.logical_not(pos))
    o = torch.logical_or(~k, pos)
    xo = torch.logical_xor(k, o)
    return x.masked_fill(a, 7.0), torch.where(xo, x, 2.0 * x), a, o, xo


def _mask_input(x, m):
    return x.masked_fill(~m, 0.0), torch.where(m ^ (x < 0), x, -x), ~m & m, ~m | m


BOOL_WARN = "error:tl.where with a non-boolean condition:UserWarning"  # a mask widened to int


@pytest.mark.filterwarnings(BOOL_WARN)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", [_neg_tril, _triu_and_cmp, _logical], ids=lambda f: f.__name__)
def test_bool_masks_fused(fn, dtype):
    x = torch.randn(8, 8 if fn is _neg_tril else 37, generator=torch.Generator().manual_seed(0))
    check(fn, (x.to(dtype),))


@pytest.mark.filterwarnings(BOOL_WARN)
@pytest.mark.parametrize("dtype", DTYPES)
def test_bool_mask_input(dtype):
    g = torch.Generator().manual_seed(1)
    x, m = torch.randn(8, 37, generator=g).to(dtype), torch.rand(8, 37, generator=g) > 0.5
    check(_mask_input, (x, m))


# ---------------------------------------------------------------------------------------------
# 2. Softmax, log_softmax, logsumexp over rows whose max is huge, infinite or NaN
# ---------------------------------------------------------------------------------------------

PERSISTENT_AND_LOOPED = (None, KernelConfig(1, 4, 1), KernelConfig(2, 16, 1))


def softmax(x):
    return torch.softmax(x, -1)


def log_softmax(x):
    return torch.log_softmax(x, -1)


def logsumexp(x):
    return torch.logsumexp(x, -1)


def exp_sum(x):  # the online-softmax pair alone: sum(exp(x - amax(x)))
    return torch.exp(x - x.amax(-1, keepdim=True)).sum(-1)


def extreme_rows(dtype, cols=37, seed=0):
    """One row per hazard: finfo.min (a fully masked row), partly finfo.min, values ~1e10,
    a finfo.max, all -inf, a +inf, a NaN, and values around 1e4."""
    fi = torch.finfo(dtype)
    x = torch.randn(8, cols, generator=torch.Generator().manual_seed(seed)).to(dtype)
    x[0] += 1e4
    x[1] = fi.min
    x[2, :5] = fi.min
    x[3] *= 1e10
    x[4, 3] = fi.max
    x[5] = float("-inf")
    x[6, 2] = float("inf")
    x[7, 4] = float("nan")
    return x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", [softmax, log_softmax, logsumexp, exp_sum], ids=lambda f: f.__name__)
def test_softmax_family_extreme_rows(fn, dtype):
    check(fn, (extreme_rows(dtype),), PERSISTENT_AND_LOOPED)


def hf_masked_softmax(scores, keep):
    """Hugging Face's padding mask: masked scores become finfo.min, not -inf."""
    return torch.softmax(scores.masked_fill(~keep, torch.finfo(scores.dtype).min), -1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fully_masked_padding_row_is_uniform(dtype):
    g = torch.Generator().manual_seed(0)
    scores = (torch.randn(8, 37, generator=g) * 4).to(dtype)
    keep = torch.ones(8, 37, dtype=torch.bool).tril()
    keep[3] = False  # a padding row: eager gives 1/37 everywhere
    check(hf_masked_softmax, (scores, keep), PERSISTENT_AND_LOOPED)
    out, _ = run_plan(hf_masked_softmax, (scores, keep))
    assert torch.allclose(out[0][3].float(), torch.full((37,), 1 / 37), rtol=1e-2)


def scores_softmax(q, k, keep):
    s = q @ k.transpose(-1, -2)
    return torch.softmax(s.masked_fill(~keep, torch.finfo(s.dtype).min), -1)


def scores_exp_sum(q, k, keep):
    s = (q @ k.transpose(-1, -2)).masked_fill(~keep, float("-inf"))
    return torch.exp(s - s.amax(-1, keepdim=True)).sum(-1), torch.logsumexp(s, -1)


@pytest.mark.parametrize("fn", [scores_softmax, scores_exp_sum], ids=lambda f: f.__name__)
def test_gemm_row_extreme_rows(fn):
    """The GEMM + softmax kernel (running max over column tiles): masked rows, huge scores."""
    from autofuse.kernels.gemm.row import gemm_row_configs

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 16, 8, generator=g), torch.randn(2, 40, 8, generator=g)
    q[0, 5] *= 1e9  # scores ~1e10
    keep = torch.rand(16, 40, generator=g) > 0.3
    keep[2] = False  # a fully masked row
    args = (q, k, keep)
    graph = capture(fn, args).graph
    groups = Partitioner(graph).greedy().groups
    infos = [Partitioner(graph).check(gr) for gr in groups]
    row = [i for i, info in enumerate(infos) if info.kind == "gemm_row"]
    assert row, [info.kind for info in infos]
    kinds = {}
    for c in gemm_row_configs(graph, infos[row[0]]):
        kinds.setdefault((c.RBLOCK >= infos[row[0]].rnumel, c.SKIP), c)
    refs = eager_ref(fn, args)
    for cfg in kinds.values():
        plan = build_plan(graph, groups, [cfg if i == row[0] else None for i in range(len(groups))])
        for n, (o, r) in enumerate(zip(execute(plan, list(args)), refs)):
            assert_matches(o, r, f"{fn.__name__} out {n} {cfg}")


# ---------------------------------------------------------------------------------------------
# 3. Empty dims: a zero-length reduced dim (rnumel 0) or an empty kept dim (no programs)
# ---------------------------------------------------------------------------------------------


def rms_norm(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def layer_norm(x):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],))


EMPTY_FNS = {
    "sum": lambda x: x.sum(-1),
    "mean": lambda x: x.mean(-1),
    "prod": lambda x: x.prod(-1),
    "var": lambda x: x.var(-1),
    "sum_dim0": lambda x: x.sum(0),
    "mean_keepdim": lambda x: x.mean(-1, keepdim=True) + x.sum(-1, keepdim=True),
    "softmax": softmax,
    "log_softmax": log_softmax,
    "logsumexp": logsumexp,
    "layer_norm": layer_norm,
    "rms_norm": rms_norm,
    "pointwise": lambda x: torch.exp(x) * 2 + 1,
}


@pytest.mark.parametrize("shape", [(8, 0), (0, 16)], ids=str)
@pytest.mark.parametrize("name", list(EMPTY_FNS))
def test_empty_dims(name, shape):
    """Eager's result (zeros, NaN means, 1 for prod, -inf logsumexp, empty tensors), no crash
    (an rnumel of 0 with the 'block divides the extent' all-true masks read out of bounds)."""
    x = torch.randn(*shape)
    looped = shape[-1] > 4  # an rnumel of 0 is always "persistent"
    configs = (None, KernelConfig(2, 4, 1)) if looped else (None,)
    check(EMPTY_FNS[name], (x,), configs, fused=False)


@pytest.mark.parametrize("op", ["amax", "amin"])
@pytest.mark.parametrize("dim", [-1, 0])
def test_empty_dim_max_raises_as_eager(op, dim):
    x = torch.randn(8, 0) if dim == -1 else torch.randn(0, 8)

    def fn(t):
        return getattr(t, op)(dim)

    with pytest.raises(IndexError) as eager:
        fn(x)
    with pytest.raises(IndexError) as ours:
        autofuse.optimize(fn, (x,))
    assert str(ours.value) == str(eager.value)


def mm_softmax(a, b):
    return torch.softmax(a @ b, -1)


def mm_relu(a, b):
    return torch.relu(a @ b) + 1


@pytest.mark.parametrize("fn", [mm_softmax, mm_relu], ids=lambda f: f.__name__)
@pytest.mark.parametrize("shapes", [((32, 0), (0, 64)), ((0, 16), (16, 64))], ids=str)
def test_empty_matmul_dims(fn, shapes):
    """K = 0 (zeros, then the epilogue) and M = 0, through the GEMM (+ row) kernels."""
    a, b = torch.randn(*shapes[0]), torch.randn(*shapes[1])
    plan = check(fn, (a, b))
    assert any(k.name.startswith("autofuse_mm") for k in plan.kernels)


# ---------------------------------------------------------------------------------------------
# 4. Tuning verifies every candidate on the user's example inputs too
# ---------------------------------------------------------------------------------------------


def _patch_exp_minus(monkeypatch):
    for where in ("common.rewrites", "gemm.row"):  # the modules that render exp(x - rowmax)
        monkeypatch.setattr(f"autofuse.kernels.{where}.exp_minus", _unsafe_exp_minus)


def _unsafe_exp_minus(x, m):  # the pre-fix rewrite: m * log2(e) overflows at m = finfo.min
    return f"tl.exp2(tl.fma({x}, 1.4426950408889634, -({m} * 1.4426950408889634)))"


def _padding_example(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(8, 37, generator=g).to(dtype)
    keep = torch.ones(8, 37, dtype=torch.bool).tril()
    keep[3] = False  # a padding row: every score finfo.min
    return scores, keep


def test_candidate_right_on_random_inputs_wrong_on_examples(monkeypatch):
    from autofuse.measure import Candidate, group_inputs, node_values, verify_candidate

    _patch_exp_minus(monkeypatch)
    args = _padding_example()
    graph = capture(hf_masked_softmax, args).graph
    space = Partitioner(graph)
    (group,) = space.greedy().groups
    info = space.check(group)
    cand = Candidate(graph, info, default_config(info, graph))
    assert "tl.fma" in run_plan(hf_masked_softmax, args)[1].kernels[0].source
    assert verify_candidate(cand) is None  # N(0, 1) scores never reach finfo.min
    why = verify_candidate(cand, inputs=group_inputs(graph, info, node_values(graph, list(args))))
    assert why is not None and "NaN" in why, why


def test_tuning_rejects_candidates_wrong_on_examples(monkeypatch, tmp_path):
    """With the unsafe exp rewrite back, every fused softmax kernel is right on N(0, 1) draws
    and NaN on the padding row of the example inputs: tuning must not pick one."""
    from autofuse.tune import tune

    _patch_exp_minus(monkeypatch)
    args = _padding_example()
    captured = capture(hf_masked_softmax, args)
    result = tune(captured, args, Partitioner(captured.graph), trials=6, cache_dir=str(tmp_path),
                  sampler="random", progress=False, polish=0)  # fmt: skip
    assert result.failed > 0
    assert not any("tl.fma" in k.source for k in result.plan.kernels)
    out = execute(result.plan, list(args))[0]
    assert_matches(out, hf_masked_softmax(*args), "tuned plan on the example inputs")


class _BiasedMaskedSoftmax(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(37))

    def forward(self, scores, keep):
        return hf_masked_softmax(scores + self.bias, keep)


def test_optimize_checks_examples_of_a_module(monkeypatch, tmp_path):
    """Through ``optimize``: the example check runs the graph with the module's parameters."""

    _patch_exp_minus(monkeypatch)
    mod, args = _BiasedMaskedSoftmax(), _padding_example()
    opt = autofuse.optimize(mod, args, trials=4, cache_dir=str(tmp_path), progress=False,
                            polish=0, sampler="random")  # fmt: skip
    assert opt.tuning.failed > 0
    with torch.no_grad():  # the tuned plan (a call that needs autograd takes the backend's)
        assert_matches(opt(*args), mod(*args), "tuned module")


# ---------------------------------------------------------------------------------------------
# Moments (layer_norm, var_mean, var, std) over rows of finfo.min / finfo.max magnitude
# ---------------------------------------------------------------------------------------------


def _moments(x):
    var, mean = torch.var_mean(x, -1, correction=0)
    return layer_norm(x), var, mean, x.var(-1)


def test_moments_of_masked_rows_stay_finite():
    """Eager's Welford moments stay finite on a row of finfo.min (a masked row): layer_norm
    gives 0 there, var_mean (0, finfo.min). sum(x) / n overflowed to -inf and gave NaN. (fp32:
    eager's own bf16 layer_norm on CPU gives +-inf on a constant finfo.min row; the sweep
    below checks bf16 against eager in fp32.)"""
    fi = torch.finfo(torch.float32)
    x = torch.randn(8, 37, generator=torch.Generator().manual_seed(0))
    x[1] = fi.min
    x[2] = fi.max
    x[3, :20] = fi.min
    x[4] *= 1e10
    check(_moments, (x,), PERSISTENT_AND_LOOPED)


# ---------------------------------------------------------------------------------------------
# 5. Extreme-value sweep: every reduction kind x dtype x pattern of hazardous values
# ---------------------------------------------------------------------------------------------

SWEEP_KINDS = {
    "sum": lambda x: x.sum(-1),
    "mean": lambda x: x.mean(-1),
    "amax": lambda x: x.amax(-1),
    "amin": lambda x: x.amin(-1),
    "prod": lambda x: x.prod(-1),
    "softmax": softmax,
    "log_softmax": log_softmax,
    "logsumexp": logsumexp,
    "layer_norm": layer_norm,
    "rms_norm": rms_norm,
}


def _pattern(name, dtype, shape=(8, 37)):
    """An input of ``dtype`` with the hazard ``name``; one hazard per row where it is per row."""
    fi = torch.finfo(dtype)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    if name == "finfo":
        x[0] = fi.min  # a fully masked row, Hugging Face style
        x[1, 3] = fi.max
        x[2, 5] = fi.min
        x[3] *= 1e10  # a huge row max (not 1e10 + O(1e3): a mean that fp32 cannot resolve)
    elif name == "masked":  # a causal mask written with finfo.min, one row fully masked
        x = x.masked_fill(~torch.ones(shape, dtype=torch.bool).tril(), fi.min)
        x[5] = fi.min
    elif name == "inf":
        x[0] = float("-inf")
        x[1, 2] = float("inf")
        x[2, 4] = float("-inf")
        x[3, 0], x[3, 1] = float("inf"), float("-inf")
    elif name == "nan":
        x[1, 4] = float("nan")
        x[5] = float("nan")
    elif name == "subnormal":
        x[0] = (x[0].float() * fi.tiny / 64).to(dtype)
        x[1, ::2] = fi.tiny * 2**-6
        x[2] = (x[2].float() * fi.tiny).to(dtype)
    elif name == "empty_row":
        x = torch.randn(shape[0], 0).to(dtype)
    elif name == "empty_rows":
        x = torch.randn(0, shape[1]).to(dtype)
    return x


PATTERNS = ["finfo", "masked", "inf", "nan", "subnormal", "empty_row", "empty_rows"]


def _skip_reason(kind, pattern):
    if kind in ("amax", "amin") and pattern == "empty_row":
        return "eager raises (test_empty_dim_max_raises_as_eager)"
    # a product of huge (or tiny) factors overflows (underflows) or not depending on the order
    # of the multiplications: eager's order is not part of its contract
    if kind == "prod" and pattern in ("finfo", "masked", "subnormal"):
        return "order-dependent overflow"
    return None


def sweep_ref(fn, x):
    """Eager; bf16 through fp32 and rounded back (the kernels compute bf16 in fp32; eager's
    own bf16 reductions on CPU accumulate in fp32 as well)."""
    if x.dtype == torch.bfloat16:
        return fn(x.float()).to(torch.bfloat16)
    return fn(x)


def sweep_one(kind, dtype, pattern):
    why = _skip_reason(kind, pattern)
    if why:
        pytest.skip(why)
    fn, x = SWEEP_KINDS[kind], _pattern(pattern, dtype)
    ref = sweep_ref(fn, x)
    configs = (None, KernelConfig(2, 16, 1)) if x.shape[-1] > 16 else (None,)
    for cfg in configs:
        out = execute(greedy_plan(fn, (x,), cfg), [x])[0]
        assert_matches(out, ref, f"{kind} {dtype} {pattern} config {cfg}")


# a representative subset: every kind, every pattern, both dtypes
FAST = [
    ("sum", torch.float32, "finfo"), ("sum", torch.bfloat16, "empty_row"),
    ("mean", torch.bfloat16, "masked"), ("mean", torch.float32, "empty_row"),
    ("amax", torch.float32, "nan"), ("amin", torch.bfloat16, "inf"),
    ("prod", torch.float32, "inf"), ("prod", torch.bfloat16, "empty_row"),
    ("softmax", torch.bfloat16, "finfo"), ("softmax", torch.float32, "masked"),
    ("log_softmax", torch.float32, "inf"), ("log_softmax", torch.bfloat16, "nan"),
    ("logsumexp", torch.float32, "masked"), ("logsumexp", torch.bfloat16, "empty_row"),
    ("layer_norm", torch.float32, "subnormal"), ("layer_norm", torch.bfloat16, "inf"),
    ("layer_norm", torch.float32, "masked"), ("layer_norm", torch.bfloat16, "finfo"),
    ("rms_norm", torch.bfloat16, "subnormal"), ("rms_norm", torch.float32, "empty_rows"),
]  # fmt: skip


@pytest.mark.parametrize("kind, dtype, pattern", FAST, ids=str)
def test_extreme_value_sweep(kind, dtype, pattern):
    sweep_one(kind, dtype, pattern)


def test_the_fast_sweep_covers_every_kind_pattern_and_dtype():
    """The default run's subset stays representative as kinds and patterns are added (the
    whole product runs with ``-m exhaustive``)."""
    assert {k for k, _, _ in FAST} == set(SWEEP_KINDS)
    assert {p for _, _, p in FAST} == set(PATTERNS)
    assert {d for _, d, _ in FAST} == set(DTYPES)


@pytest.mark.exhaustive
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", list(SWEEP_KINDS))
def test_extreme_value_sweep_exhaustive(kind, dtype, pattern):
    sweep_one(kind, dtype, pattern)


def test_a_reference_beyond_the_output_dtype_is_its_infinity():
    """(1 - m) * finfo(bf16).min with m = -7 overflows bf16 in eager too: not a wrong result."""
    from autofuse.measure.verify import compare

    ref = torch.tensor([8.0 * torch.finfo(torch.bfloat16).min, 1.0], dtype=torch.float64)
    out = ref.to(torch.bfloat16)
    assert torch.isinf(out[0])
    assert compare(out, ref, "bfloat16", 0) is None
    assert compare(torch.tensor([0.0, 1.0], dtype=torch.bfloat16), ref, "bfloat16", 0)


def test_interpreter_rounds_bf16_casts_like_the_gpu():
    """A float32 -> bf16 cast in a generated kernel rounds to nearest even (the interpreter
    alone truncated: 999.9 -> 996), ties to even, overflow to inf, NaN kept."""
    from autofuse.interpreter import interpreting

    if not interpreting():
        pytest.skip("the interpreter's cast; a GPU rounds natively")
    x = torch.tensor(
        [999.9, 1001.9, 1.00390625, 1.01171875, 3.999, -1001.9, 0.1, 3.4e38, -3.39e38, 1e-40]
        + [float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 7.99],
        dtype=torch.float32,
    )
    out, _ = run_plan(lambda t: (t * 1.0).to(torch.bfloat16), (x,))
    want = x.to(torch.bfloat16)
    finite = ~x.isnan()
    assert torch.equal(out[0].view(torch.int16)[finite], want.view(torch.int16)[finite])
    assert out[0][~finite].isnan().all()


def test_example_check_of_a_group_that_loads_nothing_runs_on_the_examples_device(monkeypatch):
    """A kernel computing a mask from indices alone (``ones(n, n).tril()``) loads nothing: its
    example check runs on the device the examples are on, not on the CPU by default (which
    failed every such candidate on CUDA: 'cannot verify on CPU')."""
    from autofuse.measure import Candidate, node_values
    from autofuse.tune.tuner import Objective

    def causal_fill(x):
        keep = torch.ones(x.shape[-1], x.shape[-1], dtype=torch.bool).tril()
        return x.masked_fill(~keep, -1.0) * 2.0

    x = torch.randn(5, 5)
    graph = capture(causal_fill, (x,)).graph
    space = Partitioner(graph)
    infos = [space.check(g) for p in space.partitions() for g in p.groups]
    info = next(i for i in infos if not isinstance(i, str) and not i.loads)
    values = {k: v.to("meta") for k, v in node_values(graph, [x]).items()}
    seen = []
    monkeypatch.setattr(
        "autofuse.tune.tuner.verify_candidate", lambda c, device, inputs: seen.append(device)
    )
    obj = Objective(graph, space, None, None, example_values=values)
    obj.check_examples(Candidate(graph, info, default_config(info, graph)))
    assert [d.type for d in seen] == ["meta"]


@pytest.mark.parametrize("rblock", [64, 1024], ids=["looped", "persistent"])
def test_ill_conditioned_results_are_judged_against_eagers_own_error(rblock):
    """x / x.sum() over rows that cancel to ~1e-3: float32 eager is itself ~1e-3 off the
    float64 reference there, so the fixed float32 tolerance would reject every correct kernel
    (it rejected a looped softmax normalizer on CUDA). The check accepts twice eager's own
    error, and still rejects a kernel that is wrong."""
    from autofuse.ir.eager import run_graph
    from autofuse.kernels.common.configs import KernelConfig
    from autofuse.measure import Candidate, verify_candidate
    from autofuse.measure.verify import compare, reference_outputs

    def normalize(x):
        return x / x.sum(-1, keepdim=True)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 1000, generator=g)
    x = x - x.mean(-1, keepdim=True) + 1e-6
    graph = capture(normalize, (x,)).graph
    space = Partitioner(graph)
    (group,) = space.greedy().groups
    cand = Candidate(graph, space.check(group), KernelConfig(1 if rblock > 64 else 2, rblock, 2))
    assert verify_candidate(cand, inputs=[x]) is None
    (ref,) = reference_outputs(graph, [x])
    (eager,) = run_graph(graph, [x])
    assert compare(eager, ref, "float32", 0) is not None  # the fixed tolerance fails eager itself
    wrong = eager * 1.01
    assert compare(wrong, ref, "float32", 0, eager) is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_round_half_to_even_over_the_whole_range(dtype):
    """torch.round in a kernel (the adder's own round-to-nearest-even on |x| + 2**23, 2**52 in
    float64): ties, values next to the integer threshold, huge, infinite, NaN and signed zeros
    as eager, and float64 values between 2**23 and 2**52 rounded too."""
    vals = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4, 2.6, -2.6, 0.49999997, 4194304.5, 8388607.5,
            -8388607.5, 8388609.0, 1e10, -1e10, float("nan"), float("inf"), -float("inf"), 0.0,
            -0.0, 1e-30, 3.5, 4.5, 1e15 + 0.5, -(2.0**40) - 0.5, 2.0**52 + 1]  # fmt: skip
    x = torch.tensor(vals, dtype=torch.float64).to(dtype)

    def rounded(t):
        return torch.round(t) * 1.0

    out = autofuse.optimize(rounded, (x,))(x)
    assert torch.equal(out.nan_to_num(7.0), rounded(x).nan_to_num(7.0)), (out, rounded(x))
