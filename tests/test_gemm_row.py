"""GEMM + row-reduction epilogues (softmax, layernorm, row max over the matmul's output rows) in
one kernel, through the interpreter, with rows longer than one RBLOCK tile."""

import pytest
import torch
import torch.nn.functional as F

from autofuse.capture.trace import capture
from autofuse.kernels.gemm.row import gemm_row_configs
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import build_plan, execute
from experiments.bench.workloads import attention_scores, attention_scores_causal

from .helpers import assert_close, check_partitions, reference


def gemm_layernorm(x, w, g, b):
    return F.layer_norm(x @ w, (w.shape[1],), g, b)


def gemm_row_amax(x, w):
    y = x @ w
    return y.amax(-1), y


def _cases(dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)

    def r(*s):
        return torch.randn(*s, generator=gen).to(dtype)

    return {
        "masked_scores": (attention_scores, (r(2, 32, 16), r(2, 48, 16), torch.rand(32, 48, generator=gen) < 0.2)),
        "causal_scores": (attention_scores_causal, (r(2, 32, 16), r(2, 32, 16))),
        # whole tiles masked (padding columns) and whole rows masked (NaN rows, as in torch)
        "padded_scores": (attention_scores, (r(2, 32, 16), r(2, 48, 16), (torch.arange(48) >= 20).expand(32, 48).clone())),
        "masked_rows": (attention_scores, (r(2, 32, 16), r(2, 48, 16), (torch.arange(32) < 4)[:, None].expand(32, 48).clone())),
        "gemm_layernorm": (gemm_layernorm, (r(24, 20), r(20, 70), r(70), r(70))),
        "gemm_row_amax": (gemm_row_amax, (r(24, 20), r(20, 70))),
    }  # fmt: skip


@pytest.mark.parametrize("name", list(_cases()))
def test_one_kernel_for_gemm_and_row_reduction(name):
    fn, args = _cases()[name]
    graph = capture(fn, args).graph
    space = Partitioner(graph)
    group = max(space.greedy().groups, key=len)
    info = space.check(group)
    assert info.kind == "gemm_row", f"{name}: greedy group is {info}"
    configs = gemm_row_configs(graph, info)
    k = graph[graph[info.matmuls[0]].inputs[0]].shape[-1]
    # one config of each kind: row loop or whole row; A loaded once (one K step) or a K loop
    kinds: dict = {}
    for c in configs:
        kinds.setdefault((c.RBLOCK >= info.rnumel, c.BLOCK_K >= k, c.SKIP), c)
    if "scores" in name or name == "masked_rows":  # a where(mask, -inf, scores) to skip on
        assert (False, True, True) in kinds, sorted(kinds)
    assert (False, True, False) in kinds and (True, True, False) in kinds, sorted(kinds)
    if k > 16:
        assert (False, False, False) in kinds, sorted(kinds)
    refs = reference(fn, args, torch.float32)
    flat = [a for a in args if isinstance(a, torch.Tensor)]
    for cfg in kinds.values():
        plan = build_plan(
            graph,
            space.greedy().groups,
            [cfg if g == group else None for g in space.greedy().groups],
        )
        assert any(k.name.startswith("autofuse_mm") for k in plan.kernels)
        for k, (o, r) in enumerate(zip(execute(plan, flat), refs)):
            assert_close(o, r, torch.float32, f"{name} {cfg.label()} out {k}")


@pytest.mark.parametrize("name", list(_cases()))
def test_every_partition(name):
    fn, args = _cases()[name]
    check_partitions(fn, args, torch.float32, configs_per_group=1, max_enumerate=40, sample=12)


def test_bf16_masked_scores():
    fn, args = _cases(torch.bfloat16)["masked_scores"]
    check_partitions(fn, args, torch.bfloat16, configs_per_group=2, max_enumerate=1, sample=3)


def test_batched_rows_must_divide_block_m():
    q, k = torch.randn(2, 20, 16), torch.randn(2, 20, 16)  # 20 rows: no BLOCK_M >= 16 divides them
    space = Partitioner(capture(attention_scores_causal, (q, k)).graph)
    assert "multiple of a BLOCK_M" in str(space.check(frozenset(space.nodes)))


