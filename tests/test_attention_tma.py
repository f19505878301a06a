"""The attention kind's TMA configs: K and V tiles through tensor descriptors, for eager-written
causal, grouped-query (expand views), padded and bool-mask attention, through the interpreter;
offered only where every key tile is whole."""

import pytest
import torch

from autofuse.capture.trace import capture
from autofuse.kernels import config_space, default_config
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import build_plan, execute
from experiments.bench.model_functions import eager_attention, eager_attention_gqa
from tests.helpers import assert_close, reference

DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


def padded(q, k, v, keep):
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = s.masked_fill(~keep[:, None, None, :], torch.finfo(s.dtype).min)
    return torch.softmax(s, -1) @ v


def bool_mask(q, k, v, allowed):
    s = (q @ k.transpose(-1, -2)) / 4.0
    return torch.softmax(s.masked_fill(~allowed, float("-inf")), -1) @ v


def _cases(t: int, dtype):
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    keep = torch.ones(2, t, dtype=torch.bool)
    keep[1, t - 5 :] = False
    allowed = torch.rand(t, t, generator=g) > 0.3
    allowed[3] = False  # a fully masked row: NaN, as eager
    gqa_mask = torch.zeros(2, 1, t, t, dtype=dtype).masked_fill(
        ~torch.ones(t, t, dtype=torch.bool).tril(), torch.finfo(dtype).min
    )
    return {
        "causal": (eager_attention, (r(2, 3, t, 16), r(2, 3, t, 16), r(2, 3, t, 16))),
        "gqa": (eager_attention_gqa, (r(2, 4, t, 16), r(2, 2, t, 16), r(2, 2, t, 16), gqa_mask)),
        "padded": (padded, (r(2, 2, t, 32), r(2, 2, t, 32), r(2, 2, t, 32), keep)),
        "bool_mask": (bool_mask, (r(1, 2, t, 16), r(1, 2, t, 16), r(1, 2, t, 16), allowed)),
    }


def _attention(fn, args):
    graph = capture(fn, args).graph
    space = Partitioner(graph)
    groups = space.greedy().groups
    infos = [space.check(gr) for gr in groups]
    k = next(n for n, i in enumerate(infos) if i.kind == "attention")
    return graph, groups, infos, k


@DTYPES
@pytest.mark.parametrize("name", ["causal", "gqa", "padded", "bool_mask"])
def test_tma_configs_match_eager(name, dtype):
    fn, args = _cases(64, dtype)[name]
    graph, groups, infos, k = _attention(fn, args)
    tma = [c for c in config_space(infos[k], graph) if c.TMA]
    assert tma and all(64 % c.BLOCK_N == 0 for c in tma)
    assert not default_config(infos[k], graph).TMA  # measured first, never assumed
    refs = reference(fn, args, dtype)
    for cfg in (tma[0], tma[-1]):
        cfgs = [cfg if n == k else default_config(i, graph) for n, i in enumerate(infos)]
        plan = build_plan(graph, groups, cfgs)
        kernel = next(kn for kn in plan.kernels if kn.info.kind == "attention")
        assert kernel.meta.needs_allocator and "make_tensor_descriptor" in kernel.source
        assert_close(execute(plan, list(args))[0], refs[0], dtype, f"{name} {cfg.label()}")


def test_no_tma_config_where_a_key_tile_would_run_past_the_keys():
    fn, args = _cases(40, torch.float32)["causal"]
    graph, _, infos, k = _attention(fn, args)
    space = config_space(infos[k], graph)
    assert all(40 % c.BLOCK_N == 0 for c in space if c.TMA)
    assert any(not c.TMA and 40 % c.BLOCK_N for c in space)
