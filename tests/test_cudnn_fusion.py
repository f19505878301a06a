"""cuDNN's fused convolution-bias-(residual)-ReLU as a plan candidate: which chains the provider
offers a call for, the plan variant with each chain run as its call (the rest of the epilogue
kernel still generated), and the check that drops a variant whose outputs differ. On CPU the
torch calls (CUDA-only) are replaced by references of the same signature, so the wrapper's
argument handling runs as it would on a GPU."""

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse.kernels import check_call, library_calls, library_key_parts
from autofuse.kernels.library.cudnn import fused_conv_call
from autofuse.plan.library_fusion import agreeing, fused_call_plans, fusions
from autofuse.plan.planner import Planner
from autofuse.plan.runtime import execute
from autofuse.plan.steps import KernelStep, LibraryStep


def _ref_relu(x, w, b, stride, padding, dilation, groups):
    return F.relu(F.conv2d(x, w, b, stride, padding, dilation, groups))


def _ref_add_relu(x, w, z, alpha, b, stride, padding, dilation, groups):
    return F.relu(F.conv2d(x, w, b, stride, padding, dilation, groups) + alpha * z)


@pytest.fixture
def cpu_cudnn(monkeypatch):
    monkeypatch.setattr(torch, "cudnn_convolution_relu", _ref_relu, raising=False)
    monkeypatch.setattr(torch, "cudnn_convolution_add_relu", _ref_add_relu, raising=False)


def _untuned(graph):
    pl = Planner(graph)
    return pl.build(pl.space.untuned().groups, label="untuned")


def _graph(fn, *args):
    return autofuse.capture(fn, args).graph


def _inputs(dtype=torch.float32):
    torch.manual_seed(0)
    x = torch.randn(2, 4, 9, 9, dtype=dtype)
    w = torch.randn(8, 4, 3, 3, dtype=dtype)
    b = torch.randn(8, dtype=dtype)
    z = torch.randn(2, 8, 5, 5, dtype=dtype)
    return x, w, b, z


def conv_bias_relu(x, w, b, z):
    return F.relu(F.conv2d(x, w, b, stride=2, padding=1)) * 2 + z


def conv_bias_add_relu(x, w, b, z):
    return F.relu(F.conv2d(x, w, b, stride=2, padding=1) + z) - 1


def _chain(graph):
    conv = next(
        i for i, n in enumerate(graph.nodes) if n.attr("target") == "aten.convolution.default"
    )
    path, cur = [conv], conv
    while len(graph.users[cur]) == 1 and graph[graph.users[cur][0]].op in ("add", "relu"):
        cur = graph.users[cur][0]
        path.append(cur)
        if graph[cur].op == "relu":
            break
    return frozenset(path)


def test_offers_conv_bias_relu_and_the_residual_form():
    g = _graph(conv_bias_relu, *_inputs())
    call = fused_conv_call(g, _chain(g))
    assert call is not None and call.name == "conv_relu"
    params = dict(call.params)
    assert params["stride"] == (2, 2) and params["padding"] == (1, 1) and params["groups"] == 1
    assert [g[a].name for a in call.args] == ["arg0_1", "arg1_1", "arg2_1"]  # x, w, the bias
    check_call(call, g)
    g2 = _graph(conv_bias_add_relu, *_inputs())
    call2 = fused_conv_call(g2, _chain(g2))
    assert call2 is not None and call2.name == "conv_add_relu"
    assert [g2[a].name for a in call2.args] == ["arg0_1", "arg1_1", "arg3_1", "arg2_1"]
    assert call2 in library_calls(g2, _chain(g2))


@pytest.mark.parametrize(
    "fn, dtype",
    [
        (lambda x, w, b, z: F.gelu(F.conv2d(x, w, b, stride=2, padding=1)), torch.float32),
        (conv_bias_relu, torch.bfloat16),  # cuDNN's fused call: float32 and float16 only
        (lambda x, w, b, z: (F.conv2d(x, w, b, stride=2, padding=1),  # the bias add also read
                             F.relu(F.conv2d(x, w, b, stride=2, padding=1))), torch.float32),
    ],
)  # fmt: skip
def test_no_call_where_the_chain_is_not_conv_bias_relu(fn, dtype):
    g = _graph(fn, *_inputs(dtype))
    conv = next(i for i, n in enumerate(g.nodes) if n.attr("target") == "aten.convolution.default")
    chain = frozenset(
        {conv, *(i for i in range(conv + 1, len(g.nodes)) if g[i].kind == "pointwise")}
    )
    assert fused_conv_call(g, chain) is None
    for n in range(1, len(chain)):
        assert fused_conv_call(g, frozenset(sorted(chain)[:n])) is None


