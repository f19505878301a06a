"""Inference BatchNorm folded into the convolution before it (ir/conv_fold.py): the folded
weight and bias are computed in the graph from the module's parameters and statistics (so a
later change to them is honoured), the convolution runs on the folded weight, its bias add
joins the epilogue kernel; training keeps BatchNorm's batch statistics and running-stat
updates. Both front ends, fp32 and bf16, equal to eager. By default the fold is a plan the
planner times beside the unfolded one (``AUTOFUSE_BN_FOLD=measure``); ``fold`` applies it
at capture (what most tests here use, ``fold_on``), ``keep`` never."""

import pytest
import torch

import autofuse
from autofuse.capture.trace import capture
from autofuse.ir.conv_fold import find_folds
from autofuse.plan.planner import Planner
from autofuse.plan.runtime import execute
from autofuse.settings import reload_settings
from tests.helpers import assert_close, backend_training_matches, settings_env

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py

CONV = "aten.convolution.default"


def _net(kind: str, dtype=torch.float32, bias=True):
    torch.manual_seed(0)
    conv, bn, shape = {
        "conv2d": (torch.nn.Conv2d(3, 4, 3, bias=bias), torch.nn.BatchNorm2d(4), (2, 3, 6, 6)),
        "conv3d": (torch.nn.Conv3d(2, 4, 2, bias=bias), torch.nn.BatchNorm3d(4), (1, 2, 4, 3, 3)),
        "convT2d": (
            torch.nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2, bias=bias),
            torch.nn.BatchNorm2d(6),
            (1, 4, 3, 4),
        ),
    }[kind]
    with torch.no_grad():  # statistics and affine parameters far from the defaults
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    net = torch.nn.Sequential(conv, bn, torch.nn.ReLU()).to(dtype).eval()
    return net, torch.randn(shape, dtype=dtype)


def _convs(graph):
    return [n for n in graph.nodes if n.op == "opaque" and n.attr("target") == CONV]


def _folded(graph):
    return [n for n in _convs(graph) if n.attr("folded")]


KINDS = ["conv2d", "conv3d", "convT2d"]


@pytest.fixture
def fold_on(monkeypatch):
    """``AUTOFUSE_BN_FOLD=fold``: BatchNorm folded at capture."""
    with settings_env(monkeypatch, AUTOFUSE_BN_FOLD="fold"):
        yield


@pytest.mark.parametrize("rule", ["measure", "keep"])
def test_by_default_the_folded_plan_is_an_alternative(monkeypatch, rule):
    """Unfolded, BatchNorm's scale and shift join the epilogue kernel (no kernel per call for
    the weight); the plan with it folded is among the alternatives the planner times on CUDA,
    its convolution on the folded weight — under ``keep``, it is not."""
    with settings_env(monkeypatch, AUTOFUSE_BN_FOLD=rule):
        net, x = _net("conv2d", bias=False)
        graph = capture(net, (x,)).graph
        assert not _folded(graph) and len(find_folds(graph)) == 1
        planner = Planner(graph)
        others = planner.alternatives(planner.space.untuned(), "untuned")
    folded = [p for p in others if p.label.endswith("BatchNorm folded into the convolutions")]
    assert len(folded) == (rule == "measure")
    for plan in folded:
        assert len(_folded(plan.graph)) == 1 and not find_folds(plan.graph)
        with torch.no_grad():
            got = execute(plan, [x, *(p.detach() for p in net.parameters()), *net.buffers()])
            assert_close(got[0], net(x), torch.float32, "folded alternative")
    with torch.no_grad():
        assert_close(autofuse.optimize(net, (x,))(x), net(x), torch.float32, "optimize")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
def test_eval_batchnorm_is_folded_and_equals_eager(kind, dtype, fold_on):
    net, x = _net(kind, dtype)
    graph = capture(net, (x,)).graph
    (conv,) = _convs(graph)
    assert conv.attr("folded") == "batchnorm" and len(conv.inputs) == 2
    assert not find_folds(graph)  # nothing left to fold
    # no multiply left at the convolution's output size: BatchNorm's scale is in the weight
    assert not any(n.op == "mul" and n.shape == conv.shape for n in graph.nodes)
    from autofuse.frontend import dynamo

    before = dynamo.compiled_count()
    with torch.no_grad():
        want = net(x)
        assert_close(autofuse.optimize(net, (x,))(x), want, dtype, f"{kind} optimize")
        assert_close(torch.compile(net, backend="autofuse")(x), want, dtype, f"{kind} backend")
    assert [len(_folded(c.plan.graph)) for c in dynamo.compiled_since(before)] == [1]


