"""Each convolution's memory format as a stated rule (ir/conv_layout.py): measured once per
convolution where CUDA is present (here with an injected timer on CPU tensors), eager's layout
on a CPU, or forced by AUTOFUSE_CONV_LAYOUT; a channels-last step converts its inputs once and
gives its output back in eager's strides; both front ends equal eager, forward and backward."""

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse.capture.trace import capture
from autofuse.ir.conv_fold import is_convolution
from autofuse.ir.conv_layout import channels_last_strides, choose_layouts, relayout
from autofuse.ir.eager import bind_node
from autofuse.kernels.reduction.kind import inner_rows
from autofuse.settings import reload_settings
from tests.helpers import assert_close, backend_training_matches

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
    ((i,), (k,)) = _convs(graph), _convs(chosen)
    assert not any(isinstance(r, FakeTensor) for r in results)
    assert chosen[k].attr("layout") == "channels_last" and chosen[k].attr("layout_us") == (3, 2)
    torch.testing.assert_close(results[0], results[1])  # both formats: one result
    # the GELU reads it: kept channels-last, its strides on the node, eager's remembered
    assert results[1].stride() == tuple(chosen[k].strides) != tuple(graph[i].strides)
    assert chosen[k].strides == channels_last_strides(tuple(graph[i].shape))
    assert chosen[k].attr("eager_strides") == tuple(graph[i].strides)
    # the input converted by a generated copy, not in the convolution's step
    copy = chosen[chosen[k].inputs[0]]
    assert (
        copy.op == "copy"
        and copy.attr("layout_copy")
        and copy.strides == (channels_last_strides(tuple(x.shape)))
    )
    assert choose_layouts(graph, cuda=True, rule="eager") is graph
    assert choose_layouts(graph, cuda=False, rule="measure") is graph


def test_a_returned_convolution_is_given_back_in_eagers_strides():
    torch.manual_seed(0)
    conv, x = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False), torch.randn(2, 3, 6, 5)
    graph = capture(conv, (x,)).graph
    chosen = choose_layouts(graph, cuda=True, rule="channels_last")
    ((i,), (k,)) = _convs(graph), _convs(chosen)
    assert chosen[k].attr("layout") == "channels_last" and chosen[k].strides == graph[i].strides
    node = graph[i]  # run as chosen, on the input as given
    node = type(node)(**{**node.__dict__, "attrs": chosen[k].attrs})
    args = {0: x, 1: conv.weight.detach()}
    out = bind_node(node)("cpu", *[args[k] for k in range(len(node.inputs))])
    assert out.stride() == tuple(graph[i].strides)


def test_relayout_undoes_and_redoes_a_kept_layout():
    net, x = _net("conv2d")
    graph = capture(net, (x,)).graph
    cl = choose_layouts(graph, cuda=True, rule="channels_last")
    ((i,), (k,)) = _convs(graph), _convs(cl)
    back = relayout(cl, "contiguous")
    assert len(back.nodes) == len(graph.nodes)  # the input's copy gone with the layout
    assert back[i].attr("layout") == "contiguous" and back[i].strides == graph[i].strides
    assert back[i].attr("eager_strides") is None
    again = relayout(back, "channels_last")
    assert again[k].strides == cl[k].strides and again[k].attr("eager_strides") == graph[i].strides
    assert [n.op for n in again.nodes] == [n.op for n in cl.nodes]
    assert relayout(graph, "contiguous") == graph  # no recorded layout: nothing changes


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
    before = backend_training_matches(net, x, dtype, kind, strides=True)
    forward = dynamo.compiled_since(before)[0].plan.graph
    assert [forward[i].attr("layout") for i in _convs(forward)] == ["channels_last"]


def test_explain_names_the_layout(layout_rule):
    layout_rule("channels_last")
    net, x = _net("conv3d")
    (note,) = autofuse.explain(net, (x,)).fused.convolutions
    assert "channels_last (AUTOFUSE_CONV_LAYOUT)" in note


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dims", [2, 3])
def test_kept_channels_last_is_read_by_a_two_axis_tile(dims, dtype, layout_rule):
    """The epilogue reads the kept channels-last result along its channels (the tile's
    columns) and writes eager's contiguous output along its rows: eager's values and strides,
    through both front ends, forward and backward."""
    from autofuse.frontend import dynamo

    layout_rule("channels_last")
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 16, 3, padding=1) if dims == 2 else torch.nn.Conv3d(2, 16, 2)
    net = torch.nn.Sequential(conv, torch.nn.SiLU()).to(dtype)
    x = torch.randn((2, 3, 5, 4) if dims == 2 else (1, 2, 3, 4, 3), dtype=dtype)
    with torch.no_grad():
        f = autofuse.optimize(net, (x,))
        got = f(x)
    assert_close(got, net(x), dtype, "optimize")
    assert got.stride() == net(x).stride()
    tiled = [k for k in f.plan.kernels if k.config.RBLOCK == 16]
    assert tiled, [k.name for k in f.plan.kernels]
    before = backend_training_matches(net, x, dtype, "tiled", strides=True)
    assert dynamo.compiled_count() > before


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_a_pooled_epilogue_of_a_kept_result_is_tiled_by_channels(pool, layout_rule):
    """An epilogue that pools the kept channels-last result (KernelBench L2_82: tanh, scale,
    bias, 4 x 4 max-pool) writes a smaller output than the convolution's: its loads still run
    along the channels (the tile's columns), not 16 channels apart per lane of a flat loop."""
    layout_rule("channels_last")
    torch.manual_seed(0)
    pooling = torch.nn.MaxPool2d(2) if pool == "max" else torch.nn.AvgPool2d(2)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.Tanh(), pooling)
    x = torch.randn(2, 3, 10, 9)
    with torch.no_grad():
        f = autofuse.optimize(net, (x,))
        got = f(x)
    assert_close(got, net(x), torch.float32, "optimize")
    assert got.stride() == net(x).stride()
    epilogue = [k for k in f.plan.kernels if k.info.domain == tuple(got.shape)]
    assert epilogue and epilogue[0].info.reduce_dims == (1,), [k.name for k in f.plan.kernels]
    backend_training_matches(net, x, torch.float32, "pooled", strides=True)


