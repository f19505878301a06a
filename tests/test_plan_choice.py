"""The untuned plan's measured choice between fused matmul kinds and cuBLAS (timer injected)."""

from types import SimpleNamespace

import torch

from autofuse.frontend import dynamo
from autofuse.plan.plan_choice import choose_plan


def _plans(*labels):
    return [SimpleNamespace(label=lb) for lb in labels]


def test_the_faster_plan_wins_and_both_times_are_kept():
    fused, cublas = _plans("fused", "cublas")
    times = {"fused": 616e-6, "cublas": 300e-6}
    ran = []
    plan, choice = choose_plan(
        [fused, cublas], ran.append, True, timer=lambda call: call() or times[ran[-1].label]
    )
    assert plan is cublas and choice.chosen == "cublas"
    assert dict(choice.times) == times
    assert "616.0 us" in choice.why and "300.0 us" in choice.why


def test_the_first_plan_stays_within_the_margin_and_off_cuda():
    fused, cublas = _plans("fused", "cublas")
    times = {"fused": 100e-6, "cublas": 99e-6}  # 1 % faster: inside the 2 % margin
    ran = []
    plan, _ = choose_plan(
        [fused, cublas], ran.append, True, timer=lambda call: call() or times[ran[-1].label]
    )
    assert plan is fused
    plan, choice = choose_plan([fused, cublas], ran.append, False)
    assert plan is fused and choice.times == (("fused", None),) and "not timed" in choice.why


def test_a_plan_that_fails_is_not_chosen_and_says_why():
    fused, cublas = _plans("fused", "cublas")

    def run(plan):
        if plan is cublas:
            raise RuntimeError("no cuBLAS here")

    plan, choice = choose_plan([fused, cublas], run, True, timer=lambda call: call() or 1e-3)
    assert plan is fused and dict(choice.times)["cublas"] is None
    assert "no cuBLAS here" in choice.why


def test_the_backend_keeps_the_fused_attention_on_cpu_without_timing():
    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1) @ v

    q, k, v = (torch.randn(2, 12, 16) for _ in range(3))
    backend = dynamo.make_backend()
    out = torch.compile(attention, backend=backend)(q, k, v)
    torch.testing.assert_close(out, attention(q, k, v), rtol=1e-4, atol=1e-4)
    (rec,) = backend.records
    assert rec.plan_choice is None  # not on CUDA: the fused plan, nothing timed
    assert "attention" in [kk.info.kind for kk in rec.plan.kernels]


def test_untuned_plan_times_both_and_runs_the_faster(monkeypatch):
    """With the inputs on CUDA (here: said to be), the fused attention plan and the cuBLAS
    plan are both run and timed; the faster (by the injected timer: the cuBLAS one) is kept
    and computes what eager computes."""
    import autofuse
    from autofuse.plan import execute, planner

    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1) @ v

    args = tuple(torch.randn(2, 12, 16) for _ in range(3))
    graph = autofuse.capture(attention, args).graph
    runs = []

    def timer(call):
        call()
        return 1e-3 if "cuBLAS" in runs[-1] else 2e-3

    def run(plan):
        runs.append(plan.label)
        return execute(plan, list(args))

    real = planner.choose_plan
    monkeypatch.setattr(planner, "interpreting", lambda: False)
    monkeypatch.setattr(
        planner, "choose_plan", lambda plans, _run, on_cuda: real(plans, run, on_cuda, timer)
    )
    planned = planner.Planner(graph).untuned("greedy", True, lambda: args)
    plan, choice = planned.plan, planned.choice
    assert choice is not None and choice.chosen == "greedy, matmuls in cuBLAS"
    # two interleaved rounds, the second in reverse
    assert runs == ["greedy", *["greedy, matmuls in cuBLAS"] * 2, "greedy"]
    assert "attention" not in [k.info.kind for k in plan.kernels]
    (out,) = execute(plan, list(args))
    torch.testing.assert_close(out, attention(*args), rtol=1e-4, atol=1e-4)


def test_a_failed_measurement_keeps_the_fused_plan_and_says_why(monkeypatch):
    import autofuse
    from autofuse.plan import planner

    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1) @ v

    args = tuple(torch.randn(2, 12, 16) for _ in range(3))
    graph = autofuse.capture(attention, args).graph
    monkeypatch.setattr(planner, "interpreting", lambda: False)

    def no_inputs():
        raise RuntimeError("cannot make inputs here")

    planned = planner.Planner(graph).untuned("greedy", True, no_inputs)
    plan, choice = planned.plan, planned.choice
    assert "attention" in [k.info.kind for k in plan.kernels]
    assert choice.chosen == "greedy" and "cannot make inputs here" in choice.why


def test_one_rule_decides_every_faster_plan_choice():
    """The untuned choice, the CUDA graph choice and the tuned re-timing share ``beats``: faster
    by more than MIN_GAIN and by more than the spread of the incumbent's rounds."""
    from autofuse.plan.graph_choice import MIN_GAIN, beats, choose_replay

    assert MIN_GAIN == 0.02
    assert beats(97e-6, [100e-6]) and not beats(98.5e-6, [100e-6])
    assert not beats(96e-6, [100e-6, 105e-6, 100e-6])  # 4 % faster, 5 % spread: noise
    assert beats(90e-6, [100e-6, 105e-6])
    times = {"plain": 100e-6, "graph": 98.5e-6}
    c = choose_replay(lambda: "plain", lambda: "graph", True, lambda call: times[call()])
    assert not c.replay
    fused, cublas = _plans("fused", "cublas")
    ran = []
    times = {"fused": 100e-6, "cublas": 97e-6}
    plan, _ = choose_plan(
        [fused, cublas], ran.append, True, timer=lambda call: call() or times[ran[-1].label]
    )
    assert plan is cublas
