"""The ops real models use, lowered into kernels with their neighbours (issue 14): each case is
captured, partitioned greedily (and over sampled partitions / configs) and run through the
interpreter against eager, in fp32 and bf16, on shapes that are not multiples of the block."""

import pytest
import torch
import torch.nn.functional as F

from autofuse.capture.trace import capture
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import build_plan, execute

from .helpers import (
    ROW_CLASSES,
    assert_close,
    check_config_classes,
    check_partitions,
    reference,
    row_class,
)

DTYPES = [torch.float32, torch.bfloat16]


def greedy(fn, args):
    """The greedy plan of ``fn`` on ``args`` and its outputs."""
    graph = capture(fn, args).graph
    plan = build_plan(graph, Partitioner(graph).greedy().groups)
    return plan, execute(plan, [a for a in args if isinstance(a, torch.Tensor)])


def check_fused(fn, args, dtype, kernels=None, op=None):
    """The greedy plan has no eager step (``kernels`` kernels if given, one holding ``op``)
    and equals eager; returns the plan."""
    plan, outs = greedy(fn, args)
    assert not plan.fallbacks, [s.reason for s in plan.fallbacks]
    if kernels is not None:
        assert len(plan.kernels) == kernels, [k.name for k in plan.kernels]
    if op is not None:
        fused = {plan.graph[n].op for k in plan.kernels for n in k.info.nodes}
        assert op in fused, sorted(fused)
    for k, (o, r) in enumerate(zip(outs, reference(fn, args, dtype), strict=True)):
        assert_close(o, r, dtype, f"{fn.__name__} out {k}")
    return plan


def rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# ---------------------------------------------------------------------------------------------
# 1. cat / stack / split / chunk / unbind / slices
# ---------------------------------------------------------------------------------------------


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope(q, cos, sin):
    return q * cos + rotate_half(q) * sin


def splits(x):
    a, b = x.split([3, 6], dim=-1)
    c, d = x.chunk(2, dim=0)
    e = x.unbind(1)
    return a.sum(-1) + b.amax(-1), c * d, e[2] + e[5], torch.stack([a[:, 0], b[:, 1]], -1) * 2


def cat_softmax(x, y):
    # the cat runs along the reduced dim: in a looped kernel each chunk straddles both inputs
    return torch.softmax(torch.cat([x, y * 2.0, x[:, :3]], dim=-1), dim=-1)


