"""The untuned plan's timed launch configs (``plan/config_choice.py``): the kinds offer a few
configs per kernel, an injected timer times them, the fastest is kept where it beats the
default by more than the margin, and the plan with them is checked against the rule's plan and
timed end to end beside it. Timing is faked here (no GPU); the chosen kernels run in the
interpreter and must give eager's values."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse.capture import capture
from autofuse.kernels import KernelConfig, quick_configs
from autofuse.kernels.pointwise import kind as pointwise
from autofuse.kernels.reduction import kind as reduction
from autofuse.partition import Partitioner
from autofuse.plan import execute
from autofuse.plan import planner as planner_module
from autofuse.plan.config_choice import MARGIN, WORTH_S, describe, fastest, timed_configs
from autofuse.plan.plan_choice import choose_plan
from autofuse.plan.planner import Planner
from autofuse.plan.steps import KernelStep


def group_norm(x, w, b):
    return F.group_norm(x, 8, w, b).relu()


def norm_inputs():
    return [torch.randn(64, 32, 4, 4), torch.rand(32) + 0.5, torch.randn(32)]


@pytest.fixture
def on_gpu(monkeypatch):
    """The kinds and the planner as on a GPU (their interpreter guards off)."""
    for module in (pointwise, reduction, planner_module):
        monkeypatch.setattr(module, "interpreting", lambda: False)


def _planner(fn, ins):
    return Planner(capture(fn, ins).graph)


def test_kinds_offer_their_default_first_then_a_few_others(on_gpu):
    graph = capture(lambda a: a * 2 + 1, [torch.rand(64, 4096)]).graph
    space = Partitioner(graph)
    (group,) = space.greedy().groups
    offered = quick_configs(space.check(group), graph)
    assert offered[0] == KernelConfig(1024, 0, 4) and len(offered) == len(set(offered)) == 3
    assert pointwise.STRIDED_CONFIG in offered
    planner = _planner(group_norm, norm_inputs())
    infos = [planner.space.check(g) for g in planner.space.untuned().groups]
    rows = [i for i in infos if i.kind == "reduction"]
    assert rows and all(len(quick_configs(i, planner.graph)) >= 2 for i in rows)
    # short rows (GroupNorm's groups of 64 elements) get more rows a block than the default
    assert any(c.XBLOCK >= 32 for i in rows for c in quick_configs(i, planner.graph))


def test_nothing_is_offered_in_the_interpreter():
    graph = capture(lambda a: a * 2 + 1, [torch.rand(64, 4096)]).graph
    space = Partitioner(graph)
    (group,) = space.greedy().groups
    assert quick_configs(space.check(group), graph) == []


def test_the_fastest_config_replaces_the_default_only_past_the_margin():
    a, b = KernelConfig(1024, 0, 4), KernelConfig(512, 0, 8)
    assert fastest(a, [(a, 10e-6), (b, 9e-6)]) == b
    assert fastest(a, [(a, 10e-6), (b, 10e-6 * (1 - MARGIN / 2))]) == a
    assert fastest(a, [(a, None), (b, 20e-6)]) == b  # the default failed or was wrong
    assert fastest(a, [(a, None), (b, None)]) == a
    assert "512" in describe(b, [(a, 10e-6), (b, None)]) and "failed" in describe(b, [(b, None)])


def test_timed_configs_picks_per_kernel_and_says_why(on_gpu):
    planner = _planner(group_norm, norm_inputs())
    base = planner.space.untuned()
    plan = planner.build(base.groups, label="greedy")

    def by_rows(graph, info, config):  # more rows a block is faster, a 1-row block fails
        return None if config.XBLOCK == 1 else 1e-3 / config.XBLOCK

    choices, reasons = timed_configs(plan, base.groups, by_rows)
    picked = [c for c in choices if c is not None]
    assert picked and all(c.XBLOCK >= 32 for c in picked)
    assert all("measured: configs timed alone" in r and "failed" in r for r in reasons.values())
    assert timed_configs(plan, base.groups, lambda g, i, c: 20e-6) is None  # nothing changes


def test_a_launch_bound_kernel_is_timed_at_its_default_alone(on_gpu):
    planner = _planner(group_norm, norm_inputs())
    base = planner.space.untuned()
    plan = planner.build(base.groups, label="greedy")
    seen = []

    def short(graph, info, config):  # the default under WORTH_S, any other config faster
        seen.append(config)
        return WORTH_S / 2 if len(seen) == 1 else WORTH_S / 10

    assert timed_configs(plan, base.groups, short) is None
    assert len(seen) == 1


def test_the_untuned_plan_runs_the_timed_configs_and_gives_eagers_values(on_gpu, monkeypatch):
    ins = norm_inputs()
    planner = _planner(group_norm, ins)
    times = iter([1e-6, 3e-6, 3e-6, 1e-6])  # timed configs' plan first; reversed in round 2
    monkeypatch.setattr(
        planner_module, "choose_plan", functools.partial(choose_plan, timer=lambda run: next(times))
    )
    planned = planner.untuned(
        "greedy", True, lambda: ins, time_config=lambda g, i, c: 1e-3 / c.XBLOCK
    )
    assert planned.choice is not None and planned.choice.chosen == "greedy"
    assert "greedy, default configs" in dict(planned.choice.times)
    kernel_steps = [s for s in planned.plan.steps if isinstance(s, KernelStep)]
    steps = [s for s in kernel_steps if "configs timed alone" in s.reason]
    assert steps and any(s.kernel.config.XBLOCK >= 32 for s in steps)
    monkeypatch.undo()  # run the chosen kernels in the interpreter
    (out,) = execute(planned.plan, ins)
    torch.testing.assert_close(out, group_norm(*ins), rtol=1e-5, atol=1e-5)


def test_without_a_timer_the_untuned_plan_keeps_the_default_configs(on_gpu):
    ins = [torch.rand(64, 4096)]
    planner = _planner(lambda a: a * 2 + 1, ins)
    planned = planner.untuned("greedy", True, lambda: ins)
    assert planned.choice is None
    assert all("configs timed alone" not in s.reason for s in planned.plan.steps)


@pytest.mark.gpu
def test_gpu_configs_are_timed_on_the_device_and_the_plan_matches_eager():
    """On a GPU the GroupNorm statistics of 16384 x 8 groups of 256 elements (tens of us a
    kernel) are timed at every quick config the kind offers (a time for each, none failing);
    the untuned plan gives eager's values, whichever config it kept."""
    from autofuse.measure import config_timer

    x = torch.randn(16384, 32, 8, 8, device="cuda")
    w, b = torch.rand(32, device="cuda") + 0.5, torch.randn(32, device="cuda")
    planner = _planner(group_norm, [x, w, b])
    base = planner.space.untuned()
    plan = planner.build(base.groups, label="greedy")
    timer, seen = config_timer(), []

    def spy(graph, info, config):
        seen.append((config, timer(graph, info, config)))
        return seen[-1][1]

    timed_configs(plan, base.groups, spy)
    assert len(seen) >= 2 and all(s is not None and s > 0 for _, s in seen), seen
    run = autofuse.optimize(group_norm, [x, w, b])
    torch.testing.assert_close(run(x, w, b), group_norm(x, w, b), rtol=1e-4, atol=1e-4)


