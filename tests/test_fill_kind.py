"""The ``fill`` kind: a pointwise group that reads no buffer (aranges and constants) is a
write-only kernel of its own kind, equal to eager; a group that reads a buffer stays pointwise."""

from __future__ import annotations

import torch

import autofuse
from autofuse.kernels import config_space
from autofuse.kernels.common.sizes import runtime_sizes


def positions_and_mask(x):
    n = x.shape[-1]
    i = torch.arange(n, device=x.device)
    causal = (i[:, None] >= i[None, :]).float() * 2.0 - 1.0
    ramp = torch.arange(37, device=x.device) * 0.5 + 1.0
    return x * 3.0, causal, ramp


def _plan(fn, *args):
    fast = autofuse.optimize(fn, args)
    return fast, fast.plan


def test_a_group_that_reads_nothing_is_a_fill_kernel_equal_to_eager():
    x = torch.randn(4, 9)
    fast, plan = _plan(positions_and_mask, x)
    kinds = sorted(k.info.kind for k in plan.kernels)
    assert kinds == ["fill", "fill", "pointwise"], kinds
    fills = [k for k in plan.kernels if k.info.kind == "fill"]
    assert all(k.name.startswith("autofuse_fill_") and not k.info.loads for k in fills)
    for got, want in zip(fast(x), positions_and_mask(x)):
        assert torch.equal(got, want)


def test_its_config_space_has_wide_blocks_only_and_runtime_sizes_work():
    x = torch.randn(4, 3000)
    _, plan = _plan(lambda t: torch.arange(t.shape[-1], device=t.device) * 2.0 + 1.0, x)
    (k,) = plan.kernels
    space = config_space(k.info, plan.graph)
    assert space and all(c.XBLOCK >= 1024 and c.num_warps in (4, 8) for c in space)
    with runtime_sizes(("bucket",)):
        fast = autofuse.optimize(lambda t: torch.arange(t.shape[-1]) * 2.0 + 1.0, (x,))
        assert fast.plan.kernels[0].info.kind == "fill"
    assert torch.equal(fast(x), torch.arange(3000) * 2.0 + 1.0)
