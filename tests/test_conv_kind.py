"""The convolution kind (kernels/conv): a forward convolution as autofuse's own implicit-GEMM
kernel, its epilogue fused, equal to eager through both front ends (1-3 D, strided, padded,
dilated, grouped, depthwise, stride-1 transposed; fp32 and bf16; channels-last input; size-1
dims); a candidate beside cuDNN (offers, the untuned rule, explain); what it leaves to the
library and why; KernelBench's level-1 convolutions at reduced shapes, the kernel forced."""

from __future__ import annotations

import pytest
import torch

import autofuse
from autofuse.capture.trace import capture
from autofuse.kernels import EAGER, analyze_group, config_space, default_config, generate, offers
from autofuse.kernels.conv.kind import MAX_WARPS
from autofuse.kernels.conv.rule import FORCED
from autofuse.kernels.conv.spec import conv_refusal
from autofuse.partition.partitioner import Partitioner
from autofuse.settings import reload_settings
from tests.helpers import assert_close, backend_training_matches

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py

CONV = "aten.convolution.default"


@pytest.fixture
def conv_kernel(monkeypatch):
    """``conv_kernel(mode)``: AUTOFUSE_CONV_KERNEL for the test, undone after it."""

    def set_mode(mode: str) -> None:
        monkeypatch.setenv("AUTOFUSE_CONV_KERNEL", mode)
        reload_settings()

    yield set_mode
    monkeypatch.undo()
    reload_settings()


class ConvEpilogue(torch.nn.Module):
    """conv (its bias peeled into the epilogue), relu, a scale: one fused kernel."""

    def __init__(self, conv: torch.nn.Module) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x):
        return torch.relu(self.conv(x)) * 0.5


def _cases():
    """(name, convolution, input shape, channels-last input): tiny, one of each form."""
    nn = torch.nn
    return [
        ("conv1d_padded", nn.Conv1d(3, 4, 3, padding=1), (2, 3, 7), False),
        ("conv1d_stride2_dilated", nn.Conv1d(2, 3, 3, stride=2, dilation=2), (1, 2, 11), False),
        ("conv2d_stride2_padded", nn.Conv2d(3, 5, 3, stride=2, padding=1), (2, 3, 7, 6), False),
        ("conv2d_dilation2", nn.Conv2d(2, 4, 3, dilation=2, padding=2), (1, 2, 7, 7), False),
        ("conv2d_groups2", nn.Conv2d(4, 6, 3, groups=2), (2, 4, 5, 5), False),
        ("depthwise", nn.Conv2d(4, 4, 3, padding=1, groups=4), (2, 4, 6, 5), False),
        ("asymmetric", nn.Conv2d(3, 4, (3, 1), stride=(2, 1), padding=(1, 0)), (1, 3, 7, 4),
         False),
        ("channels_last", nn.Conv2d(3, 4, 3, padding=1), (2, 3, 5, 6), True),
        ("size1_dims", nn.Conv2d(3, 2, (1, 3)), (1, 3, 1, 5), False),
        ("one_pixel", nn.Conv2d(1, 1, 1, bias=False), (1, 1, 1, 1), False),
        ("conv3d", nn.Conv3d(2, 3, 2, stride=(1, 2, 1)), (1, 2, 4, 5, 3), False),
        ("transposed_stride1", nn.ConvTranspose2d(4, 6, 3, padding=1, groups=2), (1, 4, 3, 4),
         False),
        ("transposed1d_dilated", nn.ConvTranspose1d(3, 5, 3, dilation=2), (2, 3, 6), False),
    ]  # fmt: skip


def _model(conv, dtype):
    """The convolution (shared by the parametrized cases) re-initialised, no gradient kept."""
    torch.manual_seed(0)
    conv.zero_grad(set_to_none=True)
    for p in conv.parameters():
        torch.nn.init.uniform_(p, -0.5, 0.5)
    return ConvEpilogue(conv).to(dtype)


def _input(shape, dtype, channels_last):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    return x.to(memory_format=torch.channels_last) if channels_last else x