def _scores(q, k):
    return (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5


def causal(q, k):  # the suite's causal mask, with separate row and column aranges (M != N)
    s = _scores(q, k)
    i, j = torch.arange(q.shape[-2]), torch.arange(k.shape[-2])
    return torch.softmax(s.masked_fill(i[:, None] < j[None, :], float("-inf")), dim=-1)


def causal_kept_where(q, k):  # where(row >= col, s, -inf): the constant where cond is false
    s = _scores(q, k)
    i, j = torch.arange(q.shape[-2]), torch.arange(k.shape[-2])
    return torch.softmax(torch.where(i[:, None] >= j[None, :], s, float("-inf")), dim=-1)


def causal_col_left(q, k):  # col > row, written with the columns on the left
    s = _scores(q, k)
    i, j = torch.arange(q.shape[-2]), torch.arange(k.shape[-2])
    return torch.softmax(s.masked_fill(j[None, :] > i[:, None], float("-inf")), dim=-1)


def anti_causal(q, k):  # the lower triangle masked: live columns start at the row
    s = _scores(q, k)
    i, j = torch.arange(q.shape[-2]), torch.arange(k.shape[-2])
    return torch.softmax(s.masked_fill(j[None, :] < i[:, None], float("-inf")), dim=-1)


def causal_shifted(q, k):  # arange(1, ...) for the rows: one more live column per row
    s = _scores(q, k)
    i, j = torch.arange(1, q.shape[-2] + 1), torch.arange(k.shape[-2])
    return torch.softmax(s.masked_fill(i[:, None] < j[None, :], float("-inf")), dim=-1)


_BOUND_CASES = {
    "causal": (causal, "rhi"),
    "kept_where": (causal_kept_where, "rhi"),
    "col_left": (causal_col_left, "rhi"),
    "anti_causal": (anti_causal, "rlo"),
    "shifted": (causal_shifted, "rhi"),
}


@pytest.mark.parametrize("name", list(_BOUND_CASES))
def test_causal_masks_bound_the_column_loops(name):
    """A mask computed from aranges over rows and columns stops (starts) the column loops at
    the last (first) live column of the program's rows; the tiles past it are stored as the
    constant without a product. Rows longer than one tile, M != N, blocks of unequal sizes."""
    fn, bound = _BOUND_CASES[name]
    gen = torch.Generator().manual_seed(1)
    args = (torch.randn(2, 32, 16, generator=gen), torch.randn(2, 80, 16, generator=gen))
    graph = capture(fn, args).graph
    space = Partitioner(graph)
    group = max(space.greedy().groups, key=len)
    info = space.check(group)
    assert info.kind == "gemm_row"
    refs = reference(fn, args, torch.float32)
    picked = [c for c in gemm_row_configs(graph, info) if not c.SKIP and c.RBLOCK < info.rnumel]
    picked = [c for c in picked if (c.XBLOCK, c.RBLOCK) in {(16, 32), (32, 16), (16, 16)}][:6]
    assert picked
    for cfg in picked:
        groups = space.greedy().groups
        plan = build_plan(graph, groups, [cfg if g == group else None for g in groups])
        src = next(k.source for k in plan.kernels if k.name.startswith("autofuse_mm"))
        assert f"range(0, {bound}, RBLOCK)" in src or f"range({bound}, rnumel" in src, src
        assert "no product" in src
        for o, r in zip(execute(plan, list(args)), refs):
            assert_close(o, r, torch.float32, f"{name} {cfg.label()}")


def test_mask_tensor_gets_no_column_bound():
    fn, args = _cases()["masked_scores"]
    graph = capture(fn, args).graph
    space = Partitioner(graph)
    plan = build_plan(graph, space.greedy().groups)
    src = next(k.source for k in plan.kernels if k.name.startswith("autofuse_mm"))
    assert "rhi" not in src and "rlo" not in src


@pytest.mark.parametrize(
    "name", ["masked_scores", "padded_scores", "masked_rows", "gemm_layernorm"]
)
def test_pipelined_epilogue_loads(name):
    """PIPELINE configs hand the column loops to Triton's pipeliner (tl.range with num_stages),
    so the row-varying epilogue operands (a mask, the layernorm weight and bias) are prefetched
    like the dot's; same values, also when RBLOCK does not divide the row."""
    fn, args = _cases()[name]
    graph = capture(fn, args).graph
    space = Partitioner(graph)
    groups = space.greedy().groups
    group = max(groups, key=len)
    info = space.check(group)
    picked = [c for c in gemm_row_configs(graph, info) if c.PIPELINE and c.XBLOCK == 16]
    widths = {c.RBLOCK for c in picked}
    assert widths and min(widths) < info.rnumel, widths
    refs = reference(fn, args, torch.float32)
    flat = [a for a in args if isinstance(a, torch.Tensor)]
    for cfg in [next(c for c in picked if c.RBLOCK == w) for w in sorted(widths)]:
        plan = build_plan(graph, groups, [cfg if g == group else None for g in groups])
        src = next(k.source for k in plan.kernels if k.name.startswith("autofuse_mm"))
        assert f"RBLOCK, num_stages={cfg.num_stages}):" in src, src
        for k, (o, r) in enumerate(zip(execute(plan, flat), refs)):
            assert_close(o, r, torch.float32, f"{name} {cfg.label()} out {k}")


def test_no_pipeline_configs_without_row_loads():
    fn, args = _cases()["causal_scores"]  # the mask is computed from indices: nothing to load
    graph = capture(fn, args).graph
    space = Partitioner(graph)
    info = space.check(max(space.greedy().groups, key=len))
    assert not any(c.PIPELINE for c in gemm_row_configs(graph, info))


def test_a_one_element_operand_is_loaded_over_the_tile():
    """The backward of ``v.mT @ v`` after a layer_norm over [1] (fuzz graph 7953 of seed 7):
    the row GEMM's B is the [1, 1] incoming gradient, whose offset is a constant; it is loaded
    over the tile (before: no kernel, 'Mask argument cannot be block type'), and the gradients
    equal eager's."""
    import warnings

    import autofuse
    from autofuse.plan.runtime import KernelBuildWarning

    def f(x, w):
        v = F.layer_norm(x.unsqueeze(-1), [1], w)
        return v.mT @ v

    torch.manual_seed(0)
    x, w = torch.randn(24, requires_grad=True), torch.randn(1, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelBuildWarning)
        out = autofuse.optimize(f, [x, w])(x, w)
        gx, gw = torch.autograd.grad(out.sum(), [x, w])
    x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()
    want = f(x2, w2)
    torch.testing.assert_close(out, want)
    for got, ref in zip((gx, gw), torch.autograd.grad(want.sum(), [x2, w2])):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
