"""A ``where`` with a constant branch reads its other branch only on the lanes that take it
(``masked_fill(~tril, finfo.min)`` reads the kept half of the scores): same values as eager,
masked lanes never read, persistent and looped kernels."""

import dataclasses

import pytest
import torch

from autofuse.capture.trace import capture
from autofuse.kernels import config_space, default_config
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import build_plan, execute
from experiments.bench.model_functions import causal_softmax
from tests.helpers import assert_close, reference

DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


def padded_softmax(x, keep):
    return torch.softmax(x.masked_fill(~keep, torch.finfo(x.dtype).min), dim=-1)


def kept_and_reused(x, keep):
    return torch.where(keep, x, 0.0) + x  # x is read by the add too: loaded everywhere


def _plans(fn, args):
    """The greedy grouping at the default config and at a looped one (RBLOCK below the row)."""
    graph = capture(fn, args).graph
    groups = Partitioner(graph).greedy().groups
    infos = [Partitioner(graph).check(g) for g in groups]
    yield build_plan(graph, groups, [default_config(i, graph) for i in infos])
    looped = []
    for i in infos:
        space = [c for c in config_space(i, graph) if getattr(c, "RBLOCK", 1 << 30) < i.rnumel]
        looped.append(space[0] if space else default_config(i, graph))
    yield build_plan(graph, groups, looped)


def _check(fn, args, dtype, selective: bool):
    refs = reference(fn, args, dtype)
    for plan in _plans(fn, args):
        assert len(plan.kernels) == 1, [k.name for k in plan.kernels]
        k = plan.kernels[0]
        read = [plan.graph[k.info.loads[j]].name for j in k.meta.selective_loads]
        assert read == (["arg0_1"] if selective else []), (read, k.source)
        for o, r in zip(execute(plan, [a for a in args if isinstance(a, torch.Tensor)]), refs):
            assert_close(o, r, dtype, fn.__name__)


@DTYPES
def test_causal_softmax_reads_the_kept_half(dtype):
    x = torch.randn(2, 3, 37, 37).to(dtype)
    x[0, 0].triu_(1).masked_fill_(torch.ones(37, 37, dtype=torch.bool).triu(1), float("nan"))
    _check(causal_softmax, (x,), dtype, selective=True)  # NaN only where masked: none out


@DTYPES
def test_padding_mask_fully_masked_rows_as_eager(dtype):
    x = torch.randn(3, 5, 33).to(dtype)
    keep = torch.rand(3, 5, 33) > 0.3
    keep[1, 2] = False  # a fully masked row: eager gives a uniform row
    x[0, 0, 0] = float("inf")  # unmasked extremes still reach the softmax
    keep[0, 0, 0] = True
    _check(padded_softmax, (x, keep), dtype, selective=True)


def test_branch_read_elsewhere_is_loaded_everywhere():
    x, keep = torch.randn(4, 19), torch.rand(4, 19) > 0.5
    _check(kept_and_reused, (x, keep), torch.float32, selective=False)


def seed_reduction(x):
    return (x * 2.0).sum(-1) + 1.0


def row_softmax(x):
    return torch.softmax(x, -1)


@pytest.mark.parametrize("fn, streamed", [(seed_reduction, True), (row_softmax, False)])
def test_looped_reduction_streams_what_one_loop_reads(fn, streamed):
    """A looped reduction reading x in one column loop loads it evict-first; a looped softmax
    re-reads x in later loops and keeps the default policy (its rows stay in cache)."""
    x = torch.randn(4, 300)
    persistent, looped = _plans(fn, (x,))
    assert looped.kernels[0].config.RBLOCK < 300
    assert ("evict_first" in looped.kernels[0].source) == streamed, looped.kernels[0].source
    assert "evict_first" not in persistent.kernels[0].source  # no loop: nothing streams
    assert_close(execute(looped, [x])[0], fn(x), torch.float32, fn.__name__)


