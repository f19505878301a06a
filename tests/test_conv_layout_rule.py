"""Each convolution's memory format as a stated rule (ir/conv_layout.py): measured once per
convolution where CUDA is present (here with an injected timer on CPU tensors), eager's layout
on a CPU, or forced by AUTOFUSE_CONV_LAYOUT; a channels-last step converts its inputs once and
gives its output back in eager's strides; both front ends equal eager, forward and backward."""

import pytest
import torch

import autofuse
from autofuse.capture.trace import capture
from autofuse.ir.conv_fold import is_convolution
from autofuse.ir.conv_layout import choose_layouts
from autofuse.ir.eager import bind_node
from autofuse.settings import reload_settings
from tests.helpers import assert_close

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py


def _net(kind, dtype=torch.float32):
    torch.manual_seed(0)
    conv, shape = {
        "conv2d": (torch.nn.Conv2d(3, 4, 3, padding=1), (2, 3, 6, 5)),
        "conv3d": (torch.nn.Conv3d(2, 3, 2), (1, 2, 4, 3, 3)),
        "convT2d": (torch.nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2), (1, 4, 3, 4)),
    }[kind]
    net = torch.nn.Sequential(conv, torch.nn.GELU()).to(dtype)
    return net, torch.randn(shape, dtype=dtype)


def _convs(graph):
    return [i for i, n in enumerate(graph.nodes) if is_convolution(n)]


@pytest.fixture
def layout_rule(monkeypatch):
    def set_rule(rule):
        monkeypatch.setenv("AUTOFUSE_CONV_LAYOUT", rule)
        reload_settings()

    yield set_rule
    monkeypatch.delenv("AUTOFUSE_CONV_LAYOUT", raising=False)
    reload_settings()


def test_measured_rule_records_the_faster_format_and_both_times():
    net, x = _net("conv2d")
    graph = capture(net, (x,)).graph
    assert not any(graph[i].attr("layout") for i in _convs(graph))  # a CPU: eager's layout
    results, times = [], iter([3e-6, 2e-6])

    def timer(fn):
        results.append(fn())
        return next(times)

    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode():  # as the backend compiles: measured on real tensors all the same
        chosen = choose_layouts(graph, cuda=True, rule="measure", timer=timer, device="cpu")
    (i,) = _convs(chosen)
    assert not any(isinstance(r, FakeTensor) for r in results)
    assert chosen[i].attr("layout") == "channels_last" and chosen[i].attr("layout_us") == (3, 2)
    torch.testing.assert_close(results[0], results[1])  # both formats: one result
    assert results[1].stride() == tuple(graph[i].strides)  # given back in eager's strides
    assert choose_layouts(graph, cuda=True, rule="eager") is graph
    assert choose_layouts(graph, cuda=False, rule="measure") is graph


def test_channels_last_step_keeps_eagers_strides_for_a_channels_last_input():
    net, x = _net("conv2d")
    x = x.contiguous(memory_format=torch.channels_last)
    graph = capture(net, (x,)).graph
    (i,) = _convs(choose_layouts(graph, cuda=True, rule="channels_last"))
    node = choose_layouts(graph, cuda=True, rule="channels_last")[i]
    w, b = net[0].weight.detach(), net[0].bias.detach()
    out = bind_node(node)("cpu", *[{0: x, 1: w, 2: b}[k] for k in range(len(node.inputs))])
    assert out.stride() == tuple(node.strides)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["conv2d", "conv3d", "convT2d"])
def test_forced_channels_last_equals_eager_through_both_front_ends(kind, dtype, layout_rule):
    from autofuse.frontend import dynamo

    layout_rule("channels_last")
    net, x = _net(kind, dtype)
    graph = capture(net, (x,)).graph
    assert [graph[i].attr("layout") for i in _convs(graph)] == ["channels_last"]
    with torch.no_grad():
        assert_close(autofuse.optimize(net, (x,))(x), net(x), dtype, f"{kind} optimize")
    x.requires_grad_(True)
    want = net(x)
    want.float().square().sum().backward()
    want_grads = [x.grad.clone()] + [p.grad.clone() for p in net.parameters()]
    x.grad = None
    net.zero_grad()
    before = len(dynamo.compiled_graphs())
    got = torch.compile(net, backend="autofuse")(x)
    got.float().square().sum().backward()
    assert_close(got, want, dtype, f"{kind} backend forward")
    for k, (a, b) in enumerate(zip([x.grad] + [p.grad for p in net.parameters()], want_grads)):
        assert_close(a, b, dtype, f"{kind} grad {k}")
    forward = dynamo.compiled_graphs()[before].plan.graph
    assert [forward[i].attr("layout") for i in _convs(forward)] == ["channels_last"]


def test_explain_names_the_layout(layout_rule):
    layout_rule("channels_last")
    net, x = _net("conv3d")
    (note,) = autofuse.explain(net, (x,)).fused.convolutions
    assert "channels_last (AUTOFUSE_CONV_LAYOUT)" in note
