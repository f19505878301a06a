"""Library steps: a group run by a named library call (the cuBLAS provider's ``mm`` / ``bmm`` /
``addmm``) beside generated kernels and eager ops, behind one step protocol; stored in the plan
cache as provider + function + arguments and loaded in a new process without Optuna."""

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from autofuse import cache
from autofuse.capture.trace import capture
from autofuse.kernels import LibraryCall, library_calls
from autofuse.partition.partitioner import Partitioner
from autofuse.plan import EagerStep, KernelStep, LibraryStep, Plan, build_plan, execute
from autofuse.plan.steps import StepProtocol

ROOT = Path(__file__).resolve().parents[1]


def three_kinds(a, b, bias):
    y = torch.relu(a @ b + bias)  # addmm (chosen) + a relu kernel
    s = torch.sort(y, dim=-1).values  # an op autofuse does not generate: eager
    return torch.sigmoid(s) * 2.0, torch.bmm(y[None], y.t()[None])  # a kernel; a lone bmm


def linear_args():
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(6, 8, generator=g),
        torch.randn(8, 5, generator=g),
        torch.randn(5, generator=g),
    )


def mm_add_nodes(graph):
    """The graph's (first) mm and the add that reads it."""
    mm = next(i for i, n in enumerate(graph.nodes) if n.op == "mm")
    add = next(i for i, n in enumerate(graph.nodes) if n.op == "add" and mm in n.inputs)
    return mm, add


def _plan(args):
    """The greedy partition with the mm and its bias add chosen as one ``addmm`` call."""
    graph = capture(three_kinds, args).graph
    space = Partitioner(graph)
    mm, add = mm_add_nodes(graph)
    groups = [g - {mm, add} for g in space.greedy().groups]
    groups = [g for g in groups if g] + [frozenset({mm, add})]
    (call,) = library_calls(graph, frozenset({mm, add}))
    assert call.name == "addmm" and call.args[1:] == graph[mm].inputs
    return build_plan(graph, groups, [None] * (len(groups) - 1) + [call])


def _check(outs, args):
    for o, r in zip(outs, three_kinds(*args), strict=True):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)


def test_a_plan_holds_kernel_library_and_eager_steps_and_matches_eager():
    args = linear_args()
    plan = _plan(args)
    kinds = {type(s) for s in plan.steps}
    assert kinds == {KernelStep, LibraryStep, EagerStep}, plan.steps
    assert sorted(s.implementation for s in plan.library) == ["cublas.addmm", "cublas.bmm"]
    assert all(isinstance(s, StepProtocol) for s in plan.steps)
    _check(execute(plan, list(args)), args)
    _check(execute(plan, list(args)), args)  # the program's second call (bound once)


def test_every_step_runs_alone_on_a_calls_state():
    """``step.run`` (the protocol's slow path) gives what the program gives."""
    from autofuse.plan.runtime import _Run  # noqa: PLC2701 - the call's state, as a test

    args = linear_args()
    plan = _plan(args)
    run = _Run(plan, torch.device("cpu"), dict(zip(plan.graph.inputs, args)))
    for step in plan.steps:
        step.run(run)
    _check([run.get(o) for o in plan.graph.outputs], args)


def test_steps_describe_their_implementation():
    args = linear_args()
    plan = _plan(args)
    g = plan.graph
    text = {t.__name__: [s.describe(g) for s in plan.steps if type(s) is t]
            for t in (KernelStep, LibraryStep, EagerStep)}  # fmt: skip
    assert {t.split(":")[0] for t in text["LibraryStep"]} == {
        "library cublas.addmm", "library cublas.bmm"}  # fmt: skip
    assert all("cuBLAS" in t for t in text["LibraryStep"])
    assert all(" kernel autofuse_" in t for t in text["KernelStep"])
    assert any(t.startswith("eager aten.sort") for t in text["EagerStep"])


