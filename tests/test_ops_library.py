"""Ops autofuse does not generate run as their eager ATen op (a library call) at a partition
boundary, with their neighbours still fused on both sides: topk, sort."""

import pytest
import torch

from autofuse.capture.trace import capture
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import build_plan, execute

from .helpers import assert_close, reference


def top3(x):
    v, i = torch.topk(x * 2.0, 3, dim=-1)
    return v.exp() + 1.0, i, torch.sort(x.abs(), -1).values[..., :2] * 0.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_and_sort_are_library_steps_between_fused_kernels(dtype):
    x = torch.randn(5, 37, generator=torch.Generator().manual_seed(0)).to(dtype)
    graph = capture(top3, (x,)).graph
    plan = build_plan(graph, Partitioner(graph).greedy().groups)
    targets = {graph[s.node].attr("target") for s in plan.fallbacks} - {None}
    assert targets == {"aten.topk.default", "aten.sort.default"}, targets
    fused = {graph[n].op for k in plan.kernels for n in k.info.nodes}
    assert {"mul", "exp", "add", "abs"} <= fused, fused  # neighbours still in kernels
    outs = execute(plan, [x])
    for k, (o, r) in enumerate(zip(outs, reference(top3, (x,), dtype), strict=True)):
        assert_close(o, r, dtype, f"out {k}")


def test_convolution_runs_on_channels_last_operands_and_returns_contiguous():
    """A convolution's library call takes NHWC operands (cuDNN's fast 16-bit kernels; on CUDA
    only, here forced) and hands the plan contiguous results, forward and backward."""
    from autofuse.ir.eager import channels_last_call, resolve_target

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 16, 16, generator=g).bfloat16()
    w = torch.randn(8, 3, 4, 4, generator=g).bfloat16()
    b = torch.randn(8, generator=g).bfloat16()
    conv = resolve_target("aten.convolution.default")
    args = (x, w, b, [4, 4], [0, 0], [1, 1], False, [0, 0], 1)
    want = conv(*args)
    got = channels_last_call(conv, only_cuda=False)(*args)
    assert got.is_contiguous() and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    bwd = resolve_target("aten.convolution_backward.default")
    gy = torch.randn(want.shape, generator=g).bfloat16()
    bargs = (gy, x, w, [8], [4, 4], [0, 0], [1, 1], False, [0, 0], 1, [True, True, True])
    for a, r in zip(channels_last_call(bwd, only_cuda=False)(*bargs), bwd(*bargs)):
        assert a.is_contiguous()
        torch.testing.assert_close(a.float(), r.float(), atol=5e-2, rtol=2e-2)


def test_a_kernel_reads_an_eager_ops_dense_output_in_its_own_layout(monkeypatch):
    """An op the plan runs in eager keeps the layout it comes out in when that is dense (a
    convolution of a channels_last input is NHWC; cuDNN attention's output is (B, T, H, D) in
    memory): the kernel after it reads those strides, no copy to contiguous in between."""
    import autofuse
    from autofuse.ir import eager

    def f(x, w):
        return torch.sigmoid(torch.nn.functional.conv2d(x, w)) * 2.0

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 9, 9, generator=g).contiguous(memory_format=torch.channels_last)
    w = torch.randn(5, 3, 3, 3, generator=g).contiguous(memory_format=torch.channels_last)
    opt = autofuse.optimize(f, (x, w))
    conv = [i for i, n in enumerate(opt.plan.graph.nodes) if n.op == "opaque"]
    assert conv and not opt.plan.graph[conv[0]].strides == (245, 49, 7, 1)  # traced NHWC
    copies = []
    real = eager.conform

    def spy(t, shape, strides):
        out = real(t, shape, strides)
        copies.append(out is not t)
        return out

    monkeypatch.setattr("autofuse.plan.program.conform", spy)
    monkeypatch.setattr("autofuse.plan.runtime.conform", spy)
    for _ in range(2):  # the first call (the slow path) and the program's
        assert_close(opt(x, w), f(x, w), torch.float32, "conv + sigmoid")
    assert copies and not any(copies), copies
    # a layout the trace did not foresee (the op came out contiguous): copied, still correct
    wc = w.contiguous()
    opt2 = autofuse.optimize(f, (x, wc))
    assert_close(opt2(x, wc), f(x, wc), torch.float32, "conv + sigmoid, relaid")
