"""Implementations are choices: every provider that can run a group offers its choices
(generated kernels of each kind that claims it x configs, library calls, eager); a plan is
built from one choice per group; the untuned rule and the search's measurements say why each
step is what it is, and ``explain`` and the reports show it."""

import torch

import autofuse
from autofuse.capture.trace import capture
from autofuse.kernels import EAGER, KINDS, FusionRefused, KernelChoice, LibraryCall, offers
from autofuse.partition.partitioner import Partitioner
from autofuse.plan import build_plan, execute

from .test_library_steps import linear_args, mm_add_nodes


def linear_relu(a, b, bias):
    return torch.relu(a @ b + bias)


def test_every_provider_offers_its_choices():
    args = linear_args()
    graph = capture(linear_relu, args).graph
    mm, add = mm_add_nodes(graph)
    got = offers(graph, frozenset({mm, add}))
    families = [o.family for o in got]
    assert families[-1] == "eager" and got[-1].choice == EAGER
    assert [o.label for o in got if o.family == "library"] == ["cublas.addmm"]
    kernels = [o.choice for o in got if o.family == "kernel"]
    assert len(kernels) > 1 and len(set(kernels)) == len(kernels)
    # all claimers offer: each kind that claims and accepts the group, nothing else
    group = frozenset({mm, add})
    accepting = set()
    for kind in KINDS:
        if kind.claims(graph, group):
            try:
                kind.analyze(graph, group)
                accepting.add(kind.name)
            except FusionRefused:
                pass
    assert {c.kind for c in kernels} == accepting and accepting
    (lone,) = [o for o in offers(graph, frozenset({mm})) if o.family == "library"]
    assert lone.choice == LibraryCall("cublas", "mm", graph[mm].inputs, mm, (mm,))


def test_each_family_builds_a_plan_that_matches_eager():
    args = linear_args()
    graph = capture(linear_relu, args).graph
    mm, add = mm_add_nodes(graph)
    rest = [g - {mm, add} for g in Partitioner(graph).unfused().groups]
    rest = [g for g in rest if g]
    seen = set()
    for offer in offers(graph, frozenset({mm, add})):
        if offer.family in seen:
            continue
        seen.add(offer.family)
        plan = build_plan(graph, [*rest, frozenset({mm, add})], [None] * len(rest) + [offer.choice])
        step_kinds = {type(s).__name__ for s in plan.steps if mm in s.nodes or add in s.nodes}
        want = {"kernel": "KernelStep", "library": "LibraryStep", "eager": "EagerStep"}
        assert step_kinds == {want[offer.family]}, (offer, plan.steps)
        assert any("chosen among" in s.reason for s in plan.steps), offer
        torch.testing.assert_close(execute(plan, list(args))[0], linear_relu(*args))
    assert seen == {"kernel", "library", "eager"}


def test_a_kernel_choice_names_its_kind():
    args = linear_args()
    graph = capture(linear_relu, args).graph
    group = frozenset(Partitioner(graph).greedy().groups[0])
    first = next(o.choice for o in offers(graph, group) if o.family == "kernel")
    assert isinstance(first, KernelChoice)
    plan = build_plan(graph, [group], [first])
    assert plan.kernels[0].info.kind == first.kind


def test_the_untuned_plan_says_each_step_follows_the_rule():
    def f(a, b):
        return torch.sigmoid(a @ b) * 2.0

    a, b = torch.randn(4, 8), torch.randn(8, 3)
    opt = autofuse.optimize(f, (a, b))
    g = opt.plan.graph
    described = [s.describe(g) for s in opt.plan.steps]
    assert any(d.startswith("library cublas.mm") and "rule:" in d for d in described), described
    assert any(" kernel autofuse_" in d and "rule:" in d for d in described), described
    assert all(d in opt.report() for d in described)


def test_explain_names_the_implementation_of_each_group():
    def f(a, b):
        return torch.sort(torch.sigmoid(a @ b), -1).values + 1.0

    a, b = torch.randn(4, 8), torch.randn(8, 3)
    text = str(autofuse.explain(f, (a, b)))
    assert "implementations:" in text
    assert "gemm kernel autofuse_mm" in text and "rule:" in text  # the greedy plan fuses the mm
    assert "library cublas.mm: mm runs as torch.mm" in text  # the unfused plan: cuBLAS
    assert "eager aten.sort" in text


def test_a_timed_untuned_choice_says_what_was_measured(monkeypatch):
    from autofuse.tune import untuned

    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1) @ v

    args = tuple(torch.randn(2, 12, 16) for _ in range(3))
    graph = capture(attention, args).graph
    real = untuned.choose_plan

    def timer(call):
        call()
        return 1e-3

    monkeypatch.setattr(untuned, "interpreting", lambda: False)
    monkeypatch.setattr(
        untuned, "choose_plan", lambda plans, run, on_cuda: real(plans, run, on_cuda, timer)
    )
    plan, choice = untuned.untuned_plan(graph, "greedy", True, lambda: args)
    assert choice is not None and "timed end to end" in choice.why
    assert all("measured: timed end to end" in s.reason for s in plan.steps), plan.steps
    torch.testing.assert_close(execute(plan, list(args))[0], attention(*args))


def test_the_searched_plan_says_what_each_step_measured(tmp_path):
    def f(a, b):
        return torch.sigmoid(a @ b) * 2.0 + 1.0

    a, b = torch.randn(4, 8), torch.randn(8, 3)
    opt = autofuse.optimize(f, (a, b), trials=3, polish=0, cache_dir=str(tmp_path), progress=False)
    g = opt.plan.graph
    reasons = [s.describe(g) for s in opt.plan.steps]
    assert all("search:" in r for r in reasons), reasons
    assert all(r in opt.report() for r in reasons)
    torch.testing.assert_close(opt(a, b), f(a, b))
