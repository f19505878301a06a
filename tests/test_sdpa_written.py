"""SDPA written out for autofuse's attention kernel (``frontend/sdpa_written.py``): which
forwards are written out and why not, the values through the torch.compile backend (forced,
and timed beside SDPA's backends by the untuned planner), GQA, masks and causal alike."""

import functools

import pytest
import torch
import torch.nn.functional as F

from autofuse.frontend import dynamo
from autofuse.frontend.graph import prepare, to_ir
from autofuse.frontend.sdpa_written import WRITTEN, attention, sdpa_sites, why_not, written_out
from autofuse.plan import execute
from autofuse.plan import planner as planner_module
from autofuse.plan.plan_choice import choose_plan
from autofuse.plan.planner import Planner
from autofuse.settings import reload_settings


@pytest.fixture
def forced(monkeypatch):
    monkeypatch.setenv("AUTOFUSE_SDPA", "autofuse")
    reload_settings()
    yield
    monkeypatch.delenv("AUTOFUSE_SDPA")
    reload_settings()


def _qkv(b=1, h=4, t=16, d=8, hk=None, tk=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t, d, generator=g)
    k = torch.randn(b, hk or h, tk or t, d, generator=g)
    v = torch.randn(b, hk or h, tk or t, d, generator=g)
    return q, k, v


def _masked(q, k, v, m):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m) * 2


def _causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).relu()


def _gqa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _scaled(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, scale=0.3)


CASES = {
    "additive mask": (_masked, lambda: (*_qkv(), torch.randn(1, 1, 16, 16))),
    "causal": (_causal, lambda: _qkv()),
    "gqa": (_gqa, lambda: _qkv(hk=2)),
    "scale": (_scaled, lambda: _qkv(tk=24)),
}


def _traced(fn, args):
    """The backend's inference graph of ``fn`` (and its example inputs) as AOTAutograd hands it."""
    seen = {}
    compile_graph = dynamo.AutofuseBackend.compile_graph

    def spy(self, kind, gm, ex):
        seen.setdefault("graph", (gm, ex))
        return compile_graph(self, kind, gm, ex)

    torch._dynamo.reset()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dynamo.AutofuseBackend, "compile_graph", spy)
        torch.compile(fn, backend="autofuse")(*args)
    return seen["graph"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_forced_runs_autofuse_attention_kernel_and_matches_eager(case, forced):
    fn, make = CASES[case]
    args = make()
    torch._dynamo.reset()
    before = dynamo.compiled_count()
    out = torch.compile(fn, backend="autofuse")(*args)
    torch.testing.assert_close(out, fn(*args), rtol=1e-5, atol=1e-5)
    (record,) = dynamo.compiled_since(before)
    names = [k.name for k in record.plan.kernels]
    assert any(n.startswith("autofuse_att_") for n in names), names
    assert not record.plan.library and not record.fallback_ops()  # no SDPA op is left


def test_fresh_inputs_after_compiling(forced):
    """The compiled function is a function of its inputs (no value baked in at tracing)."""
    fn, make = CASES["additive mask"]
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="autofuse")
    compiled(*make())
    args = (*_qkv(seed=3), torch.randn(1, 1, 16, 16))
    torch.testing.assert_close(compiled(*args), fn(*args), rtol=1e-5, atol=1e-5)


def test_written_out_at_every_shape_of_a_dynamic_graph(forced):
    """A graph compiled for several lengths (Dynamo's symbolic trace, specialized per shape with
    inputs of its own fake mode) is written out at each one, the first included."""
    torch._dynamo.reset()
    before = dynamo.compiled_count()
    compiled = torch.compile(_causal, backend="autofuse", dynamic=True)
    for t in (16, 24, 40):
        args = _qkv(t=t, seed=t)
        torch.testing.assert_close(compiled(*args), _causal(*args), rtol=1e-5, atol=1e-5)
    records = dynamo.compiled_since(before)
    assert records
    for record in records:
        assert any(k.name.startswith("autofuse_att_") for k in record.plan.kernels)
        assert not record.plan.library and not record.fallback_ops()


@pytest.mark.parametrize(
    "fn, args, reason",
    [
        (
            lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
            (*_qkv(), torch.rand(1, 1, 16, 16) > 0.2),
            "a boolean mask",
        ),
        (
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            _qkv(tk=24),
            "causal with fewer queries than keys",
        ),
    ],
)
def test_what_is_not_written_out_says_why_and_stays_sdpa(fn, args, reason, forced):
    gm, ex = _traced(fn, args)
    (node,) = [n for n in gm.graph.nodes if "scaled_dot_product" in str(n.target)]
    assert reason in why_not(node)
    assert not sdpa_sites(gm) and written_out(gm, ex, {}) is None
    torch._dynamo.reset()
    before = dynamo.compiled_count()
    out = torch.compile(fn, backend="autofuse")(*args)
    torch.testing.assert_close(out, fn(*args), rtol=1e-5, atol=1e-5)
    (record,) = dynamo.compiled_since(before)
    ops = record.fallback_ops()  # the SDPA op, run by its backend
    assert [op for op in ops if "scaled_dot_product" in op], ops


