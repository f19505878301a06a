"""CPU unit tests of capture, the IR, the partitioner and the explain report."""

import os
import subprocess
import sys

import pytest
import torch

import autofuse
from autofuse.capture.trace import CaptureError, capture
from autofuse.ir.graph import Graph, Node
from autofuse.kernels import FusionRefused, KernelConfig, analyze_group, generate
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import InputError

from .workloads import cases, pointwise_example, reduction_example, sin_cos, softmax


def test_explain_seed_pointwise_example():
    x, w, b = (torch.randn(64, 64) for _ in range(3))
    e = autofuse.explain(pointwise_example, (x, w, b))
    assert e.launches == (3, 1)
    assert e.intermediates_removed == 2
    assert e.memory_ops == (8, 4)
    text = str(e)
    assert "kernel launches: 3 -> 1" in text and "memory ops: 8 -> 4" in text
    assert e.fused_plan.kernels[0].name == "autofuse_poi_fused_add_mul_sigmoid_0"


def test_seed_reduction_kernel_name_and_result():
    x = torch.randn(16, 64)
    opt = autofuse.optimize(reduction_example, (x,))
    assert [k.name for k in opt.plan.kernels] == ["autofuse_per_fused_add_mul_sum_0"]
    torch.testing.assert_close(opt(x), reduction_example(x))


def test_looped_reduction_is_named_red():
    fn, args = cases()["softmax"]
    g = capture(fn, args).graph
    group = Partitioner(g).greedy().groups[0]
    info = analyze_group(g, group)
    k = generate(g, info, KernelConfig(2, 16, 1))
    assert k.name.startswith("autofuse_red_fused_amax_div_exp_sub_sum")
    assert "for roffset in range(0, rnumel, RBLOCK):" in k.source


def test_structural_key_ignores_names_and_sees_shapes():
    a = capture(softmax, (torch.randn(4, 8),)).graph

    def other_softmax(y):
        return torch.softmax(y, -1)

    b = capture(other_softmax, (torch.randn(4, 8),)).graph
    c = capture(softmax, (torch.randn(4, 9),)).graph
    d = capture(softmax, (torch.randn(4, 8, dtype=torch.bfloat16),)).graph
    assert a.key == b.key
    assert len({a.key, c.key, d.key}) == 3


def test_graph_rejects_forward_reference():
    n = Node("neg", (1,), (2,), "float32", (1,))
    with pytest.raises(ValueError, match="earlier node"):
        Graph((n, Node("input", (), (2,), "float32", (1,))), (1,), (0,))


def test_views_become_index_arithmetic_not_copies():
    def f(x, y):
        return (x.t() * 2.0 + y[:, 1:4]).reshape(-1)

    x, y = torch.randn(3, 5), torch.randn(5, 8)
    opt = autofuse.optimize(f, (x, y))
    assert len(opt.plan.kernels) == 1 and not opt.plan.fallbacks
    src = opt.plan.kernels[0].source
    assert "% 3" in src or "// 3" in src  # the transpose is an index expression
    torch.testing.assert_close(opt(x, y), f(x, y))


def test_horizontal_fusion_loads_input_once():
    x = torch.randn(300)
    opt = autofuse.optimize(sin_cos, (x,))
    (k,) = opt.plan.kernels
    assert k.source.count("tl.load(") == 1 and k.source.count("tl.store(") == 2
    s, c = opt(x)
    torch.testing.assert_close(s, torch.sin(x))
    torch.testing.assert_close(c, torch.cos(x))


def test_partitioner_lists_every_partition_of_the_seed_example():
    x, w, b = (torch.randn(4, 8) for _ in range(3))
    space = Partitioner(capture(pointwise_example, (x, w, b)).graph)
    keys = {p.key for p in space.enumerate()}
    mul, add, sig = space.nodes
    assert keys == {
        ((mul,), (add,), (sig,)),
        ((mul, add), (sig,)),
        ((mul,), (add, sig)),
        ((mul, add, sig),),
    }
    assert [e.kind for e in space.edges] == ["vertical", "vertical"]
    # decisions round-trip
    for p in space.enumerate():
        assert space.from_decisions(space.decisions_of(p)).key == p.key


def test_refusals_have_reasons():
    def two_domains(x):
        return x.sum(0), (x * 2).sum(1)

    space = Partitioner(capture(two_domains, (torch.randn(4, 8),)).graph)
    with pytest.raises(FusionRefused, match="one reduction domain"):
        analyze_group(space.graph, frozenset(space.nodes))
    reasons = [r.reason for r in space.greedy().refusals]
    assert reasons and all(reasons)
    assert any("reduction domain" in r for r in reasons)


def test_non_convex_group_refused():
    def f(x):
        a = x * 2.0
        b = torch.logcumsumexp(a, 0)  # eager op between a and c
        return a + b

    space = Partitioner(capture(f, (torch.randn(4, 8),)).graph)
    mul, add = space.nodes
    assert space.check(frozenset({mul, add})).startswith("not convex")


