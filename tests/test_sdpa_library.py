"""SDPA's backends as library calls (``kernels/library/sdpa.py``): what is offered for which form
of attention, the rule (torch's pick kept), the timed choice, the plan cache (the call stored by
name, the cuDNN version in the key) and the torch.compile backend end to end."""

import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from autofuse import cache
from autofuse.frontend.dynamo import make_backend
from autofuse.frontend.sdpa_written import WRITTEN
from autofuse.ir.graph import Graph, Node, contiguous_strides, make_attrs
from autofuse.kernels import library_calls, library_key_parts
from autofuse.kernels.library import sdpa
from autofuse.plan import EagerStep, LibraryStep, build_plan, execute
from autofuse.plan import planner as planner_module
from autofuse.plan.plan_choice import choose_plan, library_variants, with_calls
from autofuse.plan.planner import Planner
from autofuse.report import format_summary, summarize
from autofuse.settings import reload_settings

ROOT = Path(__file__).resolve().parents[1]
CPU = "aten._scaled_dot_product_flash_attention_for_cpu.default"
EFFICIENT = "aten._scaled_dot_product_efficient_attention.default"
CUDNN = "aten._scaled_dot_product_cudnn_attention.default"
FLASH = "aten._scaled_dot_product_flash_attention.default"


def _tensor(shape, dtype="float32", **attrs):
    return Node("input", (), tuple(shape), dtype, contiguous_strides(shape), make_attrs(**attrs))


def sdpa_graph(
    target=CPU, q=(1, 4, 8, 16), kv=(1, 4, 8, 16), mask=None, dtype="float32",
    dropout=0.0, is_causal=False, scale=None, aux_read=False,
):  # fmt: skip
    """One traced SDPA forward op as the backend hands it over: inputs q, k, v (and a mask),
    the op, its getitems; the output (and, ``aux_read``, the log-sum-exp: a training forward)."""
    nodes = [_tensor(q, dtype, index=0), _tensor(kv, dtype, index=1), _tensor(kv, dtype, index=2)]
    refs = [("__node__", 0), ("__node__", 1), ("__node__", 2)]
    kwargs = [] if scale is None else [("scale", scale)]
    if mask is not None:
        nodes.append(_tensor(mask[0], mask[1], index=3))
    if target == CPU:
        args, multi = (*refs, dropout, is_causal), 2
        kwargs += [("attn_mask", ("__node__", 3))] if mask is not None else []
    else:
        bias = ("__node__", 3) if mask is not None else None
        args, multi = (*refs, bias, aux_read, dropout, is_causal), 4 if target == EFFICIENT else 9
    n_in = len(nodes)
    attrs = make_attrs(args=("__seq__", "tuple", args), kwargs=tuple(sorted(kwargs)),
                       multi=multi, target=target)  # fmt: skip
    ins = tuple(range(n_in))
    nodes.append(Node("opaque", ins, tuple(q), dtype, contiguous_strides(q), attrs))
    op = len(nodes) - 1
    nodes.append(Node("getitem", (op,), tuple(q), dtype, contiguous_strides(q), (("index", 0),)))
    lse = tuple(q[:-1])
    nodes.append(Node("getitem", (op,), lse, "float32", contiguous_strides(lse), (("index", 1),)))
    outs = (op + 1, op + 2) if aux_read else (op + 1,)
    return Graph(tuple(nodes), ins, outs), op


def names(graph, i):
    return [c.name for c in library_calls(graph, frozenset({i}))]


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch's support checks faked: every backend takes the tensors, except flash a mask (as
    torch's own check says); the calls made are recorded."""
    seen = []

    def supports(backend, q, k, v, mask, is_causal, enable_gqa):
        seen.append((backend, mask is not None, is_causal, enable_gqa))
        return not (backend == "flash" and mask is not None)

    monkeypatch.setattr(sdpa, "cuda_supports", supports)
    return seen


@pytest.fixture
def forced(monkeypatch):
    """``forced(backend)``: AUTOFUSE_SDPA set for the test (the settings read again, and again
    once the environment is restored)."""
    yield lambda value: (monkeypatch.setenv("AUTOFUSE_SDPA", value), reload_settings())
    monkeypatch.undo()
    reload_settings()


# ---------------------------------------------------------------------------------------------
# Offers
# ---------------------------------------------------------------------------------------------


def test_a_cuda_forward_is_offered_every_backend_the_traced_one_first(fake_cuda):
    graph, op = sdpa_graph(EFFICIENT, is_causal=True, scale=0.3)
    assert names(graph, op) == ["efficient", "cudnn", "flash", "math"]
    call = library_calls(graph, frozenset({op}))[0]
    assert call.args == (0, 1, 2) and call.out == op and call.nodes == (op,)
    assert dict(call.params) == {"enable_gqa": False, "is_causal": True, "outputs": 4,
                                 "scale": 0.3}  # fmt: skip
    assert {s[2] for s in fake_cuda} == {True}  # the checks saw the causal flag