@pytest.mark.parametrize("rule", ["fold", "measure"])
def test_eval_mode_with_autograd_equals_eager(monkeypatch, rule):
    """An eval-mode network called with gradients on (the backend's joint graphs): forward and
    gradients equal eager's, folded or not."""
    with settings_env(monkeypatch, AUTOFUSE_BN_FOLD=rule):
        net, x = _net("conv2d")
        backend_training_matches(net, x, torch.float32)


def test_fold_without_conv_bias_and_library_bias(monkeypatch, fold_on):
    """A conv without bias (ResNet's) folds; with the bias kept in the library call the folded
    bias goes into the call."""
    net, x = _net("conv2d", bias=False)
    (conv,) = _convs(capture(net, (x,)).graph)
    assert conv.attr("folded") == "batchnorm" and len(conv.inputs) == 2
    monkeypatch.setenv("AUTOFUSE_CONV_BIAS", "library")
    reload_settings()
    try:
        for bias in (False, True):
            net, x = _net("convT2d", bias=bias)
            (conv,) = _convs(capture(net, (x,)).graph)
            assert conv.attr("folded") == "batchnorm" and len(conv.inputs) == 3
            with torch.no_grad():
                assert_close(autofuse.optimize(net, (x,))(x), net(x), torch.float32)
    finally:
        monkeypatch.delenv("AUTOFUSE_CONV_BIAS")
        reload_settings()


def test_fold_follows_later_changes_to_the_module(fold_on):
    """The fold is computed from the parameters on each call: a plan built before the module's
    weights and statistics change gives eager's result after."""
    net, x = _net("conv2d")
    fast = autofuse.optimize(net, (x,))
    with torch.no_grad():
        net[0].weight.mul_(-0.5)
        net[1].running_var.mul_(3.0)
        net[1].bias.add_(1.0)
        assert_close(fast(x), net(x), torch.float32)


