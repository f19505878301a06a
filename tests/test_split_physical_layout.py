"""Split reductions by the layout their kernels read (``ir/split_layout.py``): a convolution kept
channels-last (``ir/conv_layout.py``) holds its channels innermost, so the global pool
``mean(dims=(2, 3))`` of its result is an *outer* reduction (the kept channels are the
neighbours in memory), though logically its reduced dims are the innermost. The layouts are
chosen before the split; the split classifies by them and orders the chunked view as memory
holds it (``[N, C, k, L] -> [N, k, L, C]``): the first stage's rows run along the channels,
contiguous. Values equal eager's through both front ends, forward and backward; the plan with
every convolution contiguous (the planner's other plan) is made from the graph before the
split (``ir/pipeline.relaid``): its reductions split again, or not, for that layout, and it
equals eager too."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse.capture.trace import capture
from autofuse.ir.conv_layout import channels_last_strides
from autofuse.ir.graph import Graph, Node, contiguous_strides, make_attrs
from autofuse.ir.pipeline import relaid
from autofuse.ir.split import SplitPolicy, decide, plan_splits, split_reductions
from autofuse.kernels.reduction.kind import inner_rows
from autofuse.plan.planner import Planner
from autofuse.plan.runtime import execute
from autofuse.settings import reload_settings

from .helpers import assert_close, backend_training_matches

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py


def _pool_graph(shape, kept: bool, dims=(2, 3), op="mean") -> Graph:
    """x -> relu -> mean over ``dims``; with ``kept`` the relu's result is kept channels-last
    (as ``keep_inputs`` records a layout: its strides, eager's in ``eager_strides``)."""
    plain = contiguous_strides(shape)
    attrs = make_attrs(eager_strides=plain) if kept else ()
    strides = channels_last_strides(shape) if kept else plain
    out = tuple(s for j, s in enumerate(shape) if j not in dims)
    nodes = (
        Node("input", (), shape, "float32", plain, make_attrs(index=0), "x"),
        Node("relu", (0,), shape, "float32", strides, attrs, "relu"),
        Node(op, (1,), out, "float32", contiguous_strides(out),
             make_attrs(dims=dims, keepdim=False), "pool"),
    )  # fmt: skip
    return Graph(nodes, (0,), (2,))


@pytest.mark.parametrize("shape", [(2, 64, 128, 128), (2, 64, 32, 64, 64)])
def test_decide_classifies_by_the_kept_layout(shape):
    dims = tuple(range(2, len(shape)))
    cl = decide(_pool_graph(shape, True, dims), 2, SplitPolicy())
    assert "(outer (channels-last))" in cl.reason and cl.k > 1, cl
    assert cl.order == (0, 2, 3, 1)  # [N, C, k, L] read as [N, k, L, C]
    flat = decide(_pool_graph(shape, False, dims), 2, SplitPolicy())
    assert "(inner)" in flat.reason and flat.k > 1 and flat.order == (), flat
    # the H100's L2_42: 2048 rows of 514 x 514 fill the SMs as an inner reduction; outer, split
    big = (16, 128, 514, 514)
    assert decide(_pool_graph(big, False), 2, SplitPolicy()).k == 1
    assert decide(_pool_graph(big, True), 2, SplitPolicy()).k > 64


def test_the_split_partial_ends_with_the_channels():
    g = split_reductions(_pool_graph((2, 64, 128, 128), True), SplitPolicy())
    (part,) = [n for n in g.nodes if n.name == "pool.part"]
    view = g[part.inputs[0]]
    assert view.op == "permute" and view.shape[-1] == 64 and part.attr("dims") == (2,)
    assert part.shape[-1] == 64 and g[g.outputs[0]].shape == (2, 64)


def test_a_channel_reduction_of_a_kept_layout_is_inner():
    """amax over the channels of a kept (1, 65536, 2, 2) result: each row contiguous in
    memory (an inner reduction), though logically (H, W) follow the reduced dim."""
    dec = decide(_pool_graph((1, 65536, 2, 2), True, dims=(1,), op="amax"), 2, SplitPolicy())
    assert "(inner (channels-last))" in dec.reason and dec.k > 1, dec
    assert dec.order == (0, 3, 4, 1, 2)  # [N, k, L, H, W] read as [N, H, W, k, L]


class _Pool(torch.nn.Module):
    """Conv2d / Conv3d -> global mean (L2_42's pool), ConvTranspose2d -> mul -> mean over
    (2, 3) -> mean (L2_44), or ConvTranspose2d -> 2 x 2 max pool -> hardtanh -> mean -> tanh
    (L2_10: the mean reads the kept result through the pool's strided windows)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.kind = kind
        self.conv = {
            "conv2d": lambda: torch.nn.Conv2d(3, 32, 3, padding=1),
            "conv3d": lambda: torch.nn.Conv3d(2, 32, 3, padding=1),
            "convT2d": lambda: torch.nn.ConvTranspose2d(4, 32, 4, stride=2, padding=1),
            "pooled": lambda: torch.nn.ConvTranspose2d(4, 32, 3, stride=1, padding=1),
        }[kind]()

    def forward(self, x):
        y = self.conv(x)
        if self.kind == "pooled":
            y = F.hardtanh(F.max_pool2d(y, 2), -1, 1)
            return torch.tanh(y.mean(dim=(2, 3), keepdim=True))
        if self.kind == "convT2d":
            y = (y * 0.5).mean(dim=(2, 3), keepdim=True)
            return y.mean(dim=(2, 3), keepdim=True)
        return y.mean(dim=tuple(range(2, y.dim())))


_INPUTS = {"conv2d": (2, 3, 16, 16), "conv3d": (1, 2, 8, 8, 8), "convT2d": (2, 4, 8, 8),
           "pooled": (2, 4, 32, 32)}  # fmt: skip


def _first_stage(graph: Graph) -> Node:
    (part,) = [n for n in graph.nodes if n.name.endswith(".part") and n.kind == "reduction"]
    return part


@pytest.mark.parametrize(
    "kind,dtype",
    [("conv2d", torch.float32), ("conv2d", torch.bfloat16), ("conv3d", torch.float32),
     ("convT2d", torch.float32), ("pooled", torch.float32), ("pooled", torch.bfloat16)],
)  # fmt: skip
def test_global_pool_of_a_channels_last_convolution(kind, dtype, cl_split):
    from autofuse.frontend import dynamo

    net = _Pool(kind).to(dtype)
    x = torch.randn(_INPUTS[kind], dtype=dtype)
    with torch.no_grad():
        opt = autofuse.optimize(net, (x,))
        assert_close(opt(x), net(x), dtype, f"{kind} optimize")
    part = _first_stage(opt.plan.graph)
    assert opt.plan.graph[part.inputs[0]].op == "permute" and part.shape[-1] == 32
    (first,) = [k for k in opt.plan.kernels if any(opt.plan.graph[m] is part for m in k.info.nodes)]
    assert first.info.domain[-1] == 32 and inner_rows(opt.plan.graph, first.info) == 32
    before = backend_training_matches(net, x, dtype, kind)
    forward = dynamo.compiled_since(before)[0].plan.graph
    assert forward[_first_stage(forward).inputs[0]].op == "permute"


@pytest.mark.parametrize("n,size", [(2, 16), (8, 17)])
def test_batch_norm_statistics_of_a_channels_last_convolution(n, size, cl_split):
    """A variance over (N, H, W) of the kept result: chunk statistics read as memory holds
    them (the channels innermost), Chan's combine, eager's values forward and backward. At
    16 x 16 the policy cuts (H, W); 8 x 17 x 17 (no divisor of 289 near the chunks wanted) is
    a long variance row, cut along N (``_cached_variances``)."""
    torch.manual_seed(0)
    # (no bias: its gradient through BatchNorm is 0 up to rounding; a SiLU after it: the
    # gradient of BatchNorm's output squared alone cancels to rounding too)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1, bias=False), torch.nn.BatchNorm2d(32), torch.nn.SiLU()
    )
    x = torch.randn(n, 3, size, size)
    with torch.no_grad():
        opt = autofuse.optimize(net, (x,))
        assert_close(opt(x), net(x), torch.float32, "optimize")
    g = opt.plan.graph
    chunk = [n for n in g.nodes if n.name.endswith(".chunk_m2")]
    assert chunk and all(n.shape[-1] == 32 for n in chunk)  # (1, k, 1, C) / (k, 1, 1, 1, C)
    assert [n.op for n in g.nodes if n.name.endswith(".chunks_t")] == ["permute"]
    backend_training_matches(net, x, torch.float32, "batch norm")


def test_the_contiguous_plan_splits_for_its_own_layout(cl_split):
    """The planner's plan with every convolution contiguous is made from the graph before the
    split: the global pool, an outer reduction of the channels-last result (its chunked view
    permuted into memory's order), is decided again as an inner one
    of the contiguous result (too short to split there: no chunk, no permute); eager's
    values."""
    torch.manual_seed(0)
    w, b = torch.randn(32, 3, 3, 3), torch.randn(32)
    x = torch.randn(2, 3, 16, 16)

    def pool(x, w, b):
        return F.conv2d(x, w, b, padding=1).mean(dim=(2, 3))

    graph = capture(pool, (x, w, b)).graph
    assert any(n.op == "permute" for n in graph.nodes)
    planner = Planner(graph)
    (flat,) = planner.alternatives(planner.space.untuned(), "untuned")
    assert flat.label == "untuned, convolutions contiguous"
    assert not any(n.attr("eager_strides") for n in flat.graph.nodes)
    assert flat.graph == relaid(graph, "contiguous")
    assert not any(n.op == "permute" for n in flat.graph.nodes)
    # an inner row of 256 is under two chunks of 2 x 256: not split
    assert not any(n.name.endswith(".part") for n in flat.graph.nodes)
    with torch.no_grad():
        (got,) = execute(flat, [x, w, b])
    assert_close(got, pool(x, w, b), torch.float32, "contiguous plan")


def test_a_split_only_the_channels_last_layout_wants(cl_split):
    """A softmax over the plane of a convolution's result, 144 rows of 256 (KernelBench L2_38's
    form): an outer reduction of the kept channels-last result, split; rows enough to fill the
    SMs in the contiguous one, not split there. The contiguous plan reads no chunk (its
    kernels were the channels-last split's, read across the contiguous result, 3x slower on
    an H100), and both equal eager."""
    torch.manual_seed(0)
    w, b = torch.randn(48, 3, 3, 3), torch.randn(48)
    x = torch.randn(3, 3, 16, 16)

    def soft(x, w, b):
        y = F.conv2d(x, w, b, padding=1).clamp(0, 1)
        return torch.softmax(y.flatten(2), dim=2).view_as(y)

    graph = capture(soft, (x, w, b)).graph
    assert any(n.name.endswith(".part") for n in graph.nodes)
    flat = relaid(graph, "contiguous")
    assert not any(n.name.endswith(".part") for n in flat.nodes)
    back = relaid(flat, "channels_last")  # from the contiguous graph before its passes
    assert any(n.name.endswith(".part") for n in back.nodes)
    with torch.no_grad():
        for g in (graph, flat, back):
            (got,) = execute(Planner(g).greedy(), [x, w, b])
            assert_close(got, soft(x, w, b), torch.float32, "softmax plan")


def test_arg_reductions_of_a_channels_last_convolution(cl_split):
    """argmax / amax over the flattened plane of a kept result (a view of it): split by the
    layout's classification, the arg split on the logical chunks; eager's indices."""
    from autofuse.frontend import dynamo

    torch.manual_seed(0)
    w, b = torch.randn(32, 3, 3, 3), torch.randn(32)
    x = torch.randn(2, 3, 16, 16)

    def arg(x, w, b):
        y = F.conv2d(x, w, b, padding=1).flatten(2)
        return y.argmax(-1), y.amax(-1)

    graph = capture(arg, (x, w, b)).graph
    parts = {n.op: n for n in graph.nodes if n.name.endswith(".part")}
    assert set(parts) == {"argmax", "amax"}, graph.pretty()
    assert graph[parts["amax"].inputs[0]].op == "permute"  # its chunks read along C
    want = arg(x, w, b)
    with torch.no_grad():
        got = autofuse.optimize(arg, (x, w, b))(x, w, b)
    before = dynamo.compiled_count()
    compiled = torch.compile(arg, backend="autofuse", dynamic=False)(x, w, b)
    assert dynamo.compiled_count() > before
    y = F.conv2d(x, w, b, padding=1).flatten(2)
    for idx, top in (got, compiled):  # (the convolution runs channels-last: ulps apart)
        assert idx.dtype == torch.int64 and torch.equal(idx, want[0]), (idx, want[0])
        assert_close(top, want[1], torch.float32, "amax")
        assert_close(y.gather(-1, idx[..., None])[..., 0], want[1], torch.float32, "argmax")


@pytest.mark.parametrize("case", ["channels_last_input", "permuted_view"])
def test_inputs_and_views_read_in_their_layout(case, cl_split, monkeypatch):
    """A channels-last graph input's global pool is outer (its chunks read along C); a sum
    over (H, W) of a contiguous input viewed as (N, H, W, C) is inner (logically outer: C
    follows the reduced dims). Eager's values through both front ends."""
    from autofuse.frontend import dynamo

    x = torch.randn(2, 32, 32, 32)
    if case == "channels_last_input":
        x = x.contiguous(memory_format=torch.channels_last)
        fn, kind = (lambda t: t.mean(dim=(2, 3))), "(outer (channels-last))"
    else:
        fn, kind = (lambda t: t.permute(0, 2, 3, 1).sum(dim=(1, 2))), "(inner (strides"
    monkeypatch.setenv("AUTOFUSE_SPLIT_REDUCTIONS", "0")  # the graph before the split
    reload_settings()
    graph = capture(fn, (x,)).graph
    monkeypatch.setenv("AUTOFUSE_SPLIT_REDUCTIONS", "1")
    reload_settings()
    (reason,) = [d.reason for d in plan_splits(graph, SplitPolicy(min_rnumel=256)).values()]
    assert kind in reason, reason
    with torch.no_grad():
        assert_close(autofuse.optimize(fn, (x,))(x), fn(x), torch.float32, f"{case} optimize")
    before = dynamo.compiled_count()
    got = torch.compile(fn, backend="autofuse", dynamic=False)(x)
    assert dynamo.compiled_count() > before
    assert_close(got, fn(x), torch.float32, f"{case} compile")


def test_a_reshape_that_is_no_view_of_a_permuted_layout(cl_split):
    """A reduction's input read through a reshape of a permuted input (the matmul backward's
    ``x.mT`` flattened): the layout walk stops there (torch raises ValueError, not only
    RuntimeError, for such a view) and the split goes on as for any unknown layout."""

    def program(x, w):
        return x.sum(-1, keepdim=True), torch.matmul(x.mT, w)

    torch.manual_seed(0)
    x, w = torch.randn(1, 2, 2, 2, requires_grad=True), torch.randn(2, 1, requires_grad=True)
    refs = program(x, w)
    grads = torch.autograd.grad(sum(r.sum() for r in refs), (x, w))
    got = torch.compile(program, backend="autofuse")(x, w)
    for a, b in zip(got, refs):
        torch.testing.assert_close(a, b)
    for a, b in zip(torch.autograd.grad(sum(r.sum() for r in got), (x, w)), grads):
        torch.testing.assert_close(a, b)