def test_the_rule_runs_a_lone_matmul_as_cublas_mm_and_nothing_else():
    def f(a, b):
        return a @ b + 1.0

    a, b = torch.randn(4, 8), torch.randn(8, 3)
    graph = capture(f, (a, b)).graph
    plan = build_plan(graph, Partitioner(graph).untuned().groups)
    (step,) = plan.library
    assert step.call == LibraryCall("cublas", "mm", graph[step.out].inputs, step.out, (step.out,))
    assert len(plan.kernels) == 1 and not plan.fallbacks
    torch.testing.assert_close(execute(plan, [a, b])[0], f(a, b))


def test_a_call_no_provider_offers_is_refused():
    def f(a, b):
        return a @ b

    a, b = torch.randn(4, 8), torch.randn(8, 3)
    graph = capture(f, (a, b)).graph
    (mm,) = [i for i, n in enumerate(graph.nodes) if n.op == "mm"]
    bogus = LibraryCall("cublas", "bmm", graph[mm].inputs, mm, (mm,))
    with pytest.raises(ValueError, match="no library offers cublas.bmm"):
        build_plan(graph, [frozenset({mm})], [bogus])


def test_addmm_is_not_offered_where_the_product_is_read_elsewhere():
    def f(a, b, bias):
        p = a @ b
        return p + bias, p * 2.0

    graph = capture(f, linear_args()).graph
    (mm,) = [i for i, n in enumerate(graph.nodes) if n.op == "mm"]
    add = next(i for i, n in enumerate(graph.nodes) if n.op == "add")
    assert library_calls(graph, frozenset({mm, add})) == ()
    assert [c.name for c in library_calls(graph, frozenset({mm}))] == ["mm"]


def test_library_steps_round_trip_through_the_cache_in_a_fresh_process(tmp_path):
    """All three step kinds saved, then loaded and run in a new process that never imports
    Optuna (a library step is provider + function + arguments: no code is stored)."""
    args = linear_args()
    plan = _plan(args)
    cache.save_plan(tmp_path, "three-kinds", plan, {"function": "three_kinds"})
    doc = (tmp_path / "plans" / "three-kinds" / "plan.json").read_text()
    assert '"kind": "library"' in doc and '"provider": "cublas"' in doc and "addmm" in doc
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = cache.load_plan(tmp_path, "three-kinds")
    assert loaded == plan
    torch.save(args, tmp_path / "inputs.pt")
    script = textwrap.dedent(
        f"""
        import sys, warnings
        warnings.simplefilter("error")
        import torch
        from autofuse import cache
        from autofuse.plan import execute
        from tests.test_library_steps import three_kinds
        args = torch.load({str(tmp_path / "inputs.pt")!r})
        plan = cache.load_plan({str(tmp_path)!r}, "three-kinds")
        kinds = sorted({{type(s).__name__ for s in plan.steps}})
        for o, r in zip(execute(plan, list(args)), three_kinds(*args), strict=True):
            torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)
        assert "optuna" not in sys.modules, "optuna was imported"
        print("OK", *kinds)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180
    )
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    assert r.stdout.strip() == "OK EagerStep KernelStep LibraryStep"


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [("provider", "nolib", "unknown library provider"), ("call", "gemv", "no function"),
     ("out", 999, "outside the graph")],
)  # fmt: skip
def test_an_entry_naming_an_unknown_call_is_corrupt(tmp_path, field, value, problem):
    import json

    from autofuse.cache.disk import plan_text

    args = linear_args()
    plan = _plan(args)
    entry = cache.save_plan(tmp_path, "k", plan, {})
    doc = json.loads((entry / "plan.json").read_text())
    step = next(s for s in doc["payload"]["steps"] if s["kind"] == "library")
    step[field] = value
    (entry / "plan.json").write_text(plan_text("k", doc["payload"]))
    with pytest.warns(cache.CacheWarning, match=problem):
        assert cache.load_plan(tmp_path, "k") is None


def test_a_bucket_keeps_its_library_calls():
    from autofuse.plan.buckets import BucketPlans
    from autofuse.plan.planner import Planner

    args = linear_args()
    plan = _plan(args)
    buckets = BucketPlans()
    buckets.remember("structure", ("b",), plan, searched=False)
    again = Planner(plan.graph).rebuilt(buckets.partition("structure", ("b",)), "again")
    assert again is not None and [s.call for s in again.library] == [s.call for s in plan.library]
    assert isinstance(again, Plan)