def test_a_mask_is_an_argument_and_a_backend_that_refuses_it_is_not_offered(fake_cuda):
    graph, op = sdpa_graph(CUDNN, mask=((8, 8), "bfloat16"), dtype="bfloat16")
    assert names(graph, op) == ["cudnn", "efficient", "math"]
    assert library_calls(graph, frozenset({op}))[0].args == (0, 1, 2, 3)


def test_gqa_is_read_from_the_head_counts(fake_cuda):
    graph, op = sdpa_graph(FLASH, q=(1, 8, 8, 16), kv=(1, 2, 8, 16))
    (call, *_) = library_calls(graph, frozenset({op}))
    assert call.name == "flash" and dict(call.params)["enable_gqa"] is True
    assert all(s[3] for s in fake_cuda)


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch's checks without CUDA")
def test_without_cuda_no_cuda_backend_is_offered():
    graph, op = sdpa_graph(EFFICIENT)  # torch's own checks, on a machine without CUDA
    assert names(graph, op) == ["math"]


def test_on_a_cpu_only_torchs_cpu_kernel_and_math_apply(fake_cuda):
    graph, op = sdpa_graph(CPU, mask=((8, 8), "bool"))
    assert names(graph, op) == ["flash", "math"]
    assert fake_cuda == []  # the CUDA checks are not asked


@pytest.mark.parametrize("target", [CPU, EFFICIENT])
def test_dropout_is_refused_and_the_op_runs_as_traced(fake_cuda, target):
    graph, op = sdpa_graph(target, dropout=0.1)
    assert names(graph, op) == []
    plan = build_plan(graph, [])
    (step,) = [s for s in plan.steps if op in s.nodes]
    assert isinstance(step, EagerStep) and "dropout 0.1" in step.reason


def test_a_training_forward_keeps_torchs_pick(fake_cuda):
    """Its log-sum-exp is read (saved for the backward): no other backend is offered."""
    graph, op = sdpa_graph(EFFICIENT, aux_read=True)
    assert names(graph, op) == []
    (step,) = [s for s in build_plan(graph, []).steps if op in s.nodes]
    assert isinstance(step, EagerStep)
    assert "SDPA's efficient backend" in step.reason and "training pair" in step.reason


def test_unknown_function_names_are_refused():
    with pytest.raises(ValueError, match="SDPA provider has no function 'tensorcore'"):
        sdpa.SdpaProvider().function("tensorcore")


# ---------------------------------------------------------------------------------------------
# The rule, the forced backend, the timed choice
# ---------------------------------------------------------------------------------------------