def test_capture_errors_name_the_input():
    with pytest.raises(CaptureError, match="leaf 1 is a str"):
        capture(lambda x, s: x, (torch.randn(2), "hello"))
    with pytest.raises(CaptureError, match="single Tensor"):
        capture(lambda x: x, torch.randn(2))


def test_plan_input_errors():
    x, w, b = (torch.randn(4, 8) for _ in range(3))
    opt = autofuse.optimize(pointwise_example, (x, w, b))
    with pytest.raises(InputError, match=r"input 0 .*float32\[4, 8\], got float32\[4, 9\]"):
        opt(torch.randn(4, 9), w, b)
    with pytest.raises(InputError, match="expected a torch.Tensor"):
        opt.plan and autofuse.plan.runtime.execute(opt.plan, [1.0, w, b])


def test_scalar_inputs_are_specialized():
    def f(x, alpha):
        return x * alpha + 1.0

    x = torch.randn(8)
    opt = autofuse.optimize(f, (x, 0.5))
    torch.testing.assert_close(opt(x, 0.5), f(x, 0.5))
    with pytest.raises(InputError, match="specialized for 0.5"):
        opt(x, 0.7)


def test_scalar_arguments_take_the_plain_call_path():
    """f(x, n_head, y): the scalars the trace fixed are compared, the tensors go straight to
    the plan (no pytree walk); another scalar, or one of another type, is refused by name."""

    def f(x, n, y):
        return x.reshape(n, -1) * 2.0 + y

    x, y = torch.randn(12), torch.randn(3, 4)
    opt = autofuse.optimize(f, (x, 3, y))
    assert opt.plain_call and not opt._flat_call
    assert opt._plain_tensors((x, 3, y)) == (x, y)
    assert opt._plain_tensors((x, 3.0, y)) is None  # a float 3.0 is not the traced int 3
    torch.testing.assert_close(opt(x, 3, y), f(x, 3, y))
    with pytest.raises(InputError, match="specialized for 3"):
        opt(x, 4, y)


def test_module_parameters_are_inputs():
    mod = torch.nn.LayerNorm(16)
    with torch.no_grad():
        mod.weight.normal_()
    x = torch.randn(3, 16)
    opt = autofuse.optimize(mod, (x,))
    torch.testing.assert_close(opt(x), mod(x).detach(), atol=1e-5, rtol=1e-4)
    with torch.no_grad():
        mod.bias.add_(1.0)  # the plan reads the module's current parameters
    torch.testing.assert_close(opt(x), mod(x).detach(), atol=1e-5, rtol=1e-4)


def test_output_code_log(tmp_path):
    code = (
        "import torch, autofuse\n"
        "from tests.workloads import pointwise_example as f\n"
        "x = torch.randn(8)\n"
        "autofuse.optimize(f, (x, x, x))\n"
    )
    env = dict(os.environ, AUTOFUSE_LOGS="output_code", TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=os.path.dirname(os.path.dirname(__file__)), timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "def autofuse_poi_fused_add_mul_sigmoid_0(" in r.stderr


def test_dedupe_merges_repeated_pure_nodes():
    """mean(x) and x - mean(x) written twice: capture keeps one of each (the decomposed
    layer_norm keeps one moment mean, with its one shift by the row's first element, and one
    x - mean). Outputs keep their own nodes (no aliasing) and opaque ops are never merged."""
    fn, args = cases()["layernorm"]
    ops = [n.op for n in capture(fn, args).graph.nodes]
    assert ops.count("clamp") == 1 and ops.count("sub") == 2, ops

    def centred_twice(x):
        return (x - x.mean(-1, keepdim=True)) * (x - x.mean(-1, keepdim=True))

    ops = [n.op for n in capture(centred_twice, (torch.randn(4, 5),)).graph.nodes]
    assert ops.count("mean") == 1 and ops.count("sub") == 1, ops

    def twice(x):
        return x + 1, x + 1, torch.logcumsumexp(x, 0) + torch.logcumsumexp(x, 0)

    x = torch.randn(4, 5)
    g = capture(twice, (x,)).graph
    a, b, _ = g.outputs
    assert a != b and g[a].op == g[b].op == "add"
    assert [n.op for n in g.nodes].count("opaque") == 2
    opt = autofuse.optimize(twice, (x,))
    for got, want in zip(opt(x), twice(x)):
        torch.testing.assert_close(got, want)
    assert opt(x)[0] is not opt(x)[1]


def test_dedupe_is_a_graph_pass():
    from autofuse.ir.graph import dedupe

    x = Node("input", (), (4,), "float32", (1,))
    e1 = Node("exp", (0,), (4,), "float32", (1,))
    e2 = Node("exp", (0,), (4,), "float32", (1,), name="again")
    add = Node("add", (1, 2), (4,), "float32", (1,))
    g = dedupe(Graph((x, e1, e2, add), (0,), (3,)))
    assert [n.op for n in g.nodes] == ["input", "exp", "add"] and g[2].inputs == (1, 1)