def test_the_planner_offers_the_plan_with_every_convolution_contiguous(layout_rule):
    from autofuse.plan.planner import Planner

    layout_rule("channels_last")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU())
    graph = capture(net, (torch.randn(2, 3, 5, 4),)).graph
    planner = Planner(graph)
    (flat,) = planner.alternatives(planner.space.untuned(), "untuned")
    assert flat.label == "untuned, convolutions contiguous"
    (i,), (k,) = _convs(flat.graph), _convs(graph)
    assert flat.graph[i].attr("layout") == "contiguous" and flat.graph[i].strides == (
        graph[k].attr("eager_strides")
    )
    layout_rule("contiguous")
    graph = capture(net, (torch.randn(2, 3, 5, 4),)).graph
    assert Planner(graph).alternatives(Planner(graph).space.untuned(), "untuned") == []


@pytest.mark.parametrize("reduce", ["spatial_mean", "pooled_mean", "channel_max"])
def test_a_reduction_of_a_kept_channels_last_result(reduce, layout_rule):
    """A mean over H x W reads the kept result along its channels (neighbouring rows): a block
    of rows, not one, through a max pool's windows too (L2_10); a max over the channels reads
    each row contiguously. Eager's values."""
    layout_rule("channels_last")
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 32, 3, padding=1)

    def f(x):
        y = torch.relu(conv(x))
        if reduce == "pooled_mean":
            return torch.tanh(F.max_pool2d(y, 2).clamp(-1, 1).mean((2, 3), keepdim=True))
        return y.mean((2, 3)) if reduce == "spatial_mean" else y.amax(1)

    x = torch.randn(2, 3, 6, 5)
    with torch.no_grad():
        opt = autofuse.optimize(f, (x,))
        assert_close(opt(x), f(x), torch.float32, reduce)
    (red,) = [k for k in opt.plan.kernels if k.info.reduces]
    # the spatial mean's 32 channels are neighbouring rows in memory; the channel max's rows
    # (positions) are not
    assert inner_rows(opt.plan.graph, red.info) == (1 if reduce == "channel_max" else 32)


def test_the_plan_holds_a_layout_map_and_explain_shows_it(layout_rule):
    layout_rule("channels_last")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU())
    x = torch.randn(2, 3, 5, 4)
    with torch.no_grad():
        plan = autofuse.optimize(net, (x,)).plan
    ((c, _), (i, (mine, eager))) = sorted(plan.layouts.items())  # the input's copy, the conv
    assert plan.graph[c].attr("layout_copy") and plan.graph[i].attr("layout") == "channels_last"
    assert mine == channels_last_strides((2, 16, 5, 4)) and eager == (320, 20, 4, 1)
    assert all(o not in plan.layouts for o in plan.graph.outputs)  # outputs: eager's strides
    text = str(autofuse.explain(net, (x,)))
    assert "layouts (buffers not in eager's strides):" in text
    copy = plan.layouts[c]  # the input's copy is read by the convolution, whichever runs it
    assert f"strides {list(copy[0])} (eager {list(copy[1])}), read by " in text
    layout_rule("contiguous")
    with torch.no_grad():
        assert autofuse.optimize(net, (x,)).plan.layouts == {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_chain_of_convolutions_converts_nothing_between_them(dtype, layout_rule):
    """conv -> ReLU -> conv -> SiLU channels-last: the first epilogue writes the second
    convolution's input channels-last (a kept layout), the second epilogue writes eager's
    contiguous output; values and strides as eager's, both front ends, forward and backward;
    the plan with every convolution contiguous undoes both."""
    layout_rule("channels_last")
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 8, 1), torch.nn.SiLU(),
    ).to(dtype)  # fmt: skip
    x = torch.randn(2, 3, 5, 4, dtype=dtype)
    graph = capture(net, (x,)).graph
    kept = [i for i, n in enumerate(graph.nodes) if n.attr("eager_strides") is not None]
    relu = [i for i in kept if graph[i].op == "relu"]
    assert len(relu) == 1 and graph[relu[0]].strides == channels_last_strides((2, 16, 5, 4))
    ops = [graph[i].op for i in kept if not is_convolution(graph[i])]
    # the input's copy, then the chain's pointwise values (the peeled bias, ReLU, SiLU's parts)
    assert (
        ops[0] == "copy"
        and "relu" in ops
        and set(ops[1:]) <= {"add", "relu", "sigmoid", "mul", "cast"}
    )
    outs = {graph.base_of(o) for o in graph.outputs}
    assert not outs & set(kept)  # outputs: eager's strides
    flat = relayout(graph, "contiguous")
    assert not any(n.attr("eager_strides") for n in flat.nodes)
    with torch.no_grad():
        f = autofuse.optimize(net, (x,))
        got = f(x)
    assert_close(got, net(x), dtype, "optimize")
    assert got.stride() == net(x).stride() and set(f.plan.layouts) >= set(relu)
    backend_training_matches(net, x, dtype, "chain", strides=True)