def _inputs(graph, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in graph.inputs:
        n = graph[i]
        if n.dtype == "bool":
            out.append(torch.rand(n.shape, generator=g) > 0.3)
        else:
            out.append(torch.randn(n.shape, generator=g, dtype=getattr(torch, n.dtype)))
    return out


def _reference(graph, ins):
    mask = ins[3] if len(ins) > 3 else None
    return F.scaled_dot_product_attention(*ins[:3], attn_mask=mask)


def test_the_rule_keeps_torchs_pick_as_a_library_call():
    graph, op = sdpa_graph(CPU, mask=((8, 8), "bool"))
    plan = build_plan(graph, [])
    (step,) = plan.library
    assert step.call.label == "sdpa.flash" and "torch's pick when tracing" in step.reason
    ins = _inputs(graph)
    torch.testing.assert_close(execute(plan, ins)[0], _reference(graph, ins))


def test_autofuse_sdpa_forces_a_backend_where_it_applies(forced):
    forced("math")
    graph, op = sdpa_graph(CPU, is_causal=True)
    assert names(graph, op) == ["math"] and library_variants(graph) == []  # nothing to time
    (step,) = build_plan(graph, []).library
    assert step.call.name == "math" and "AUTOFUSE_SDPA=math" in step.reason
    assert library_key_parts(graph) == {"sdpa": "math"}  # a forced plan has its own entry
    forced("cudnn")  # not on a CPU: the op runs as traced
    assert names(graph, op) == []
    (step,) = [s for s in build_plan(graph, []).steps if op in s.nodes]
    assert isinstance(step, EagerStep) and "SDPA's flash backend" in step.reason


def test_each_variant_runs_and_the_timed_choice_says_why():
    graph, op = sdpa_graph(CPU, q=(2, 4, 8, 16), kv=(2, 2, 8, 16))
    plan = build_plan(graph, [])
    variants = library_variants(graph)
    assert [name for name, _ in variants] == ["math"]  # flash is the rule's plan already
    other = with_calls(plan, variants[0])
    assert [s.call.label for s in other.library] == ["sdpa.math"]
    ins = _inputs(graph)
    ref = F.scaled_dot_product_attention(*ins, enable_gqa=True)
    for p in (plan, other):
        torch.testing.assert_close(execute(p, ins)[0], ref)
    times = iter([2e-6, 1e-6, 1e-6, 2e-6])  # the rule's plan, then math; then reversed
    chosen, choice = choose_plan([plan, other], lambda p: None, True, lambda run: next(times))
    assert chosen is other and choice.chosen.endswith("sdpa.math")


def test_the_untuned_planner_times_the_offers_on_cuda(monkeypatch):
    """With timing possible (faked: no interpreter, a timer that ranks math first), the
    untuned plan runs the faster backend and its step says it was measured."""
    graph, op = sdpa_graph(CPU, is_causal=True)
    times = iter([3e-6, 1e-6, 1e-6, 3e-6])  # the rule's plan (flash), then math; reversed
    timed = functools.partial(choose_plan, timer=lambda run: next(times))
    monkeypatch.setattr(planner_module, "interpreting", lambda: False)
    monkeypatch.setattr(planner_module, "choose_plan", timed)
    planned = Planner(graph).untuned("greedy inference", True, lambda: _inputs(graph))
    (step,) = planned.plan.library
    assert step.call.name == "math" and "measured: timed end to end" in step.reason
    assert planned.choice.chosen == "greedy inference, sdpa.math"


def test_explain_names_the_backend_and_why():
    graph, op = sdpa_graph(CPU)
    text = format_summary(summarize(build_plan(graph, [], label="plan")))
    assert "library sdpa.flash: SDPA runs its flash backend (torch's pick when tracing)" in text


# ---------------------------------------------------------------------------------------------
# The plan cache
# ---------------------------------------------------------------------------------------------


def test_the_cudnn_version_is_in_the_key_of_a_cuda_sdpa_graph():
    cuda, _ = sdpa_graph(CUDNN)
    cpu, _ = sdpa_graph(CPU)
    assert library_key_parts(cuda) == {"cudnn": str(torch.backends.cudnn.version())}
    assert library_key_parts(cpu) == {}


def test_an_sdpa_step_round_trips_through_the_cache_in_a_fresh_process(tmp_path, forced):
    forced("math")
    graph, op = sdpa_graph(CPU, mask=((8, 8), "float32"), is_causal=False)
    plan = build_plan(graph, [])
    assert [s.call.name for s in plan.library] == ["math"]
    cache.save_plan(tmp_path, "sdpa", plan, {})
    doc = (tmp_path / "plans" / "sdpa" / "plan.json").read_text()
    assert '"provider": "sdpa"' in doc and '"call": "math"' in doc
    ins = _inputs(graph)
    torch.save(ins, tmp_path / "inputs.pt")
    script = textwrap.dedent(
        f"""
        import torch, torch.nn.functional as F
        from autofuse import cache
        from autofuse.plan import execute
        ins = torch.load({str(tmp_path / "inputs.pt")!r})
        plan = cache.load_plan({str(tmp_path)!r}, "sdpa")
        (step,) = plan.library
        ref = F.scaled_dot_product_attention(*ins[:3], attn_mask=ins[3])
        torch.testing.assert_close(execute(plan, ins)[0], ref)
        print("OK", step.call.label)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "AUTOFUSE_SDPA"}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=180)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    assert r.stdout.strip() == "OK sdpa.math"


def test_an_entry_naming_an_unknown_backend_is_refused(tmp_path):
    from autofuse.cache.disk import plan_text

    graph, op = sdpa_graph(CPU)
    entry = cache.save_plan(tmp_path, "k", build_plan(graph, []), {})
    doc = json.loads((entry / "plan.json").read_text())
    step = next(s for s in doc["payload"]["steps"] if s["kind"] == "library")
    step["call"] = "tensorcore"
    (entry / "plan.json").write_text(plan_text("k", doc["payload"]))
    with pytest.warns(cache.CacheWarning, match="no function 'tensorcore'"):
        assert cache.load_plan(tmp_path, "k") is None


# ---------------------------------------------------------------------------------------------
# torch.compile(backend="autofuse") end to end
# ---------------------------------------------------------------------------------------------


def attention(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25, enable_gqa=True)


def _qkvm(t, requires_grad=False):
    g = torch.Generator().manual_seed(t)
    q = torch.randn(1, 4, t, 8, generator=g)
    k, v = (torch.randn(1, 2, t, 8, generator=g) for _ in range(2))
    mask = torch.randn(t, t, generator=g)
    return [x.requires_grad_(requires_grad) for x in (q, k, v)] + [mask]


def _steps(backend, kind):
    (rec,) = [r for r in backend.records if r.kind == kind]
    return [s for s in rec.plan.steps if isinstance(s, LibraryStep)], rec


def test_math_through_the_backend_matches_eager_forward_and_backward(forced):
    torch._dynamo.reset()
    forced("math")
    backend = make_backend()
    fast = torch.compile(attention, backend=backend)
    with torch.no_grad():  # an inference graph: its forward runs the math backend
        ins = _qkvm(5)
        torch.testing.assert_close(fast(*ins), attention(*ins))
    (step,), _ = _steps(backend, "inference")
    assert step.call.name == "math"
    ins, ref_ins = _qkvm(6, True), _qkvm(6, True)  # training: the pair's backward by math
    out, ref = fast(*ins), attention(*ref_ins)
    torch.testing.assert_close(out, ref)
    out.pow(2).sum().backward()
    ref.pow(2).sum().backward()
    for a, b in zip(ins[:3], ref_ins[:3], strict=True):
        torch.testing.assert_close(a.grad, b.grad)
    (bwd,), _ = _steps(backend, "backward")
    assert bwd.call.name == "math_backward"
    _, fwd = _steps(backend, "forward")
    assert any("training pair" in s.reason for s in fwd.plan.fallbacks)


def test_the_rule_through_the_backend_matches_eager_and_names_the_backend():
    torch._dynamo.reset()
    backend = make_backend()
    fast = torch.compile(attention, backend=backend)
    with torch.no_grad():
        ins = _qkvm(7)
        torch.testing.assert_close(fast(*ins), attention(*ins))
    (step,), rec = _steps(backend, "inference")
    assert step.call.name == "flash"  # torch's CPU kernel, as traced
    assert "sdpa.flash" in format_summary(summarize(rec.plan))


# ---------------------------------------------------------------------------------------------
# GPU: every backend offered at a real shape against eager
# ---------------------------------------------------------------------------------------------

GPU_FORMS = {
    "causal": dict(is_causal=True),
    "scale": dict(scale=0.1),
    "bool_mask": dict(mask="bool"),
    "additive_mask": dict(mask="float"),
    "gqa": dict(gqa=True, is_causal=True),
}


def _gpu_inputs(form, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(0)
    B, H, T, D = 2, 8, 256, 64
    kv_heads = 2 if form.get("gqa") else H
    q = torch.randn(B, H, T, D, device="cuda", dtype=dtype, generator=g)
    k, v = (torch.randn(B, kv_heads, T, D, device="cuda", dtype=dtype, generator=g)
            for _ in range(2))  # fmt: skip
    mask = None
    if form.get("mask") == "bool":
        mask = torch.rand(T, T, device="cuda", generator=g) > 0.2
    elif form.get("mask") == "float":
        mask = torch.randn(T, T, device="cuda", generator=g).to(dtype)
    return q, k, v, mask


@pytest.mark.gpu
@pytest.mark.parametrize("form", sorted(GPU_FORMS))
def test_gpu_each_offered_backend_matches_eager(form, forced):
    f = GPU_FORMS[form]

    def fn(q, k, v, mask):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=f.get("is_causal", False), scale=f.get("scale"),
            enable_gqa=bool(f.get("gqa")),
        )  # fmt: skip

    q, k, v, mask = _gpu_inputs(f)
    ref = fn(q.float(), k.float(), v.float(), None if mask is None else mask.float()
             if mask.dtype != torch.bool else mask)  # fmt: skip
    ran = set()
    for backend_name in sdpa.BACKENDS:
        torch._dynamo.reset()
        forced(backend_name)
        backend = make_backend(cuda_graph=False)
        with torch.no_grad():
            out = torch.compile(fn, backend=backend)(q, k, v, mask)
        torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
        steps, _ = _steps(backend, "inference")
        ran.update(s.call.name for s in steps)
    assert "math" in ran and len(ran) >= 2, ran


@pytest.mark.gpu
def test_gpu_the_untuned_plan_times_the_backends_and_says_so():
    def fn(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v, _ = _gpu_inputs({})
    torch._dynamo.reset()
    backend = make_backend(cuda_graph=False)
    with torch.no_grad():
        out = torch.compile(fn, backend=backend)(q, k, v, None)
    torch.testing.assert_close(out, fn(q, k, v, None), rtol=2e-2, atol=2e-2)
    steps, rec = _steps(backend, "inference")
    # SDPA's graph and the one with SDPA written out for autofuse's kernel timed; then, where
    # SDPA's won, its backends
    assert rec.plan_choice is not None and WRITTEN in rec.plan_choice.why
    if steps:
        (step,) = steps
        assert step.call.provider == "sdpa" and "measured: timed end to end" in step.reason
        assert "sdpa." in rec.plan_choice.why
    else:
        assert rec.plan_choice.chosen.endswith(WRITTEN)
        assert any(k.name.startswith("autofuse_att_") for k in rec.plan.kernels)
