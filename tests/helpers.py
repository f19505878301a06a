"""Shared checks: run a plan through the interpreter and compare it with eager."""

import random
from contextlib import contextmanager

import pytest
import torch

import autofuse
from autofuse.capture.trace import capture
from autofuse.kernels import config_space, default_config
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import build_plan, execute

TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}
FRONT_ENDS = ("optimize", "compile")


# The bounds-checked build (AUTOFUSE_CHECK_BOUNDS=1) loads every kernel through its guarded
# variant and launches it by Triton's own launcher: no lean launch, no binary stored in a
# cache entry. Tests of those paths do not apply there.
plain_build = pytest.mark.skipif(
    autofuse.settings.settings().check_bounds,
    reason="the bounds-checked build has no lean launch and stores no binaries",
)


def through(front: str, fn, args):
    """``fn`` optimized for ``args`` (``optimize``) or compiled with the backend (``compile``)."""
    if front == "optimize":
        return autofuse.optimize(fn, args)
    torch._dynamo.reset()
    return torch.compile(fn, backend="autofuse", dynamic=False)


def dtype_front_grid(dtypes, lead=(), fronts=FRONT_ENDS) -> list:
    """Parameters ``(*lead value, dtype, front)`` over the whole grid: by default each dtype runs
    through one front end, the front end turning with the dtype and with the lead value, so
    every dtype, every front end and every lead value runs; the rest under ``-m exhaustive``."""
    params = []
    for k, v in enumerate(lead or (None,)):
        for i, d in enumerate(dtypes):
            for j, f in enumerate(fronts):
                values = (v, d, f) if lead else (d, f)
                marks = () if (i + k) % len(fronts) == j else pytest.mark.exhaustive
                params.append(pytest.param(*values, marks=marks, id="-".join(map(str, values))))
    return params


def upcast(args):
    return [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]


def assert_close(out, ref, dtype, what=""):
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    if not ref.is_floating_point():
        assert torch.equal(out, ref), f"{what}: integer/bool output differs"
        return
    o, r = out.double(), ref.double()
    assert torch.equal(torch.isnan(o), torch.isnan(r)), f"{what}: NaN positions differ"
    finite = ~torch.isnan(r)
    scale = r[finite].abs().max().item() if finite.any() else 1.0
    err = (o[finite] - r[finite]).abs().max().item() if finite.any() else 0.0
    tol = TOL.get(dtype, 1e-4) * max(scale, 1.0)
    if err > tol:
        i = int((o - r).abs().nan_to_num(0).flatten().argmax())
        got, want = o.flatten()[i].item(), r.flatten()[i].item()
        raise AssertionError(
            f"{what}: max abs err {err:.3g} > {tol:.3g} (scale {scale:.3g}): "
            f"element {i} is {got!r}, eager gives {want!r}"
        )


def backend_training_matches(net, x, dtype, what="", strides=False) -> int:
    """``torch.compile(net, backend="autofuse")`` forward and backward against eager: the
    output's values (and, with ``strides``, its strides) and every gradient (of ``x`` and the
    parameters); returns ``dynamo.compiled_count()`` from before its graphs were compiled."""
    from autofuse.frontend import dynamo

    x = x.detach().requires_grad_(True)
    want = net(x)
    want.float().square().sum().backward()
    want_grads = [x.grad.clone()] + [p.grad.clone() for p in net.parameters()]
    x.grad = None
    net.zero_grad()
    before = dynamo.compiled_count()
    got = torch.compile(net, backend="autofuse")(x)
    got.float().square().sum().backward()
    assert_close(got, want, dtype, f"{what} backend forward")
    if strides:
        assert got.stride() == want.stride()
    got_grads = [x.grad] + [p.grad for p in net.parameters()]
    for k, (a, b) in enumerate(zip(got_grads, want_grads, strict=True)):
        assert_close(a, b, dtype, f"{what} grad {k}")
    return before


def reference(fn, args, dtype):
    ref = fn(*upcast(args)) if dtype != torch.float32 else fn(*args)
    ref = ref if isinstance(ref, tuple) else (ref,)
    return [r.to(dtype) if r.is_floating_point() and dtype != torch.float32 else r for r in ref]