def _conv_kernels(plan):
    return [k for k in plan.kernels if k.info.kind == "conv"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name,conv,shape,cl", _cases(), ids=[c[0] for c in _cases()])
def test_forced_kernel_equals_eager(conv_kernel, name, conv, shape, cl, dtype):
    """autofuse.optimize with AUTOFUSE_CONV_KERNEL=kernel: the convolution, its bias, the relu
    and the scale are one conv-kind kernel, equal to eager."""
    conv_kernel("kernel")
    model, x = _model(conv, dtype), _input(shape, dtype, cl)
    with torch.no_grad():
        fast = autofuse.optimize(model, (x,))
        (kernel,) = _conv_kernels(fast.plan)
        g = fast.plan.graph
        assert {g[i].op for i in kernel.info.nodes} >= {"opaque", "relu", "mul"}, name
        assert_close(fast(x), model(x), dtype, name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name,conv,shape,cl", _cases()[2:8:3], ids=[c[0] for c in _cases()[2:8:3]])
def test_backend_forward_and_backward_equal_eager(conv_kernel, name, conv, shape, cl, dtype):
    """torch.compile(backend="autofuse"), a training step: the forward graph's convolution runs
    in the kernel, the backward's convolution_backward stays the library's; both equal eager."""
    from autofuse.frontend import dynamo

    conv_kernel("kernel")
    model, x = _model(conv, dtype), _input(shape, dtype, cl)
    before = backend_training_matches(model, x, dtype, name)
    forward, backward = [c.plan for c in dynamo.compiled_since(before)]
    assert _conv_kernels(forward) and not _conv_kernels(backward)


def test_inference_through_the_backend(conv_kernel):
    conv_kernel("kernel")
    model, x = _model(torch.nn.Conv2d(4, 4, 3, groups=4), torch.float32), torch.randn(1, 4, 6, 6)
    from autofuse.frontend import dynamo

    before = dynamo.compiled_count()
    with torch.no_grad():
        assert_close(torch.compile(model, backend="autofuse")(x), model(x), torch.float32)
    (compiled,) = dynamo.compiled_since(before)
    assert _conv_kernels(compiled.plan)


def test_convolution_output_read_elsewhere(conv_kernel):
    """The convolution's own output returned beside its epilogue: the kernel stores it in the
    layout eager gives it (channels-last for a channels-last input), as every later reader
    reads it (``buffer_strides``)."""
    conv_kernel("kernel")
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def f(x):
        y = conv(x)
        return y, torch.sigmoid(y)

    for cl in (False, True):
        x = _input((2, 3, 5, 5), torch.float32, cl)
        with torch.no_grad():
            fast = autofuse.optimize(f, (x,))
            got, want = fast(x), f(x)
        for a, b in zip(got, want):
            assert_close(a, b, torch.float32, f"channels_last={cl}")
        assert got[0].stride() == want[0].stride()
        (kernel,) = _conv_kernels(fast.plan)
        assert len(kernel.info.stored) == 2


def test_sixty_four_bit_offsets(conv_kernel, monkeypatch):
    """A convolution whose buffers pass 2**31 elements computes its offsets in 64 bits (forced
    here on tiny shapes: the same kernel, its index variables widened, equal to eager)."""
    from autofuse.kernels.conv.kind import ConvEmitter

    conv_kernel("kernel")
    monkeypatch.setattr(ConvEmitter, "_needs_int64", lambda self: True)
    model = _model(torch.nn.Conv2d(4, 6, 3, padding=1, groups=2), torch.float32)
    x = torch.randn(2, 4, 5, 5)
    with torch.no_grad():
        fast = autofuse.optimize(model, (x,))
        assert_close(fast(x), model(x), torch.float32)
    (kernel,) = _conv_kernels(fast.plan)
    assert "cv_am = offs_m[:, None].to(tl.int64)" in kernel.source
    assert "rm = rm.to(tl.int64)" in kernel.source


def _graph(conv, shape, dtype=torch.float32):
    model = _model(conv, dtype)
    return capture(model, (torch.randn(shape).to(dtype),)).graph


def _conv_node(graph):
    (i,) = [i for i, n in enumerate(graph.nodes) if n.attr("target") == CONV]
    return i


def test_offers_list_the_kernel_beside_the_library_call():
    graph = _graph(torch.nn.Conv2d(3, 4, 3), (1, 3, 6, 6))
    (group,) = Partitioner(graph).greedy().groups
    assert _conv_node(graph) in group
    got = offers(graph, group)
    kernels = [o for o in got if o.family == "kernel"]
    assert kernels and {o.choice.kind for o in kernels} == {"conv"}
    assert got[-1].choice == EAGER
    # the convolution alone: the kernel, or its ATen call (cuDNN) as the eager step
    alone = offers(graph, frozenset({_conv_node(graph)}))
    assert [o.family for o in alone][0] == "kernel" and alone[-1].choice == EAGER


def test_untuned_rule_keeps_the_library_call():
    """Default rule: a convolution with an epilogue keeps cuDNN in the unmeasured plan; the
    greedy plan (explain's) fuses it into the kernel and explain says so."""
    model, x = _model(torch.nn.Conv2d(3, 4, 3), torch.float32), torch.randn(1, 3, 6, 6)
    with torch.no_grad():
        fast = autofuse.optimize(model, (x,))
        assert_close(fast(x), model(x), torch.float32)
    assert not _conv_kernels(fast.plan)
    described = [s.describe(fast.plan.graph) for s in fast.plan.steps]
    assert any(d.startswith(f"eager {CONV}: rule: a lone convolution") for d in described)
    text = str(autofuse.explain(model, (x,)))
    assert "conv kernel autofuse_conv_fused_add_convolution_mul_relu" in text
    assert "  - convolution: autofuse implicit-GEMM kernel autofuse_conv" in text


def test_untuned_rule_keeps_a_fused_depthwise_convolution_in_the_library(conv_kernel):
    """The rule runs every convolution as the library call, a fused depthwise one included
    (kernels/conv/rule.py: measured slower than cuDNN's channels-last engines in MobileNetV2);
    forced, the kernel takes it, epilogue fused."""
    depthwise = torch.nn.Conv2d(4, 4, 3, padding=1, groups=4)
    model, x = _model(depthwise, torch.float32), torch.randn(2, 4, 6, 6)
    with torch.no_grad():
        fast = autofuse.optimize(model, (x,))
        assert_close(fast(x), model(x), torch.float32)
    assert not _conv_kernels(fast.plan)
    conv_kernel("kernel")
    with torch.no_grad():
        forced = autofuse.optimize(model, (x,))
        assert_close(forced(x), model(x), torch.float32)
    assert _conv_kernels(forced.plan)
    assert FORCED in forced.report()


def test_forcing_the_kernel_times_no_library_alternative(conv_kernel):
    """AUTOFUSE_CONV_KERNEL=kernel: the plan with the convolution in cuDNN is no alternative
    (the untuned planner times none on CUDA), as it is under the rule."""
    graph = _graph(torch.nn.Conv2d(3, 4, 3), (1, 3, 6, 6))
    space = Partitioner(graph)
    assert space.library_gemms(space.greedy()) is not None
    conv_kernel("kernel")
    space = Partitioner(graph)
    assert space.library_gemms(space.greedy()) is None
    assert space.untuned() == space.greedy()


def test_library_setting_takes_no_convolution(conv_kernel):
    conv_kernel("library")
    graph = _graph(torch.nn.Conv2d(3, 4, 3), (1, 3, 6, 6))
    conv = _conv_node(graph)
    assert all(conv not in g for g in Partitioner(graph).greedy().groups)
    assert all(o.family == "eager" for o in offers(graph, frozenset({conv})))


@pytest.mark.parametrize(
    "conv,shape,why",
    [
        (torch.nn.ConvTranspose2d(3, 4, 3, stride=2), (1, 3, 4, 4), "strided transposed"),
        (torch.nn.ConvTranspose1d(3, 4, 3, output_padding=0), (1, 3, 5), None),
    ],
)
def test_what_stays_with_the_library(conv_kernel, conv, shape, why):
    conv_kernel("kernel")
    graph = _graph(conv, shape)
    reason = conv_refusal(graph, _conv_node(graph))
    assert (reason is None) if why is None else why in reason
    model, x = _model(conv, torch.float32), torch.randn(shape)
    with torch.no_grad():
        fast = autofuse.optimize(model, (x,))
        assert_close(fast(x), model(x), torch.float32)
    assert bool(_conv_kernels(fast.plan)) is (why is None)


def test_an_empty_batch_stays_with_the_library(conv_kernel):
    conv_kernel("kernel")
    model, x = _model(torch.nn.Conv2d(3, 4, 3), torch.float32), torch.randn(0, 3, 5, 5)
    graph = capture(model, (x,)).graph
    assert "an empty dim" in conv_refusal(graph, _conv_node(graph))
    with torch.no_grad():
        fast = autofuse.optimize(model, (x,))
        assert_close(fast(x), model(x), torch.float32)
    assert not _conv_kernels(fast.plan)


def test_float64_and_too_many_groups_stay_with_the_library():
    graph = _graph(torch.nn.Conv2d(2, 3, 3), (1, 2, 5, 5), torch.float64)
    assert "tl.dot takes" in conv_refusal(graph, _conv_node(graph))
    n = 65536
    graph = _graph(torch.nn.Conv1d(n, n, 1, groups=n, bias=False), (1, n, 2))
    assert "groups: the grid's group axis" in conv_refusal(graph, _conv_node(graph))


def _kernel_source(graph, dtype_note=""):
    group = next(g for g in Partitioner(graph).greedy().groups if _conv_node(graph) in g)
    info = analyze_group(graph, group)
    return generate(graph, info, default_config(info, graph)).source


def test_fp32_operands_follow_cudnn_allow_tf32():
    graph = _graph(torch.nn.Conv2d(3, 4, 3), (1, 3, 6, 6))
    before = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        assert "input_precision='tf32'" in _kernel_source(graph)
        torch.backends.cudnn.allow_tf32 = False
        assert "input_precision='ieee'" in _kernel_source(graph)
    finally:
        torch.backends.cudnn.allow_tf32 = before
    bf16 = _graph(torch.nn.Conv2d(3, 4, 3), (1, 3, 6, 6), torch.bfloat16)
    assert "input_precision" not in _kernel_source(bf16)


def test_at_most_four_warps_but_for_a_one_by_one_kernel():
    big = (4, 64, 32, 32)
    for conv, limit in ((torch.nn.Conv2d(64, 128, 3), MAX_WARPS), (torch.nn.Conv2d(64, 128, 1), 8)):
        graph = _graph(conv, big)
        info = analyze_group(graph, frozenset({_conv_node(graph)}))
        warps = {c.num_warps for c in config_space(info, graph)}
        assert max(warps) == limit, (conv, warps)


# KernelBench level 1's convolutions (read by path, shapes reduced as the CPU runner reduces
# them), the kernel forced: a few forms on every run, the whole set with ``-m exhaustive``
KB_EVERY_RUN = (54, 64, 67, 76, 80, 82, 86, 87)  # 3-D, transposed 1-D, 1-D, strided dilated
# 1-D, dilated padded 2-D, depthwise, depthwise-separable, pointwise


def _kb_problems() -> list:
    from experiments.kernelbench.problems import discover
    from experiments.kernelbench.run import default_dir

    root = default_dir()
    if root is None:
        return []
    return [p for p in discover(root, 1) if "conv" in p.name]


def _kb_params() -> list:
    out = [
        pytest.param(p, id=f"{p.number}_{p.name}"[:60],
                     marks=() if p.number in KB_EVERY_RUN else pytest.mark.exhaustive)
        for p in _kb_problems()
    ]  # fmt: skip
    return out or [pytest.param(None, marks=pytest.mark.skip(reason="no KernelBench folder"))]


def _kb_instance(problem):
    """The problem at the first reduced stage eager runs (``small``, then ``medium``)."""
    from experiments.kernelbench.problems import STAGES, instantiate, load_module

    for stage in STAGES[:2]:
        model, inputs = instantiate(load_module(problem, stage)[0])
        try:
            with torch.no_grad():
                return model, inputs, model(*inputs)
        except Exception:  # noqa: BLE001 - a stage eager refuses: the next one
            continue
    pytest.skip(f"eager runs no reduced stage of {problem.name}")


@pytest.mark.parametrize("problem", _kb_params())
def test_kernelbench_level1_convolutions_forced(conv_kernel, problem):
    """Every convolution the kind takes runs in its kernel and the result equals eager; what it
    does not take (strided transposed) is the library call, named by its reason."""
    conv_kernel("kernel")
    model, inputs, want = _kb_instance(problem)
    with torch.no_grad():
        fast = autofuse.optimize(model, inputs)
        got = fast(*inputs)
    assert_close(got, want, torch.float32, problem.name)
    g = fast.plan.graph
    convs = [i for i, n in enumerate(g.nodes) if n.attr("target") == CONV]
    taken = [i for i in convs if conv_refusal(g, i) is None]
    in_kernels = {i for k in _conv_kernels(fast.plan) for i in k.info.nodes}
    assert convs and set(taken) <= in_kernels, [conv_refusal(g, i) for i in convs]
    if "transposed" not in problem.name:
        assert taken == convs, [conv_refusal(g, i) for i in convs]


def test_the_search_weighs_the_kernel_against_the_library_call(tmp_path):
    """The tuned plan comes from trials over both (the greedy plan with the kernel and the
    plan with the convolution in cuDNN are its starting points); equal to eager."""
    model = _model(torch.nn.Conv2d(4, 6, 3, padding=1, groups=2), torch.float32)
    x = torch.randn(2, 4, 7, 7)
    with torch.no_grad():
        fast = autofuse.optimize(
            model, (x,), trials=4, polish=0, cache_dir=str(tmp_path), progress=False
        )
        assert_close(fast(x), model(x), torch.float32)
    tuning = fast.tuning
    assert tuning.library_value is not None and tuning.greedy_value is not None
    assert all("search:" in s.describe(fast.plan.graph) for s in fast.plan.steps)
