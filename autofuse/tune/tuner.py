"""The search: pick a partition and its launch configs jointly, by measurement.

A trial chooses a fuse / don't-fuse value for every edge of the partitioner's space, then one
launch config for each group that exists under those choices (a conditional parameter). Its cost
is the sum of its kernels' measured times plus its eager ops' times. Each (group, config) is
measured once per study (``measure.Memo``); a config that fails to compile, runs out of
resources or gives wrong values scores as failed and the search goes on. The greedy plan, the
greedy plan with its matmuls run by torch (cuBLAS + fused epilogue kernels), its option switches
and the unfused plan are enqueued first, and the best few plans are re-timed end to end before
the winner is chosen, so the result is never worse than the greedy or the unfused plan.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

import search
from autofuse import logs
from autofuse.capture.trace import Captured
from autofuse.interpreter import interpreting
from autofuse.kernels import (
    INLINE_OPS,
    GroupInfo,
    KernelConfig,
    config_label,
    config_space,
    default_config,
    fusible,
)
from autofuse.measure import (
    Candidate,
    CostModel,
    Measurement,
    Memo,
    describe_error,
    group_inputs,
    node_values,
    timer,
    verify_candidate,
)
from autofuse.partition.partitioner import Partition, Partitioner
from autofuse.plan.code_log import output_code
from autofuse.plan.graph_choice import beats
from autofuse.plan.planner import assemble
from autofuse.plan.runtime import Plan, eager_group, execute
from autofuse.settings import cache_home
from autofuse.tune.climb import neighbours, option_switches, polish_plan  # noqa: F401
from autofuse.tune.prune import ModelPrune
from autofuse.tune.reasons import measured_reasons
from autofuse.tune.record import TuneResult
from autofuse.tune.study import OnTrial, default_measurer, group_param, isolated
from autofuse.tune.study import study_name as _study_name


@dataclass(frozen=True)
class TrialPlan:
    """The plan one trial proposed: its partition, the groups' configs and their summed cost
    (the untuned front ends' record of which plan ran is ``plan.plan_choice.PlanChoice``)."""

    partition: Partition
    configs: tuple[KernelConfig, ...]
    value: float  # sum of per-kernel times (seconds)
    source: str  # "measured" | "modeled"


class Objective:
    """The trial function: decisions -> partition -> configs -> measured cost."""

    def __init__(self, graph, space: Partitioner, measurer, eager_cost, example_values=None):
        self.graph, self.space, self.measurer = graph, space, measurer
        self.eager_cost = eager_cost
        self.choices: dict[int, TrialPlan] = {}
        self._eager_memo: dict[int, float] = {}
        # every node's eager value on the user's example inputs (None: no such check); each
        # candidate the measurer accepts is verified on them too, once per (group, config)
        self.example_values = example_values
        self._example_checks: dict[tuple, str | None] = {}
        # where the examples live: a group that loads nothing (a mask from iota) runs there too
        tensors = [v for v in (example_values or {}).values() if isinstance(v, torch.Tensor)]
        self._example_device = tensors[0].device if tensors else torch.device("cpu")
        self.prune: ModelPrune | None = None  # set by start_search (tune/prune.py)

    def configs_for(self, info: GroupInfo) -> list[Any]:
        space = config_space(info, self.graph)
        d = default_config(info, self.graph)
        return space if d in space else [d, *space]

    def __call__(self, trial: Any) -> float:
        names = self.space.edge_names.values()
        fuse = {n: trial.categorical(n, [True, False]) for n in names}
        partition = self.space.from_decisions(fuse)
        picked = [self._pick_config(trial, g) for g in partition.groups]
        if self.prune is not None and not isinstance(trial, _Replay):  # replays: never
            why = self.prune.check(partition.key, [p for p in picked if p[0] is not None])
            if why:
                raise search.TrialPruned(why)
        total, configs = 0.0, []
        source = "measured"
        for group, (info, cfg) in zip(partition.groups, picked):
            if info is None:  # a lone matmul: torch.mm / cuBLAS
                total += search.check_time(self.eager_node_cost(next(iter(group))), "torch.mm")
                configs.append(None)
                continue
            label = config_label(cfg)
            m = self.measure(info, cfg)
            if not m.ok:
                raise search.TrialFailed(f"group {sorted(group)} with {label}: {m.failure}")
            total += m.seconds
            source = m.source
            configs.append(cfg)
        total += search.check_time(self.eager_cost, "the eager ops' time")
        trial.set_note("partition", repr(partition.key))
        trial.set_note("source", source)
        self.choices[trial.number] = TrialPlan(partition, tuple(configs), total, source)
        return total

    def _pick_config(self, trial: Any, group) -> tuple[GroupInfo | None, Any]:
        """The group's analysis and the config the trial picks for it; (None, None) for a
        lone matmul run by torch."""
        if eager_group(self.graph, group):
            return None, None
        info = self.space.check(group)
        assert isinstance(info, GroupInfo)
        options = self.configs_for(info)
        labels = [config_label(c) for c in options]
        label = trial.categorical(group_param(self.graph, group), labels)
        if label not in labels:  # a resumed study's enqueued point from another code version
            raise search.TrialFailed(
                f"group {sorted(group)}: config {label!r} is not in this group's space"
            )
        return info, options[labels.index(label)]

    def measure(self, info: GroupInfo, cfg: Any) -> Measurement:
        candidate = Candidate(self.graph, info, cfg)
        try:
            m = self.measurer.measure(candidate)
        except Exception as e:  # noqa: BLE001 - a measurer's own bug fails that config only
            return Measurement.failed(f"measurer raised {describe_error(e)}", "measured")
        if m.ok:  # a negative, NaN or infinite time fails that config with its reason
            try:
                search.check_time(m.seconds, f"the measured time of {config_label(cfg)}")
            except search.TrialFailed as bad:
                return Measurement.failed(bad.reason, m.source)
        if m.ok and self.example_values is not None:
            why = self.check_examples(candidate)
            if why:
                return Measurement.failed(f"on the example inputs: {why}", m.source)
        return m

    def check_examples(self, candidate: Candidate) -> str | None:
        """Verify ``candidate`` on the values its loads take for the user's example inputs
        (real masks and value ranges, which N(0, 1) draws miss): None or why it fails. Per
        (group, config) of this graph, not per structural key: the same subgraph elsewhere
        (another layer) loads other values."""
        key = (candidate.info.nodes, candidate.key)
        if key not in self._example_checks:
            ins = group_inputs(self.graph, candidate.info, self.example_values)
            device = ins[0].device if ins else self._example_device
            self._example_checks[key] = verify_candidate(candidate, device, inputs=ins)
        return self._example_checks[key]

    def default_groups(self, partition: Partition) -> list[tuple[GroupInfo | None, Any]]:
        """Each group of the partition with its default config, as ``_pick_config`` gives it:
        (None, None) for a lone matmul run by torch."""
        out: list[tuple[GroupInfo | None, Any]] = []
        for g in partition.groups:
            info = None if eager_group(self.graph, g) else self.space.check(g)
            out.append((info, None if info is None else default_config(info, self.graph)))
        return out

    def params_for(self, partition: Partition, configs: Sequence[Any] | None = None):
        """The trial parameters of ``partition`` with ``configs`` (one per group, None for a
        matmul run by torch), by default the groups' default configs."""
        params: dict[str, Any] = dict(self.space.decisions_of(partition))
        picked = configs if configs else [cfg for _, cfg in self.default_groups(partition)]
        for g, cfg in zip(partition.groups, picked):
            if cfg is not None:
                params[group_param(self.graph, g)] = config_label(cfg)
        return params

    def flag_variants(self, partition: Partition) -> list[list[Any]]:
        """The partition's default configs with one option of one kernel switched (TMA loads,
        a persistent grid, skipped tiles, pipelined epilogue loads, hoisted loads), where such
        a config is in the group's space: options whose worth depends on the machine are
        measured, not guessed."""
        groups = self.default_groups(partition)
        base = [cfg for _, cfg in groups]
        out = []
        for k, (info, cfg) in enumerate(groups):
            if cfg is None or not dataclasses.is_dataclass(cfg):
                continue
            for other in option_switches(cfg, self.configs_for(info)):
                out.append(base[:k] + [other] + base[k + 1 :])
        return out

    def eager_node_cost(self, i: int) -> float:
        if i not in self._eager_memo:
            self._eager_memo[i] = _node_cost(self.graph, i, self.measurer)
        return self._eager_memo[i]


def _node_cost(graph, i: int, measurer) -> float:
    """Time of one eager op: measured where the measurer can (GPU), else modeled."""
    fn = getattr(measurer, "eager_time", None) or getattr(
        getattr(measurer, "inner", None), "eager_time", None
    )
    if fn is not None:
        return fn(graph, i)
    return CostModel().eager_time(graph, i)  # a timer that cannot run eager ops: model them


def _eager_cost(graph, measurer) -> float:
    """The ops that run in eager in every partition (unsupported ops)."""
    return sum(
        _node_cost(graph, i, measurer)
        for i in graph.compute_nodes()
        if not fusible(graph, i) and graph[i].op not in (*INLINE_OPS, "getitem")
    )


@dataclass
class Search:
    """One worker's part of a study: the objective, the study and what the result needs."""

    objective: Objective
    study: search.Study
    memo: Memo
    greedy: Partition
    unfused: Partition
    library: Partition | None
    owned: Any = None  # a worker process this search started (closed at the end)
    flat: Sequence[Any] | None = None  # the graph's flat example inputs, when the caller gave them
    started: float = field(default_factory=time.perf_counter)

    def close(self) -> None:
        if self.owned is not None:
            self.owned.close()


def start_search(
    captured: Captured,
    example_inputs: Sequence[Any],
    space: Partitioner,
    *,
    cache_dir: str | os.PathLike | None = None,
    storage: Any = None,
    sampler: Any = "tpe",
    verify: bool = True,
    isolate: bool | float = False,
    measurer: Any = None,
    study_name: str | None = None,
    example_flat: Sequence[torch.Tensor] | None = None,
) -> Search:
    """Open (or resume) the study of this graph and enqueue the starting points. ``storage``
    and ``sampler`` may be names / URLs or Optuna objects (passed through)."""
    t0 = time.perf_counter()
    graph = captured.graph
    inner = measurer.inner if isinstance(measurer, Memo) else measurer
    owned = None
    if inner is None:
        inner = default_measurer(verify, isolate)
        owned = inner if isolate else None
    elif isolate:
        inner = owned = isolated(inner, isolate)
    memo = measurer if isinstance(measurer, Memo) and inner is measurer.inner else Memo(inner)
    eager = _eager_cost(graph, memo.inner)
    # the example-input check goes with verification: the default measurers' (``verify``), or
    # a given measurer's own (its ``verify`` field); fake timers in tests have neither
    checks = verify and (measurer is None or getattr(memo.inner, "verify", False) is True)
    values = _example_values(captured, example_inputs, example_flat) if checks else None
    objective = Objective(graph, space, memo, eager, values)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu-model"
    name = study_name or _study_name(captured.source_name, graph.key, device)
    study = search.Study.open(
        name, storage=storage, cache_dir=cache_home(cache_dir), sampler=sampler
    )
    # the starting points, most promising first (a small budget may end before the last):
    # greedy, cuBLAS + fused epilogues, what runs untuned, each option switched once on the
    # greedy plan, and last the unfused plan (a baseline, rarely the winner, costly to build)
    greedy, unfused = space.greedy(), space.unfused()
    study.enqueue(objective.params_for(greedy))
    library = space.library_gemms(greedy)
    if library is not None:
        study.enqueue(objective.params_for(library))
    untuned = space.untuned()
    if untuned not in (greedy, library):
        study.enqueue(objective.params_for(untuned))
    for configs in objective.flag_variants(greedy):
        study.enqueue(objective.params_for(greedy, configs))
    study.enqueue(objective.params_for(unfused))
    objective.prune = ModelPrune(graph)
    fixed = (p.key for p in (greedy, unfused, library, untuned) if p is not None)
    kernels = [p for p in objective.default_groups(greedy) if p[0] is not None]
    objective.prune.start(fixed, kernels)
    return Search(
        objective, study, memo, greedy, unfused, library, owned, flat=example_flat, started=t0
    )


def run_search(
    run: Search,
    trials: int | None,
    time_budget: float | None,
    progress: bool = True,
    wait_s: float = 300.0,
    desc: str = "autofuse tuning",
) -> bool:
    """Run this worker's trials of the shared budget, then wait (up to ``wait_s``) for other
    workers' running trials. False when some were still running at the time-out."""
    budget = search.Budget(trials=trials, seconds=time_budget)
    on_trial = OnTrial(run.study, trials, progress, desc)
    try:
        run.study.optimize(run.objective, budget, on_trial=on_trial)
    finally:
        on_trial.close()
    return run.study.wait_for_running(timeout_s=wait_s)


def tune(
    captured: Captured,
    example_inputs: Sequence[Any],
    space: Partitioner,
    *,
    trials: int | None = None,
    time_budget: float | None = None,
    top_k: int = 3,
    progress: bool = True,
    polish: int = 16,
    wait_s: float = 300.0,
    desc: str = "autofuse tuning",
    **options: Any,
) -> TuneResult:
    """Search partitions x configs; return the best plan, re-timed end to end on the GPU.

    ``options`` are :func:`start_search`'s (``cache_dir``, ``storage``, ``sampler``,
    ``verify``, ``isolate``, ``measurer``, ``study_name``, ``example_flat``). Where
    candidates are verified (``verify`` with the default measurer, or a measurer whose
    ``verify`` is True), each is also checked on the example inputs (``example_flat``: the
    graph's flat input tensors, module parameters included; by default the tensors of
    ``example_inputs``) and rejected if it fails there. Workers sharing the study share
    ``trials``; after its own trials a worker waits ``wait_s`` for the others' running ones."""
    run = start_search(captured, example_inputs, space, **options)
    try:
        settled = run_search(run, trials, time_budget, progress, wait_s, desc)
        return _finish(run, captured, example_inputs, top_k, polish, time_budget, settled)
    finally:
        run.close()


def _finish(run: Search, captured, example_inputs, top_k, polish, time_budget, settled):
    objective, study, graph = run.objective, run.study, captured.graph
    greedy, unfused, library = run.greedy, run.unfused, run.library
    records = [r for r in study.trials if r.reason != search.BUDGET_SPENT_REASON]
    done = [r for r in records if r.state == search.TrialState.COMPLETE]
    if not done:
        raise RuntimeError(_nothing_done(study, records, settled))
    ranked = _distinct_best(done, objective, top_k)
    if polish:
        # the polish may take as long again as the search's time budget
        deadline = run.started + 2 * time_budget if time_budget else None
        polished = polish_plan(objective, ranked[0][1], polish, deadline)
        if polished is not None:
            ranked.insert(0, (-3, polished))
    ranked += _baselines(objective, greedy, unfused, ranked, library)  # re-timed: never worse
    with logs.no_output_code():  # candidates print nothing; the winner does, below
        plans = [(c, assemble(graph, c.partition.groups, c.configs, label=_label(n)))
                 for n, c in ranked]  # fmt: skip
    g = _replay(objective, objective.params_for(greedy))
    keys = [(c.partition.key, c.configs) for c, _ in plans]
    incumbent = keys.index((g.partition.key, g.configs)) if g is not None else None
    flat = _flat_examples(captured, example_inputs, run.flat)
    best_choice, best_plan, e2e = _pick(plans, flat, incumbent)
    times = _kernel_times(best_plan, graph, run.memo)
    best = dataclasses.replace(best_plan, label="tuned")
    best_plan = measured_reasons(best, times, objective.eager_node_cost)
    output_code(best_plan)
    counts = study.counts
    result = TuneResult(
        plan=best_plan,
        value=best_choice.value,
        source=best_choice.source,
        greedy_value=_value_of(objective, greedy, done),
        unfused_value=_value_of(objective, unfused, done),
        eager_value=None,
        trials=counts.total,
        failed=counts.failed,
        pruned=counts.pruned,
        seconds=time.perf_counter() - run.started,
        kernel_times=times,
        study_name=study.name,
        end_to_end=e2e,
        library_value=_value_of(objective, library, done) if library is not None else None,
    )
    logs.log.info(result.summary())
    return result


def _nothing_done(study: search.Study, records, settled: bool) -> str:
    """Why no trial is COMPLETE: every trial failed (their reasons), or other workers took the
    shared budget and their trials are still running (not a failure of the search)."""
    counts = study.counts
    if not settled or counts.running:
        return (
            f"study {study.name}: no finished trial yet: other workers took the shared budget "
            f"and {counts.running} of their trials are still running; run again (the study "
            "resumes) or wait for them"
        )
    if not records:
        return f"study {study.name}: no trial ran (a budget of 0 trials or 0 seconds?)"
    reasons = "; ".join(sorted({r.reason or "?" for r in records})[:5])
    return f"no candidate plan passed: every trial failed ({reasons})"


def _flat_examples(captured: Captured, example_inputs, example_flat) -> list:
    """The graph's flat input tensors: ``example_flat`` (with a module's parameters) when
    given, else the tensors of ``example_inputs``."""
    import torch.utils._pytree as pytree

    if example_flat is not None:
        return list(example_flat)
    leaves = pytree.tree_leaves(tuple(example_inputs))
    return [x for x, k in zip(leaves, captured.leaf_kinds) if k == "tensor"]


def _example_values(captured: Captured, example_inputs, example_flat) -> dict | None:
    """Every node's eager value on the example inputs, where kernels can run on their device
    (CUDA, or the CPU under Triton's interpreter); else None (no example check)."""
    flat = _flat_examples(captured, example_inputs, example_flat)
    graph = captured.graph
    if len(flat) != len(graph.inputs) or not all(isinstance(x, torch.Tensor) for x in flat):
        return None  # a module's parameters not passed: the graph cannot run
    device = flat[0].device if flat else torch.device("cpu")
    if device.type != "cuda" and not (device.type == "cpu" and interpreting()):
        return None
    with torch.no_grad():
        return node_values(graph, list(flat))


def _distinct_best(done, objective: Objective, k: int) -> list[tuple[int, TrialPlan]]:
    seen, out = set(), []
    for r in sorted(done, key=lambda r: r.value):
        choice = objective.choices.get(r.number)
        if choice is None:  # a trial of an earlier process (resumed study): rebuild it
            choice = _replay(objective, r.params)
        if choice is None:
            continue
        key = (choice.partition.key, choice.configs)
        if key in seen:
            continue
        seen.add(key)
        out.append((r.number, choice))
        if len(out) == k:
            break
    return out


class _Replay:
    def __init__(self, params: dict[str, Any], number: int = -1) -> None:
        self.params, self.number = params, number

    def categorical(self, name, choices):
        return self.params[name] if name in self.params else choices[0]

    def set_note(self, key, value) -> None:
        pass


def _replay(objective: Objective, params: dict[str, Any]) -> TrialPlan | None:
    try:
        number = -1 - len(objective.choices)
        objective(_Replay(params, number))
        return objective.choices.pop(number)
    except search.TrialFailed:
        return None


_LABELS = {-1: "greedy", -2: "unfused", -3: "polished", -4: "cuBLAS + fused epilogues"}


def _label(n: int) -> str:
    """A re-timed plan's name: its trial number, or which baseline it is."""
    return _LABELS.get(n, f"trial {n}")


def _baselines(
    objective: Objective, greedy, unfused, ranked, library=None
) -> list[tuple[int, TrialPlan]]:
    """The greedy, unfused and cuBLAS + fused epilogue (``library``) plans with default
    configs, unless already among ``ranked``: each is re-timed end to end with the best."""
    have = {(c.partition.key, c.configs) for _, c in ranked}
    out = []
    for tag, p in ((-1, greedy), (-2, unfused), (-4, library)):
        if p is None:
            continue
        choice = _replay(objective, objective.params_for(p))
        if choice is not None and (choice.partition.key, choice.configs) not in have:
            out.append((tag, choice))
    return out


def _value_of(objective: Objective, partition: Partition, done) -> float | None:
    """The best recorded value of a trial with ``partition`` (other workers' trials too)."""
    best = None
    for r in done:
        c = objective.choices.get(r.number)
        key = c.partition.key if c is not None else objective.space.from_decisions(r.params).key
        if key == partition.key:
            best = r.value if best is None else min(best, r.value)
    return best


class _PlanCall:
    """A plan called on the graph's flat inputs (a module's parameters included)."""

    def __init__(self, plan: Plan) -> None:
        self.plan, self.label = plan, plan.label

    def __call__(self, *flat: torch.Tensor) -> list[torch.Tensor]:
        return execute(self.plan, flat)


def _pick(plans, flat_inputs: Sequence[Any], incumbent: int | None = None):
    """Re-time the best few plans end to end on the GPU (with the cost model keep the order),
    each on the graph's flat inputs. The ``incumbent`` (the greedy plan) stays unless another
    :func:`~autofuse.plan.graph_choice.beats` it, the spread of its own rounds counted as noise."""
    e2e: dict[str, float] = {}
    if not torch.cuda.is_available() or len(plans) == 1:
        c, p = plans[0]
        return c, p, e2e

    rounds: dict[str, list[float]] = {}
    for r in range(3):  # alternate the order: none is always timed hottest
        for _choice, plan in plans if r % 2 == 0 else plans[::-1]:
            rounds.setdefault(plan.label, []).append(
                timer.time_callable(_PlanCall(plan), tuple(flat_inputs))
            )
    e2e = {label: min(ts) for label, ts in rounds.items()}
    k = min(range(len(plans)), key=lambda i: e2e[plans[i][1].label])
    if incumbent is not None and k != incumbent:
        if not beats(e2e[plans[k][1].label], rounds[plans[incumbent][1].label]):
            k = incumbent
    choice, plan = plans[k]
    return choice, plan, e2e


def _kernel_times(plan: Plan, graph, memo) -> dict[str, tuple[float, str]]:
    out = {}
    for k in plan.kernels:
        m = memo.measure(Candidate(graph, k.info, k.config))
        if m.ok:
            out[k.name] = (m.seconds, m.source)
    return out