def cat_mixed(x, n, m):
    # int + float promotes to float; bool + bool stays bool; a cat along a leading dim
    return torch.cat([x, n], 0) * 0.5, torch.cat([m, ~m], 1), torch.stack([x, x.exp()]).sum(0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_rotate_half_is_one_kernel(dtype):
    q, cos, sin = rand(3, 5, 14, dtype=dtype), rand(5, 14, dtype=dtype, seed=1), rand(5, 14, seed=2)
    q[0, 0, :4] = torch.tensor([float("inf"), float("nan"), -3e38, 0.0])
    sin = sin.to(dtype)
    plan = check_fused(rope, (q, cos, sin), dtype, kernels=1, op="cat")
    src = plan.kernels[0].source
    # every read in a cat branch is masked to the lanes that branch selects
    loads = [ln for ln in src.splitlines() if "tl.load(in_ptr0" in ln]
    assert len(loads) == 3 and sum(">= 7" in ln or "< 7" in ln for ln in loads) == 2, src
    check_partitions(rope, (q, cos, sin), dtype, configs_per_group=2, max_enumerate=40)


def slice_scatters(base, a, b, c):
    # a slice's backward (zeros + the gradient of the slice, as RoPE's rotate_half backward
    # writes it), a middle slice, negative bounds, an end past the size, a leading dim
    zeros = torch.zeros_like(base)
    return (
        torch.slice_scatter(zeros, a, dim=-1, start=7),
        torch.slice_scatter(base, b * 2.0, dim=-1, start=3, end=-5) + 1.0,
        torch.slice_scatter(base, c, dim=0, start=-2, end=2**62).exp(),
    )


def upcasts(x):
    # norm backwards upcast with memory_format=torch.contiguous_format
    return torch.ops.aten._to_copy(x, dtype=torch.float32, memory_format=torch.contiguous_format)


@pytest.mark.parametrize("dtype", DTYPES)
def test_slice_scatter_is_a_cat_and_fuses(dtype):
    base, a = rand(3, 4, 14, dtype=dtype), rand(3, 4, 7, dtype=dtype, seed=1)
    b, c = rand(3, 4, 6, dtype=dtype, seed=2), rand(2, 4, 14, dtype=dtype, seed=3)
    plan = check_fused(slice_scatters, (base, a, b, c), dtype, op="cat")
    assert "slice_scatter" not in {n.op for n in plan.graph.nodes}
    check_partitions(slice_scatters, (base, a, b, c), dtype, configs_per_group=1, sample=4)
    x = rand(5, 6, dtype=dtype)
    check_fused(upcasts, (x,), dtype, kernels=1)
    stepped = capture(lambda t, u: torch.slice_scatter(t, u, 1, 0, 6, 2), (x, x[:, ::2] * 1))
    assert [n.op for n in stepped.graph.nodes if n.kind == "opaque"]  # a step: eager, as said


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_chunk_unbind_stack_are_views_and_cats(dtype):
    x = rand(4, 9, dtype=dtype)
    graph = capture(splits, (x,)).graph
    assert not [n for n in graph.nodes if n.kind == "opaque" or n.op == "getitem"]
    check_fused(splits, (x,), dtype)
    check_partitions(splits, (x,), dtype, configs_per_group=1, max_enumerate=1, sample=6)


def cat_inputs(dtype):
    x, y = rand(3, 11, dtype=dtype), rand(3, 7, dtype=dtype, seed=1)
    x[1, 2] = float("-inf")
    return x, y


@pytest.mark.parametrize("dtype", DTYPES)
def test_cat_along_a_reduced_dim_persistent_and_looped(dtype):
    args = cat_inputs(dtype)
    check_fused(cat_softmax, args, dtype, kernels=1, op="cat")
    assert check_config_classes(cat_softmax, args, dtype, row_class(18)) == ROW_CLASSES
    check_partitions(cat_softmax, args, dtype, configs_per_group=2, max_enumerate=4, sample=8)


def test_cat_promotes_dtypes_and_keeps_bools():
    x = rand(2, 5)
    n = torch.arange(15).reshape(3, 5)
    m = rand(2, 3, seed=3) > 0
    plan = check_fused(cat_mixed, (x, n, m), torch.float32)
    assert all("cat" in k.name or "sum" in k.name for k in plan.kernels)


# ---------------------------------------------------------------------------------------------
# 2. gather / index / embedding / index_select
# ---------------------------------------------------------------------------------------------


def target_logprob(x, t):
    return torch.log_softmax(x, 1).gather(1, t[:, None])


def cross_entropy(x, t):
    return F.cross_entropy(x, t, ignore_index=-100)


def embeddings(ids, wte, wpe, w, b):
    pos = torch.arange(ids.shape[-1], device=ids.device)
    h = F.embedding(ids, wte) + F.embedding(pos, wpe)
    return F.layer_norm(h, (h.shape[-1],), w, b)


def indexing(x, i, j):
    # advanced indexing (negative indices count from the end), index_select, a gather along a
    # leading dim, an int32 index
    return (
        x[i] * 2.0,
        x.index_select(1, i.abs()) + 1.0,
        x.gather(0, j) - x[:2, :4],
        x[:, j[0].int()],
    )


def target_inputs(dtype):
    x, t = rand(5, 13, dtype=dtype), torch.tensor([1, 12, 3, 0, 7])
    x[2, :3] = torch.tensor([-3e38, 3e38, float("-inf")]).to(dtype)
    return x, t


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_target_pick_fuses(dtype):
    x, t = target_inputs(dtype)
    check_fused(target_logprob, (x, t), dtype, kernels=1, op="gather")
    assert check_config_classes(target_logprob, (x, t), dtype, row_class(13)) == ROW_CLASSES
    check_partitions(target_logprob, (x, t), dtype, configs_per_group=2, max_enumerate=4, sample=8)
    t2 = torch.tensor([1, -100, 3, 0, -100])
    check_fused(cross_entropy, (x, t2), dtype, op="gather")


@pytest.mark.parametrize("dtype", DTYPES)
def test_token_and_position_embeddings_fuse_with_layernorm(dtype):
    ids = torch.tensor([[3, 0, 9, 9, 1], [2, 8, 4, 0, 5]])
    wte, wpe = rand(10, 12, dtype=dtype), rand(5, 12, dtype=dtype, seed=1)
    w, b = rand(12, dtype=dtype, seed=2), rand(12, dtype=dtype, seed=3)
    check_fused(embeddings, (ids, wte, wpe, w, b), dtype, kernels=1, op="take")
    check_partitions(embeddings, (ids, wte, wpe, w, b), dtype, configs_per_group=3, sample=6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_select_gather_and_advanced_indexing(dtype):
    x = rand(5, 6, dtype=dtype)
    i, j = torch.tensor([0, 4, -2]), torch.tensor([[4, 0, 1, 1], [3, 3, 2, 0]])
    graph = capture(indexing, (x, i, j)).graph
    assert not [n for n in graph.nodes if n.kind == "opaque"]
    check_fused(indexing, (x, i, j), dtype)


def test_out_of_range_index_fails_like_eager():
    wte, wpe = rand(10, 12), rand(5, 12)
    w, b = torch.ones(12), torch.zeros(12)
    ids = torch.tensor([[3, 0, 9, 9, 1], [2, 8, 4, 0, 5]])
    plan, _ = greedy(embeddings, (ids, wte, wpe, w, b))
    assert "tl.device_assert" in plan.kernels[0].source
    for bad in (10, -1):
        ids2 = ids.clone()
        ids2[1, 3] = bad
        with pytest.raises(IndexError, match="index out of range in self"):
            embeddings(ids2, wte, wpe, w, b)
        with pytest.raises(Exception, match="index out of range in self"):
            execute(plan, [ids2, wte, wpe, w, b])
    x, t = rand(5, 13), torch.tensor([1, 12, 3, 0, 7])
    plan, _ = greedy(target_logprob, (x, t))
    with pytest.raises(Exception, match="index out of range in self"):
        execute(plan, [x, torch.tensor([1, 13, 3, 0, 7])])


# ---------------------------------------------------------------------------------------------
# 3. any / all, *_like constants, where on bool expressions, in-place ops, causal masks
# ---------------------------------------------------------------------------------------------


def bool_reductions(x, m):
    return m.any(), m.all(-1), (x > 0.5).any(0), x.any(), (x != x).any(1, keepdim=True), m.all()


def constants_and_inplace(x, y):
    h = x * 2.0
    h.add_(1.0)  # functionalized: an out-of-place add that fuses
    h[:, 0].mul_(3.0)  # a mutation through a view: a where over the column
    z = torch.zeros_like(x)
    z += h
    c = torch.ones_like(x) + torch.full_like(x, 2.5) + x.new_zeros(x.shape) + x.new_ones(x.shape)
    s = torch.scalar_tensor(3.0, dtype=x.dtype) * y
    return h.relu(), z, c * y, torch.where((x > 0) & ~(y < 0) | (x == y), x, s)


def causal_masked_softmax(s):
    n = s.shape[-1]
    mask = torch.ones(n, n, dtype=torch.bool, device=s.device).tril()
    return torch.softmax(s.masked_fill(~mask, torch.finfo(s.dtype).min), dim=-1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_any_all_reduce_truth_values(dtype):
    x = rand(3, 7, dtype=dtype)
    x[1, :] = 0.0
    x[2, 3] = float("nan")  # NaN is true, as in eager
    m = rand(3, 7, seed=1) > 0.3
    m[0] = True
    graph = capture(bool_reductions, (x, m)).graph
    assert "any" in {n.op for n in graph.nodes}  # all(x) is not any(not x)
    check_fused(bool_reductions, (x, m), dtype)
    check_partitions(bool_reductions, (x, m), dtype, configs_per_group=3, max_enumerate=1, sample=4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_like_constants_and_inplace_ops_fuse(dtype):
    x, y = rand(3, 7, dtype=dtype), rand(3, 7, dtype=dtype, seed=1)
    graph = capture(constants_and_inplace, (x, y)).graph
    assert not [n for n in graph.nodes if n.kind == "opaque"], graph.pretty()
    check_fused(constants_and_inplace, (x, y), dtype)


def test_inplace_op_on_an_input_still_mutates_it():
    def f(x):
        x.mul_(2.0)
        return x + 1.0

    x = rand(3, 5)
    graph = capture(f, (x.clone(),)).graph
    plan = build_plan(graph, Partitioner(graph).greedy().groups)
    x1, x2 = x.clone(), x.clone()
    out = execute(plan, [x1])[0]
    assert torch.equal(out, f(x2)) and torch.equal(x1, x2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_mask_from_tril_fuses_into_the_softmax(dtype):
    s = rand(2, 9, 9, dtype=dtype)
    plan = check_fused(causal_masked_softmax, (s,), dtype, kernels=1)
    # the mask's aranges stay 32-bit integers (no emulated 64-bit compare per element) ...
    assert "tl.int64" not in plan.kernels[0].source, plan.kernels[0].source


def test_aranges_that_could_overflow_int32_stay_int64():
    # ... unless an arange's values could grow past what the int32 rewrite allows: a multiply
    # (2**25 * i overflows int32 from i = 64), or values from 2**25 on
    def scaled(x):
        return x + (torch.arange(x.shape[0]) * 2**25 > 3).to(x.dtype)

    def far(x):
        n = x.shape[0]
        return x + (torch.arange(2**25, 2**25 + n) - 2**25 >= 40 - torch.arange(n)).to(x.dtype)

    for fn in (scaled, far):
        plan = check_fused(fn, (rand(70),), torch.float32)
        assert all("tl.int64" in k.source for k in plan.kernels), fn.__name__


# ---------------------------------------------------------------------------------------------
# 4. vector_norm / F.normalize, group_norm, batch_norm (inference and training), column stats
# ---------------------------------------------------------------------------------------------


def vector_norms(x):
    vn = torch.linalg.vector_norm
    return (
        F.normalize(x, dim=-1),
        vn(x, 1, -1),
        vn(x, float("inf"), -1),
        vn(x, float("-inf"), 0),
        vn(x, 2, (0, 1)),
        vn(x, 3.0, 0),
    )


def group_norm_silu(x, w, b):
    return F.silu(F.group_norm(x, 2, w, b, eps=1e-5))


def batch_norms(x, w, b, rm, rv):
    inference = F.batch_norm(x, rm, rv, w, b, training=False, eps=1e-5)
    training = F.batch_norm(x, None, None, w, b, training=True, eps=1e-5)
    return F.relu(inference), training


def column_stats(x):
    return x.mean(0), x.var(0), x.mean((2, 3)) if x.dim() == 4 else x.std(0, keepdim=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_vector_norms_are_reductions(dtype):
    x = rand(5, 11, dtype=dtype)
    x[0, 0], x[1, :] = -40.0, 0.0  # a zero row: normalize divides by eps
    graph = capture(vector_norms, (x,)).graph
    assert not [n for n in graph.nodes if n.kind == "opaque"]
    check_fused(vector_norms, (x,), dtype)
    check_partitions(vector_norms, (x,), dtype, configs_per_group=3, max_enumerate=1, sample=4)


def group_norm_inputs(dtype):
    x = rand(2, 6, 3, 5, dtype=dtype)
    x[0, :3] = x[0, :3] * 50.0 + 1e3  # one group far from zero
    return x, rand(6, dtype=dtype, seed=1), rand(6, dtype=dtype, seed=2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_group_norm_silu_has_no_eager_step(dtype):
    # one kernel: the group statistics over x viewed as [N, G, C/G * HxW], and the per-channel
    # affine and SiLU over [N, C, H, W] stored at the domain's flat index (a reshape of it)
    args = group_norm_inputs(dtype)
    check_fused(group_norm_silu, args, dtype, kernels=1)
    check_partitions(group_norm_silu, args, dtype, configs_per_group=2, max_enumerate=1, sample=4)


# the default run's partition checks above with the sweeps as first written: more sampled
# partitions (24), more configs each
SWEEPS = {
    "cat_softmax": (cat_softmax, cat_inputs, 6, 4),
    "target_logprob": (target_logprob, target_inputs, 6, 4),
    "group_norm_silu": (group_norm_silu, group_norm_inputs, 3, 1),
}


@pytest.mark.exhaustive
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", sorted(SWEEPS))
def test_sampled_partitions_exhaustive(case, dtype):
    fn, make, configs, enumerate_up_to = SWEEPS[case]
    check_partitions(
        fn, make(dtype), dtype, configs_per_group=configs, max_enumerate=enumerate_up_to
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_norm_inference_and_training(dtype):
    x = rand(3, 4, 3, 5, dtype=dtype)
    w, b = rand(4, dtype=dtype, seed=1), rand(4, dtype=dtype, seed=2)
    rm, rv = rand(4, dtype=dtype, seed=3), (rand(4, seed=4).abs() + 0.5).to(dtype)
    graph = capture(batch_norms, (x, w, b, rm, rv)).graph
    assert not [n for n in graph.nodes if n.kind == "opaque"]
    check_fused(batch_norms, (x, w, b, rm, rv), dtype, kernels=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_column_stats_and_global_average_pool(dtype):
    check_fused(column_stats, (rand(7, 5, dtype=dtype),), dtype)
    check_fused(column_stats, (rand(2, 3, 5, 7, dtype=dtype),), dtype)


# ---------------------------------------------------------------------------------------------
# The model-style functions of experiments/bench/model_functions.py
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_model_functions_equal_eager_with_no_eager_step(dtype):
    import autofuse
    from experiments.bench.model_functions import MODEL_FUNCTIONS, NO_EAGER_STEP

    steps = {}
    for w in MODEL_FUNCTIONS:
        args = w.inputs("cpu", dtype)
        fast = autofuse.optimize(w.fn, args)
        out = fast(*args)
        outs = out if isinstance(out, tuple) else (out,)
        for k, (o, r) in enumerate(zip(outs, reference(w.fn, args, dtype), strict=True)):
            assert_close(o, r, dtype, f"{w.name} out {k}")
        steps[w.name] = [fast.plan.graph[s.node].attr("target") for s in fast.plan.fallbacks]
    print({name: len(s) for name, s in steps.items()})  # eager steps per function
    assert not {n: s for n, s in steps.items() if n in NO_EAGER_STEP and s}


def test_fresh_index_inputs_stay_in_range():
    """Verification's fresh random draws keep an index tensor inside the dim it indexes (an
    index out of range is a device-side assert, which ends a CUDA process) and nonconstant."""
    from autofuse.measure.verify import index_bounds, random_inputs

    def f(ids, labels, wte, logits):
        pick = torch.gather(logits, 1, torch.where(labels < 0, 0, labels)[:, None])
        return F.embedding(ids + 1, wte), pick

    ids = torch.randint(0, 2, (4, 5))
    labels = torch.tensor([3, -100, 0, 2])
    args = (ids, labels, torch.randn(3, 6), torch.randn(4, 5))
    g = capture(f, args).graph
    bounds = index_bounds(g)
    assert sorted(bounds.values()) == [3, 5]
    for seed in range(5):
        for node, x in zip(g.inputs, random_inputs(g, "cpu", seed)):
            if node in bounds:
                assert 0 <= int(x.min()) and int(x.max()) < bounds[node]
                assert x.unique().numel() > 1


def test_fresh_index_inputs_of_multi_index_and_scatter_stay_in_range():
    from autofuse.measure.verify import index_bounds, random_inputs

    def f(x, i, j, g, src):
        return x[i, :, j], torch.zeros(4, 6).index_put((g,), src, accumulate=True)

    args = (torch.randn(3, 5, 7), torch.tensor([0, 2]), torch.tensor([6, 1]),
            torch.tensor([3, 0, 3]), torch.randn(3, 6))  # fmt: skip
    g = capture(f, args).graph
    bounds = index_bounds(g)
    assert sorted(bounds.values()) == [3, 4, 7]
    for seed in range(3):
        for node, x in zip(g.inputs, random_inputs(g, "cpu", seed)):
            if node in bounds:
                assert 0 <= int(x.min()) and int(x.max()) < bounds[node]