def check_partitions(
    fn, args, dtype=torch.float32, configs_per_group=2, seed=0, max_enumerate=300, sample=24
):
    """Every legal partition (or a seeded sample), each with sampled configs, equals eager."""
    graph = capture(fn, args).graph
    space = Partitioner(graph)
    parts = space.partitions(max_enumerate=max_enumerate, sample=sample, seed=seed)
    refs = reference(fn, args, dtype)
    rng = random.Random(seed)
    flat = [a for a in args if isinstance(a, torch.Tensor)]
    checked = 0
    for p in parts:
        infos = [space.check(g) for g in p.groups]
        for trial in range(configs_per_group):
            cfgs = [
                default_config(i, graph) if trial == 0 else rng.choice(config_space(i, graph))
                for i in infos
            ]
            plan = build_plan(graph, p.groups, cfgs)
            outs = execute(plan, flat)
            assert len(outs) == len(refs), (
                f"{fn.__name__} partition {p.key}: {len(outs)} outputs, eager gives {len(refs)}"
            )
            for k, (o, r) in enumerate(zip(outs, refs)):
                what = f"{fn.__name__} partition {p.key} out {k} ({graph[graph.base_of(graph.outputs[k])].op})"
                assert_close(o, r, dtype, what)
            checked += 1
    # a check that compared nothing, or never a fused kernel, cannot fail: it is a defect
    assert checked > 0, f"{fn.__name__}: no partition was checked"
    assert any(len(g) > 1 for p in parts for g in p.groups) or len(graph.compute_nodes()) <= 1, (
        f"{fn.__name__}: no checked partition fuses anything"
    )
    return len(parts), checked


# a reduction config's classes: the row in one block (persistent; loads hoisted or not) or a
# loop over it (two passes or one stage)
ROW_CLASSES = {("persistent", False), ("persistent", True), ("looped", False), ("looped", True)}


def row_class(row: int):
    """The class of a reduction config over rows of ``row`` elements (see ``ROW_CLASSES``)."""
    return lambda c: ("persistent", c.HOIST) if c.RBLOCK >= row else ("looped", c.ONE_STAGE)


def check_config_classes(fn, args, dtype, label) -> set:
    """The greedy plan, one kernel, under the first config of each class of its config space
    (``label(config)``: e.g. persistent or looped) equals eager; returns the classes checked, for
    the caller to require the ones it is about (a class the space lost is then a failure)."""
    graph = capture(fn, args).graph
    space = Partitioner(graph)
    groups = space.greedy().groups
    assert len(groups) == 1, f"{fn.__name__}: greedy plan of {len(groups)} kernels"
    first = {}
    for cfg in config_space(space.check(groups[0]), graph):
        first.setdefault(label(cfg), cfg)
    refs = reference(fn, args, dtype)
    flat = [a for a in args if isinstance(a, torch.Tensor)]
    for cls, cfg in first.items():
        outs = execute(build_plan(graph, groups, [cfg]), flat)
        assert len(outs) == len(refs), f"{fn.__name__} {cfg}: {len(outs)} outputs"
        for k, (o, r) in enumerate(zip(outs, refs)):
            assert_close(o, r, dtype, f"{fn.__name__} {cls} {cfg} out {k}")
    return set(first)


def fresh_runtime(monkeypatch):
    """As a new process would: no kernel imported, launched or marked broken yet."""
    from autofuse.kernels.common import loader
    from autofuse.plan import launcher, runtime

    monkeypatch.setattr(loader, "_LOADED", {})
    monkeypatch.setattr(launcher, "_LAUNCHERS", {})
    monkeypatch.setattr(runtime, "_BROKEN", {})


@contextmanager
def settings_env(monkeypatch, **env: str):
    """The settings read again with the ``AUTOFUSE_*`` variables ``env`` set; on leaving, the
    variables undone and the settings read again."""
    from autofuse import settings as af_settings

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    af_settings.reload_settings()
    try:
        yield
    finally:
        for name in env:
            monkeypatch.delenv(name, raising=False)
        af_settings.reload_settings()