def test_broadcast_loads_are_kept_in_cache_and_streamed_ones_are_not():
    """RoPE's cos/sin (one row per position, read again for every head) load ``evict_last``;
    q and k (each element read by one program) keep the default policy; values as eager."""
    from experiments.bench.model_functions import rope_apply

    q, k = torch.randn(2, 3, 5, 14), torch.randn(2, 3, 5, 14)
    cos, sin = torch.randn(2, 5, 14), torch.randn(2, 5, 14)
    graph = capture(rope_apply, (q, k, cos, sin)).graph
    groups = Partitioner(graph).greedy().groups
    infos = [Partitioner(graph).check(g) for g in groups]
    plan = build_plan(graph, groups, [default_config(i, graph) for i in infos])
    (kernel,) = plan.kernels
    loads = kernel.info.loads
    kept = {graph[loads[p]].shape for p in kernel.meta.kept_loads}
    assert kept == {(2, 5, 14)}, kept  # cos and sin, not q / k
    assert len(kernel.meta.kept_loads) == 2
    assert kernel.source.count("evict_last") == 2, kernel.source
    for got, want in zip(execute(plan, [q, k, cos, sin]), rope_apply(q, k, cos, sin)):
        assert_close(got, want, torch.float32, "rope_apply")


def test_one_stage_looped_reduction_launches_unpipelined_and_is_a_searched_option():
    """``ONE_STAGE`` (a looped reduction launched with num_stages=1, as Inductor launches its
    reductions) is in the looped configs' space, is the same kernel body with another launch,
    gives eager's values, and the search's option switches offer it on the greedy plan."""
    from autofuse.tune.climb import option_switches

    x = torch.randn(4, 300)
    graph = capture(seed_reduction, (x,)).graph
    (group,) = Partitioner(graph).greedy().groups
    info = Partitioner(graph).check(group)
    space = config_space(info, graph)
    looped = next(c for c in space if c.RBLOCK < 300 and not c.ONE_STAGE)
    one = next(c for c in space if c == dataclasses.replace(looped, ONE_STAGE=True))
    plans = [build_plan(graph, [group], [c]) for c in (looped, one)]
    (a,), (b,) = (p.kernels for p in plans)
    assert b.source.replace(" ONE_STAGE", "") == a.source  # its config line aside
    assert f"#   config: {one.label()}" in b.source
    assert ("num_stages", 1) in b.launch_kw and ("num_stages", 1) not in a.launch_kw
    assert_close(execute(plans[1], [x])[0], seed_reduction(x), torch.float32, "one stage")
    assert one in option_switches(looped, space)
    persistent = default_config(info, graph)
    assert not any(c.ONE_STAGE and c.RBLOCK >= 300 for c in space), persistent


def bias_grad_of_cat(a, b, c):
    g = torch.cat([a, b, c], dim=-1)  # GPT-2's attention projection gradient (T, 3 x hidden)
    return g, g.sum(0)


def test_outer_reduction_block_never_held_whole_past_8192_elements():
    """A column sum over many rows (1024 x 2304, the bias gradient's shape scaled down: a
    16 x 1024 block held whole before) loops over its rows in blocks of at most 8192 elements
    instead of holding the block in registers (which spills on a GPU), and gives eager's
    values."""
    args = [torch.randn(1024, 768, dtype=torch.bfloat16) for _ in range(3)]
    graph = capture(bias_grad_of_cat, args).graph
    space = Partitioner(graph)
    groups = space.greedy().groups
    infos = [space.check(g) for g in groups]
    (info,) = [i for i in infos if i.reduce_dims]
    config = default_config(info, graph)
    assert config.XBLOCK >= 2 and config.XBLOCK * config.RBLOCK <= 8192, config
    assert config.RBLOCK < 1024, config  # looped: the rows walked in chunks
    plan = build_plan(graph, groups, [default_config(i, graph) for i in infos])
    got = execute(plan, args)
    want = bias_grad_of_cat(*args)
    for g, w in zip(got, want):
        assert_close(g, w, torch.bfloat16, "bias gradient of a cat")