def test_a_failing_config_timer_leaves_the_default_configs(on_gpu):
    ins = [torch.rand(64, 4096)]
    planner = _planner(lambda a: a * 2 + 1, ins)

    def broken(graph, info, config):
        raise RuntimeError("no device")

    planned = planner.untuned("greedy", True, lambda: ins, time_config=broken)
    assert planned.choice is None and "configs timed alone" not in str(planned.plan.steps)


def test_a_multi_phase_long_row_is_also_timed_whole_and_runs_as_eager(on_gpu, monkeypatch):
    """A variance's row past 4096 elements is walked once per phase by the default's loops
    (its prologue computed each time); the kind also offers the row held whole by one program,
    and that kernel, picked, gives eager's values."""
    ins = [torch.randn(4, 6000) * 3 + 1]

    def var_tanh(x):
        return torch.var_mean(torch.tanh(x), dim=-1)

    planner = _planner(var_tanh, ins)
    base = planner.space.untuned()
    (info,) = [planner.space.check(g) for g in base.groups]
    offered = quick_configs(info, planner.graph)
    assert offered[0].RBLOCK == 4096 and KernelConfig(1, 8192, 16) in offered, offered
    plan = planner.build(base.groups, label="greedy")
    whole = lambda g, i, c: 1e-5 if c.RBLOCK >= i.rnumel else 1e-4  # noqa: E731
    choices, _ = timed_configs(plan, base.groups, whole)
    assert choices == [KernelConfig(1, 8192, 16)]
    monkeypatch.undo()  # run the chosen kernel in the interpreter
    measured = planner.build(base.groups, choices, label="greedy")
    for got, want in zip(execute(measured, ins), var_tanh(*ins)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_two_axis_tile_is_timed_at_half_and_twice_its_rows(on_gpu, monkeypatch):
    """The epilogue of a channels-last convolution writing eager's strides turns the layout in
    a two-axis tile; its kind offers the default's rows halved and doubled (each block holding
    whole column runs), and the plan with the one picked gives eager's values."""
    from autofuse.settings import reload_settings

    monkeypatch.setenv("AUTOFUSE_CONV_LAYOUT", "channels_last")
    reload_settings()
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 32, 3, padding=1)
    ins = [torch.randn(4, 3, 16, 16), conv.weight.detach(), conv.bias.detach()]

    def f(x, w, b):
        return torch.tanh(F.conv2d(x, w, b, padding=1))

    planner = _planner(f, ins)
    base = planner.space.untuned()
    infos = [planner.space.check(g) for g in base.groups]
    (tile,) = [i for i in infos if i.kind == "pointwise" and i.reduces]
    offered = quick_configs(tile, planner.graph)
    default = offered[0]
    assert {c.XBLOCK for c in offered[1:]} == {default.XBLOCK // 2, default.XBLOCK * 2}
    assert all(c.RBLOCK == default.RBLOCK >= tile.rnumel for c in offered)
    plan = planner.build(base.groups, label="greedy")
    doubled = lambda g, i, c: 1e-5 if c.XBLOCK == 2 * default.XBLOCK else 1e-4  # noqa: E731
    choices, _ = timed_configs(plan, base.groups, doubled)
    assert any(c is not None and c.XBLOCK == 2 * default.XBLOCK for c in choices)
    monkeypatch.undo()  # the interpreter again; the layout rule stays until the plan has run
    monkeypatch.setenv("AUTOFUSE_CONV_LAYOUT", "channels_last")
    reload_settings()
    measured = planner.build(base.groups, choices, label="greedy")
    with torch.no_grad():
        (got,) = execute(measured, ins)
    torch.testing.assert_close(got, f(*ins), rtol=1e-4, atol=1e-4)
    monkeypatch.undo()
    reload_settings()


def test_a_whole_multi_phase_outer_block_doubled_is_timed_at_16_warps(on_gpu, split_on):
    """BatchNorm's statistics over a mish of a channels-last convolution (L2_52's form): a
    split's outer reduction held whole, walked in two phases; beside its outputs halved and
    doubled, the doubled block is offered at 16 warps, and the plan with it gives eager's
    values."""
    from autofuse.settings import reload_settings

    torch.manual_seed(0)
    ins = [torch.randn(4, 3, 18, 18), torch.randn(16, 3, 3, 3), torch.randn(16)]

    def f(x, w, b):
        y = F.conv2d(x, w, b)
        y = torch.tanh(F.softplus(y)) * y
        return F.batch_norm(y, None, None, training=True)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOFUSE_CONV_LAYOUT", "channels_last")
        reload_settings()
        planner = _planner(f, ins)
        base = planner.space.untuned()
        infos = [planner.space.check(g) for g in base.groups]
        wide = [
            (i, c)
            for i in infos
            if i.kind == "reduction"
            for c in quick_configs(i, planner.graph)
            if c.num_warps == 16
        ]
        assert wide, [quick_configs(i, planner.graph) for i in infos if i.kind == "reduction"]
        for info, config in wide:
            default = quick_configs(info, planner.graph)[0]
            assert config.XBLOCK == 2 * default.XBLOCK and config.RBLOCK >= info.rnumel
        plan = planner.build(base.groups, label="greedy")
        sixteen = lambda g, i, c: 1e-5 if c.num_warps == 16 else 1e-4  # noqa: E731
        choices, _ = timed_configs(plan, base.groups, sixteen)
        assert any(c is not None and c.num_warps == 16 for c in choices)
        measured = planner.build(base.groups, choices, label="greedy")
        with torch.no_grad():
            got = execute(measured, ins)
        torch.testing.assert_close(got[0], f(*ins), rtol=1e-4, atol=1e-4)
    reload_settings()