def test_mixed_picks_offer_the_plan_with_every_convolution_channels_last():
    """Each convolution picked alone (its input's conversion in its time) can leave a network
    converting between formats at every layer; where the picks differ the planner also builds
    the plan with every convolution channels-last: one conversion at the input, the layers
    between read and write channels-last, values and output strides as eager's."""
    from autofuse.ir.conv_layout import channels_last_differs
    from autofuse.plan.planner import Planner
    from autofuse.plan.runtime import execute

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 8, 3, padding=1), torch.nn.ReLU(),
    )  # fmt: skip
    x = torch.randn(2, 3, 6, 5)
    graph = capture(net, (x,)).graph
    times = iter([3e-6, 2e-6, 2e-6, 3e-6])  # the first faster channels-last, the second not
    picked = choose_layouts(graph, cuda=True, rule="measure", timer=lambda fn: next(times),
                            device="cpu")  # fmt: skip
    assert [picked[i].attr("layout") for i in _convs(picked)] == ["channels_last", "contiguous"]
    assert channels_last_differs(picked)
    assert not channels_last_differs(relayout(picked, "channels_last"))
    planner = Planner(picked)
    alts = planner.alternatives(planner.space.untuned(), "untuned")
    (cl,) = [p for p in alts if p.label == "untuned, convolutions channels-last"]
    assert [cl.graph[i].attr("layout") for i in _convs(cl.graph)] == ["channels_last"] * 2
    copies = [n for n in cl.graph.nodes if n.attr("layout_copy")]
    assert len(copies) == 1 and copies[0].inputs == (graph.inputs[0],)  # converted once
    with torch.no_grad():
        (got,) = execute(cl, [x, *[p.detach() for p in net.parameters()]][: len(graph.inputs)])
        want = net(x)
    assert_close(got, want, torch.float32, "channels-last plan")
    assert got.stride() == want.stride()


def test_a_chain_picked_contiguous_is_also_timed_channels_last():
    """Every convolution picked contiguous, each alone (its input's conversion in its time,
    as MobileNetV2's 52 were on an H100 where the network runs faster channels-last through
    and through): the plan with every convolution channels-last is timed beside it; a single
    convolution picked contiguous offers none (its pick already weighed the conversion) unless
    the pick was close."""
    from autofuse.ir.conv_layout import channels_last_differs
    from autofuse.plan.planner import Planner

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 1), torch.nn.ReLU6(),
        torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.ReLU6(),
    )  # fmt: skip
    x = torch.randn(2, 3, 6, 5)
    graph = capture(net, (x,)).graph
    times = iter([2e-6, 3e-6, 2e-6, 3e-6])  # contiguous faster, each alone
    picked = choose_layouts(graph, cuda=True, rule="measure", timer=lambda fn: next(times),
                            device="cpu")  # fmt: skip
    assert [picked[i].attr("layout") for i in _convs(picked)] == ["contiguous"] * 2
    assert channels_last_differs(picked)
    planner = Planner(picked)
    labels = [p.label for p in planner.alternatives(planner.space.untuned(), "untuned")]
    assert "untuned, convolutions channels-last" in labels
    one = capture(torch.nn.Conv2d(3, 8, 1), (x,)).graph
    times = iter([2e-6, 3e-6])
    one = choose_layouts(one, cuda=True, rule="measure", timer=lambda fn: next(times),
                         device="cpu")  # fmt: skip
    assert [one[i].attr("layout") for i in _convs(one)] == ["contiguous"]
    assert not channels_last_differs(one)
    # one picked contiguous by less than DOUBT (alone its input converts by eager's copy, in
    # the plan by a generated kernel): the channels-last plan is timed too
    close = capture(torch.nn.Conv2d(3, 8, 1), (x,)).graph
    times = iter([2e-6, 2.2e-6])
    close = choose_layouts(close, cuda=True, rule="measure", timer=lambda fn: next(times),
                           device="cpu")  # fmt: skip
    assert [close[i].attr("layout") for i in _convs(close)] == ["contiguous"]
    assert channels_last_differs(close)