def test_a_training_forward_is_not_written_out(forced):
    q, k, v = (t.requires_grad_() for t in _qkv())
    torch._dynamo.reset()
    before = dynamo.compiled_count()
    out = torch.compile(_causal, backend="autofuse")(q, k, v)
    out.sum().backward()
    ref = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    _causal(*ref).sum().backward()
    torch.testing.assert_close(q.grad, ref[0].grad, rtol=1e-4, atol=1e-5)
    kinds = [r.kind for r in dynamo.compiled_since(before)]
    assert kinds == ["forward", "backward"]


def test_the_math_written_out_is_sdpa():
    q, k, v = _qkv(hk=2, tk=24)
    m = torch.randn(1, 1, 16, 24)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True, scale=0.2)
    torch.testing.assert_close(attention(q, k, v, m, 0.2, False), want, rtol=1e-5, atol=1e-5)
    q, k, v = _qkv()
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(attention(q, k, v, None, None, True), want, rtol=1e-5, atol=1e-5)


def test_the_untuned_planner_times_the_written_out_graph(monkeypatch):
    """With timing possible (faked: no interpreter, a timer that ranks the written-out graph's
    plan first), the untuned plan is that graph's, and it computes what eager does."""
    fn, make = CASES["causal"]
    args = make()
    gm, ex = _traced(fn, args)
    prepared = prepare(gm, ex)
    graph, written = (
        to_ir(prepared),
        to_ir(prepare(written_out(gm, ex, dynamo.backend_decompositions()), ex)),
    )
    # the SDPA graph's plan, then the written-out one; the second round in reverse
    times = iter([3e-6, 1e-6, 1e-6, 3e-6])
    monkeypatch.setattr(planner_module, "interpreting", lambda: False)
    monkeypatch.setattr(
        planner_module, "choose_plan", functools.partial(choose_plan, timer=lambda run: next(times))
    )
    planned = Planner(graph, [(WRITTEN, written)]).untuned(
        "greedy inference", True, lambda: list(args)
    )
    assert planned.choice.chosen == f"greedy inference, {WRITTEN}"
    assert planned.plan.graph is written and not planned.plan.library
    (out,) = execute(planned.plan, list(args))
    torch.testing.assert_close(out, fn(*args), rtol=1e-5, atol=1e-5)


def test_a_tuned_backend_tunes_the_faster_graph_and_reuses_it(monkeypatch, tmp_path):
    """Tuned: the untuned plans of SDPA's graph and the written-out one are timed (faked: the
    written-out one ranks first) and that graph is tuned and cached; a second backend finds it
    in the cache without timing anything."""
    fn, make = CASES["causal"]
    args = make()
    gm, ex = _traced(fn, args)
    graph = to_ir(prepare(gm, ex))
    written = to_ir(prepare(written_out(gm, ex, dynamo.backend_decompositions()), ex))
    times = iter([3e-6, 1e-6, 1e-6, 3e-6])
    monkeypatch.setattr(planner_module, "interpreting", lambda: False)
    monkeypatch.setattr(
        planner_module, "choose_plan", functools.partial(choose_plan, timer=lambda run: next(times))
    )
    backend = dynamo.make_backend(trials=2, cache_dir=str(tmp_path), polish=0)
    planned = backend._tuned(Planner(graph, [(WRITTEN, written)]), "inference", list(args))
    assert planned.plan.graph.key == written.key and planned.entry is not None
    (out,) = execute(planned.plan, list(args))
    torch.testing.assert_close(out, fn(*args), rtol=1e-5, atol=1e-5)
    again = dynamo.make_backend(trials=2, cache_dir=str(tmp_path), polish=0)
    hit = again._tuned(Planner(graph, [(WRITTEN, written)]), "inference", list(args))
    assert hit.plan.graph.key == written.key and hit.entry is None  # from the cache, untimed


def test_the_untuned_planner_times_no_alternative_that_differs(monkeypatch):
    """An alternative graph whose plan gives other values than the plan's own (here a
    different program posing as one) is not a candidate, however fast: the choice keeps the
    plan and says why."""
    fn, make = CASES["causal"]
    args = make()
    graph = to_ir(prepare(*_traced(fn, args)))
    other = to_ir(prepare(*_traced(lambda q, k, v: fn(q, k, v) * 1.5, args)))
    times = iter([1e-6, 3e-6, 3e-6])  # the impostor ranked fastest, were it timed
    monkeypatch.setattr(planner_module, "interpreting", lambda: False)
    monkeypatch.setattr(
        planner_module, "choose_plan", functools.partial(choose_plan, timer=lambda run: next(times))
    )
    planned = Planner(graph, [("impostor", other)]).untuned("greedy inference", True, lambda: args)
    assert planned.plan.graph is graph
    assert "impostor: not a candidate" in (planned.choice.why if planned.choice else "")
    (out,) = execute(planned.plan, list(args))
    torch.testing.assert_close(out, fn(*args), rtol=1e-5, atol=1e-5)