def test_conv_output_read_elsewhere_is_not_folded(fold_on):
    """A convolution whose output is also returned keeps BatchNorm as a pointwise op (folding
    would run the convolution twice)."""

    class Both(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            c = self.net[0](x)
            return c, self.net[1](c)

    net, x = _net("conv2d")
    model = Both(net).eval()
    graph = capture(model, (x,)).graph
    assert [n.attr("folded") for n in _convs(graph)] == [None]
    with torch.no_grad():
        for got, want in zip(autofuse.optimize(model, (x,))(x), model(x)):
            assert_close(got, want, torch.float32)


@pytest.mark.parametrize("kind", ["conv2d", "convT2d"])
def test_training_mode_keeps_batch_statistics(kind):
    """In training mode nothing is folded: batch statistics normalize, the running statistics
    are updated as eager updates them, gradients equal eager's (backend front end)."""
    net, x = _net(kind)
    net.train()
    from autofuse.frontend import dynamo

    before = dynamo.compiled_count()
    ref = _net(kind)[0].train()
    ref.load_state_dict(net.state_dict())
    y = torch.compile(net, backend="autofuse")(x)
    graphs = [c.plan.graph for c in dynamo.compiled_since(before)]
    assert graphs and not any(find_folds(g) or _folded(g) for g in graphs)
    want = ref(x)
    y.square().sum().backward()
    want.square().sum().backward()
    assert_close(y, want, torch.float32, "forward")
    for (name, a), b in zip(net.named_buffers(), ref.buffers()):
        assert_close(a.float(), b.float(), torch.float32, name)
    for (name, a), b in zip(net.named_parameters(), ref.parameters()):
        if name == "0.bias":
            # a bias before a training-mode BatchNorm: its gradient is 0 in exact arithmetic
            # (the batch mean removes it), so both sides hold rounding noise alone; it must be
            # 0 to the rounding of the gradients beside it
            scale = float(ref[0].weight.grad.abs().max())
            assert float(a.grad.abs().max()) <= 1e-4 * scale, f"grad {name}: {a.grad}"
            continue
        assert_close(a.grad, b.grad, torch.float32, f"grad {name}")


def test_explain_and_reports_say_what_was_done_with_each_convolution(monkeypatch, fold_on):
    """explain lists each convolution with its bias (peeled into a named kernel, or in the
    call) and its folded BatchNorm (the kernel that scales the weight); the plan reports of
    both front ends carry the same note on the convolution's row."""
    from autofuse.frontend import dynamo
    from autofuse.report import summarize

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
        torch.nn.Conv2d(4, 4, 3, bias=False), torch.nn.Conv2d(4, 2, 1), torch.nn.Sigmoid(),
    ).eval()  # fmt: skip
    x = torch.randn(1, 3, 7, 7)
    explanation = autofuse.explain(net, (x,))
    first, second, third = explanation.fused.convolutions
    kernels = {k.name for k in explanation.fused_plan.kernels}
    peeled, folded = first.split("; ")[1:]
    assert peeled.removeprefix("bias peeled into kernel ") in kernels
    assert folded.startswith("BatchNorm folded into its weight (kernel autofuse_")
    assert folded.removeprefix("BatchNorm folded into its weight (kernel ")[:-1] in kernels
    assert second.endswith("library call (cuDNN on GPU); no bias in the call")
    assert "bias peeled into kernel autofuse_" in third
    # the greedy plan runs the first and the third in autofuse's kernel (kernels/conv), their
    # epilogues fused; the second (its reader another convolution) stays the library call
    assert "convolutions:\n  - convolution: autofuse implicit-GEMM kernel autofuse_conv" in str(
        explanation
    )
    assert str(explanation).count("BatchNorm folded") == 2  # the unfused plan's row, the list
    with torch.no_grad():
        assert "BatchNorm folded into its weight" in autofuse.optimize(net, (x,)).report()
        before = dynamo.compiled_count()
        torch.compile(net, backend="autofuse")(x)
    (compiled,) = dynamo.compiled_since(before)
    assert summarize(compiled.plan).convolutions[0].endswith(folded)
    monkeypatch.setenv("AUTOFUSE_CONV_BIAS", "library")
    reload_settings()
    try:
        notes = autofuse.explain(net, (x,)).fused.convolutions
    finally:
        monkeypatch.delenv("AUTOFUSE_CONV_BIAS")
        reload_settings()
    assert [n.split("; ")[1] for n in notes] == [
        "bias in the call",
        "no bias in the call",
        "bias in the call",
    ]


def test_a_cached_plan_of_the_folded_graph_runs_the_captured_graph():
    """A tuned plan that chose the folded graph (timed against the search's on CUDA) is saved
    under the captured graph: loading it, the planner of the captured graph takes it as it
    is; a plan of an unrelated graph it refuses."""
    net, x = _net("conv2d", bias=False)
    graph = capture(net, (x,)).graph
    planner = Planner(graph)
    (folded,) = [p for p in planner.graph_alternatives("tuned") if _folded(p.graph)]
    assert planner.fitted(folded) is folded
    other, y = _net("conv3d")
    assert planner.fitted(Planner(capture(other, (y,)).graph).greedy()) is None


def test_a_tuned_backend_whose_untuned_pick_is_the_folded_plan_tunes_its_own_graph(
    monkeypatch, tmp_path
):
    """The backend times its variant graphs' untuned plans to pick the graph it tunes; where
    the fastest is an alternative of the graph itself (BatchNorm folded), that graph's own
    planner is tuned (its search's plan is timed against the folded one again)."""
    from autofuse.frontend import dynamo
    from autofuse.plan.planner import Planned

    net, x = _net("conv2d", bias=False)
    graph = capture(net, (x,)).graph
    planner = Planner(graph, [("a variant", capture(net, (x,)).graph)])
    (folded,) = [p for p in planner.graph_alternatives("u") if _folded(p.graph)]
    tuned = []
    monkeypatch.setattr(Planner, "untuned", lambda self, *a, **k: Planned(folded))
    monkeypatch.setattr(Planner, "tuned", lambda self, *a, **k: tuned.append(self) or "plan")
    backend = dynamo.make_backend(trials=1, cache_dir=str(tmp_path))
    assert backend._tuned(planner, "inference", [x]) == "plan"
    assert tuned == [planner]
