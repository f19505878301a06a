"""A convolution's bias peeled off the library call (capture/convolution.py): the convolution
runs without it, the bias add runs in a generated kernel with the epilogue, and the bias
gradient is a generated sum; ``AUTOFUSE_CONV_BIAS=library`` keeps eager's call. Both front ends,
forward and backward, fp32 and bf16, 1-3 D, transposed and grouped, equal to eager."""

import pytest
import torch

import autofuse
from autofuse.capture.trace import capture
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import build_plan
from autofuse.settings import reload_settings
from tests.helpers import assert_close

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py

CONV = "aten.convolution.default"


def _convs():
    """(name, module, input shape): one of each kind of convolution, tiny."""
    return [
        ("conv1d", torch.nn.Conv1d(3, 4, 3, padding=1), (2, 3, 7)),
        ("conv2d_grouped", torch.nn.Conv2d(4, 6, 3, stride=2, groups=2), (2, 4, 7, 7)),
        ("conv3d", torch.nn.Conv3d(2, 3, 2), (1, 2, 4, 4, 3)),
        ("convT2d_grouped", torch.nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2), (1, 4, 3, 4)),
        ("convT3d", torch.nn.ConvTranspose3d(2, 3, 2, output_padding=1, stride=2),
         (1, 2, 2, 3, 2)),
    ]  # fmt: skip


class ConvEpilogue(torch.nn.Module):
    def __init__(self, conv):
        super().__init__()
        self.conv = conv

    def forward(self, x):
        return torch.tanh(self.conv(x)) * 2.0


def _model(conv, dtype):
    torch.manual_seed(0)
    for p in conv.parameters():
        torch.nn.init.uniform_(p, -0.5, 0.5)
    return ConvEpilogue(conv).to(dtype)


def _conv_nodes(graph):
    return [n for n in graph.nodes if n.op == "opaque" and n.attr("target") == CONV]


@pytest.fixture
def library_bias(monkeypatch):
    monkeypatch.setenv("AUTOFUSE_CONV_BIAS", "library")
    reload_settings()
    yield
    monkeypatch.delenv("AUTOFUSE_CONV_BIAS")
    reload_settings()


@pytest.mark.parametrize("name,conv,shape", _convs(), ids=[c[0] for c in _convs()])
def test_bias_is_added_by_the_epilogue_kernel(name, conv, shape):
    """The captured convolution has no bias input; its bias add is fused with the tanh and
    the multiply in one generated kernel; the plan equals eager."""
    model = _model(conv, torch.float32)
    x = torch.randn(shape)
    graph = capture(model, (x,)).graph
    (node,) = _conv_nodes(graph)
    assert len(node.inputs) == 2 and node.attr("args")[2][2] is None
    conv = graph.nodes.index(node)
    plan = build_plan(graph, Partitioner(graph).greedy().groups)
    (kernel,) = [k for k in plan.kernels if graph.users[conv][0] in k.info.nodes]
    fused = {graph[n].op for n in kernel.info.nodes}
    assert {"add", "tanh", "mul"} <= fused, fused
    with torch.no_grad():
        assert_close(autofuse.optimize(model, (x,))(x), model(x), torch.float32, name)


def test_library_setting_keeps_the_bias_in_the_call(library_bias):
    model = _model(torch.nn.Conv2d(3, 4, 3), torch.float32)
    x = torch.randn(2, 3, 6, 6)
    (node,) = _conv_nodes(capture(model, (x,)).graph)
    assert len(node.inputs) == 3
    with torch.no_grad():
        assert_close(autofuse.optimize(model, (x,))(x), model(x), torch.float32)


def test_unknown_setting_warns_and_peels(monkeypatch):
    from autofuse.settings import SettingsWarning

    monkeypatch.setenv("AUTOFUSE_CONV_BIAS", "cudnn")
    with pytest.warns(SettingsWarning, match="AUTOFUSE_CONV_BIAS"):
        assert reload_settings().conv_bias == "kernel"
    monkeypatch.delenv("AUTOFUSE_CONV_BIAS")
    reload_settings()


def _train_step(model, x):
    model.zero_grad()
    y = model(x)
    y.float().square().sum().backward()
    return y, {n.removeprefix("_orig_mod."): p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name,conv,shape", _convs()[1:4], ids=[c[0] for c in _convs()[1:4]])
def test_backend_forward_and_backward_equal_eager(name, conv, shape, dtype):
    """torch.compile(backend="autofuse"): the forward graph's convolution has no bias, the
    backward graph asks the library for no bias gradient (a generated sum gives it)."""
    from autofuse.frontend import dynamo

    model = _model(conv, dtype)
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    want, want_grads = _train_step(model, x)
    want_dx = x.grad.clone()
    x.grad = None
    before = dynamo.compiled_count()
    fast = torch.compile(model, backend="autofuse")
    got, got_grads = _train_step(fast, x)
    assert_close(got, want, dtype, f"{name} forward")
    assert_close(x.grad, want_dx, dtype, f"{name} input grad")
    for k in want_grads:
        assert_close(got_grads[k], want_grads[k], dtype, f"{name} grad {k}")
    graphs = [c.plan.graph for c in dynamo.compiled_since(before)]
    convs = [n for g in graphs for n in _conv_nodes(g)]
    assert convs and all(n.attr("args")[2][2] is None for n in convs)
    bwd = [
        n
        for g in graphs
        for n in g.nodes
        if n.op == "opaque" and n.attr("target") == "aten.convolution_backward.default"
    ]
    assert bwd and all(n.attr("args")[2][-1][2][2] is False for n in bwd)  # fmt: skip


def test_backend_library_setting_keeps_eager_calls(library_bias):
    from autofuse.frontend import dynamo

    model = _model(torch.nn.Conv2d(3, 4, 3), torch.float32)
    x = torch.randn(2, 3, 6, 6)
    want, want_grads = _train_step(model, x)
    before = dynamo.compiled_count()
    got, got_grads = _train_step(torch.compile(model, backend="autofuse"), x)
    assert_close(got, want, torch.float32)
    for k in want_grads:
        assert_close(got_grads[k], want_grads[k], torch.float32, k)
    convs = [n for c in dynamo.compiled_since(before) for n in _conv_nodes(c.plan.graph)]
    assert convs and all(len(n.inputs) == 3 for n in convs)


def test_no_input_channels_keeps_eagers_results():
    """A convolution of zero input channels: eager gives no output channels and a zero bias
    gradient (not the sum of the output gradient); both front ends give the same."""
    model = _model(torch.nn.Conv2d(0, 3, 3), torch.float32)
    x = torch.randn(2, 0, 5, 5)
    want, want_grads = _train_step(model, x)
    with torch.no_grad():
        assert_close(autofuse.optimize(model, (x,))(x), want, torch.float32)
    got, got_grads = _train_step(torch.compile(model, backend="autofuse"), x)
    assert_close(got, want, torch.float32)
    for k in want_grads:
        assert_close(got_grads[k], want_grads[k], torch.float32, k)