def test_transposed_and_3d_convolutions_are_not_offered():
    x, w = torch.randn(1, 4, 5, 5), torch.randn(4, 8, 3, 3)
    g = _graph(lambda x, w: F.relu(F.conv_transpose2d(x, w)), x, w)
    assert not any(fused_conv_call(g, frozenset({i, i + 1})) for i in range(len(g.nodes) - 1))
    x3, w3 = torch.randn(1, 4, 5, 5, 5), torch.randn(8, 4, 3, 3, 3)
    g3 = _graph(lambda x, w: F.relu(F.conv3d(x, w)), x3, w3)
    assert not any(fused_conv_call(g3, frozenset({i, i + 1})) for i in range(len(g3.nodes) - 1))


@pytest.mark.parametrize("fn", [conv_bias_relu, conv_bias_add_relu])
def test_variant_runs_the_chain_as_one_call_and_agrees(fn, cpu_cudnn):
    args = _inputs()
    g = _graph(fn, *args)
    plan = _untuned(g)
    assert len(fusions(plan)) == 1
    (variant,) = fused_call_plans(plan)
    lib = [s for s in variant.steps if isinstance(s, LibraryStep)]
    assert len(lib) == 1 and lib[0].call.provider == "cudnn"
    assert "cudnn_convolution" in lib[0].reason
    # the epilogue after the ReLU still runs as a generated kernel; the convolution step is gone
    assert any(isinstance(s, KernelStep) for s in variant.steps)
    assert not any(s.nodes == (min(lib[0].call.nodes),) for s in variant.steps if s is not lib[0])
    torch.testing.assert_close(execute(variant, list(args))[0], fn(*args), rtol=1e-4, atol=1e-4)
    kept, notes = agreeing(plan, [variant], lambda p: execute(p, list(args)))
    assert kept == [variant] and notes == []


def test_a_variant_whose_call_differs_is_dropped(monkeypatch):
    monkeypatch.setattr(torch, "cudnn_convolution_relu",
                        lambda *a: _ref_relu(*a) + 0.5, raising=False)  # fmt: skip
    args = _inputs()
    plan = _untuned(_graph(conv_bias_relu, *args))
    variants = fused_call_plans(plan)
    kept, notes = agreeing(plan, variants, lambda p: execute(p, list(args)))
    assert kept == [] and len(notes) == 1 and "wrong result" in notes[0]


def test_cache_key_names_cudnn_only_with_a_convolution(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91900)
    assert library_key_parts(_graph(conv_bias_relu, *_inputs())).get("cudnn") == "91900"
    assert "cudnn" not in library_key_parts(_graph(lambda a: a.relu(), torch.randn(3)))


def test_float32_under_tf32_is_held_to_float16s_tolerance(monkeypatch):
    from autofuse.plan.library_fusion import tolerance_of

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    assert tolerance_of(torch.float32) == "float16" and tolerance_of(torch.bfloat16) == "bfloat16"
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert tolerance_of(torch.float32) == "float32"


def test_folded_batchnorm_opens_the_fused_call(cpu_cudnn):
    """The plan with inference BatchNorm folded into a bias-free convolution (ResNet's) is timed
    with its fused-call variant: the folded shift is the bias cuDNN's convolution-bias-ReLU
    takes; the variant agrees with the plan and with eager."""
    from autofuse.ir.conv_fold import fold_batchnorm
    from autofuse.plan.library_fusion import with_fused_variants

    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(8)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    net = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, bias=False), bn, torch.nn.ReLU()).eval()
    x = torch.randn(2, 4, 7, 7)
    graph = autofuse.capture(net, (x,)).graph
    flat = [x, *(p.detach() for p in net.parameters()), *net.buffers()]
    run = lambda p: execute(p, flat)  # noqa: E731
    assert not fusions(_untuned(graph))  # unfolded: BatchNorm's scale sits before the ReLU
    folded = _untuned(fold_batchnorm(graph))
    plans = with_fused_variants([folded], run)
    assert plans[0] is folded and len(plans) == 2
    fused = plans[1]
    assert any(isinstance(s, LibraryStep) and "relu" in s.call.label for s in fused.steps)
    with torch.no_grad():
        torch.testing.assert_close(run(fused)[0], net(x), rtol=1e-4, atol=1e-4)
