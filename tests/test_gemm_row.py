"""GEMM + row-reduction epilogues (softmax, layernorm, row max over the matmul's output rows) in
one kernel, through the interpreter, with rows longer than one RBLOCK tile."""

import pytest
import torch
import torch.nn.functional as F

from autofuse.capture import capture
from autofuse.gemm import gemm_row_configs
from autofuse.partition import Partitioner
from autofuse.runtime import build_plan, execute
from experiments.workloads import attention_scores, attention_scores_causal

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
