"""The one planner: how autofuse arrives at a plan for a graph, whoever asks (``optimize``,
``explain``, the torch.compile backend, the overnight runner).

- the untuned plan (:meth:`Planner.untuned`): every legal fusion at default configs, GEMMs
  with an epilogue in cuBLAS (``Partitioner.untuned``); where that still fuses a matmul
  (attention forward or backward, a row GEMM) and the inputs are on CUDA, the plan with every
  matmul in cuBLAS is built too and the two are timed end to end (``plan_choice.py``): which
  one is faster depends on the shapes. Then, where providers offer calls for ops autofuse does
  not generate (SDPA's backends), the plan with each call in place of the rule's (the backend
  torch picked) is timed against it. Off CUDA, or under the interpreter, the fused plan and the
  rule's calls are kept and nothing is timed. Each step says why it is what it is (the rule,
  or the times);
- the tuned plan (:meth:`Planner.tuned`): the cache's plan for this graph and inputs where it
  has one, else the search's (its end-to-end pick, its library calls on offer then timed as
  above), saved to the cache and indexed by the call.
  The cache and the search are handed in behind two small interfaces (:class:`PlanStore`,
  :class:`Searcher`): ``plan/`` imports neither;
- the plans ``explain`` compares (:meth:`Planner.explained`) and the greedy plan a report
  times (:meth:`Planner.greedy`);
- a cached plan as it runs this graph (:meth:`Planner.cached`, :meth:`Planner.first_fit`:
  an entry of this graph as it is, one cached at another size of its shape bucket, or a
  bucket's partition in the backend, rebuilt for this graph's sizes): the tuned plan's cache
  hit and ``autofuse.load``'s entries alike;
- whether a plan replays a CUDA graph (:meth:`Planner.replay`, ``cuda_graph="auto"``).

The graph's :class:`Partitioner` (its legal fusion decisions) is built here, once per planner,
when a plan is first made (a cache hit of this graph makes none).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, is_dataclass, replace
from functools import cached_property
from typing import Any, Protocol

import torch

from autofuse import logs
from autofuse.interpreter import interpreting
from autofuse.ir.conv_fold import fold_batchnorm
from autofuse.ir.conv_layout import channels_last_differs
from autofuse.ir.graph import Graph
from autofuse.ir.pipeline import relaid
from autofuse.partition import Partitioner
from autofuse.plan.buckets import partition_of, structure_key
from autofuse.plan.build import build_plan
from autofuse.plan.config_choice import ConfigTimer, timed_configs
from autofuse.plan.graph_choice import GraphChoice, choose_replay, cuda_inputs
from autofuse.plan.graphs import GraphReplay
from autofuse.plan.library_fusion import agreeing, choose_fused, fusions, with_fused_variants
from autofuse.plan.plan_choice import (
    PlanChoice,
    choose_plan,
    library_variants,
    merged,
    with_calls,
)
from autofuse.plan.runtime import execute
from autofuse.plan.steps import Plan, annotated
from autofuse.settings import settings


class PlanStore(Protocol):
    """The plan cache, as the planner uses it (``tune/entry.py``'s ``CacheStore``)."""

    def lookup(self, captured: Any, example_inputs: Sequence[Any], options: dict) -> Any:
        """(plan, its search record) cached for this graph and inputs, or None (a miss, or a
        cached plan whose study ``options`` ask to continue: ``options`` say which)."""
        ...

    def save(self, captured: Any, example_inputs: Sequence[Any], result: Any, options: dict) -> Any:
        """Store a search's result as the entry of this graph and inputs."""
        ...

    def record_call(self, fn: Any, captured: Any, example_inputs: Sequence[Any]) -> Any:
        """Index the entry by the call ``fn(*example_inputs)`` (``autofuse.load``'s way in)."""
        ...

    def check_writable(self) -> None:
        """Raise, naming the folder, where a search's result could not be saved."""
        ...


class Searcher(Protocol):
    """The search over partitions x implementations (``tune/tuner.py``'s ``tune``): a record
    with the winning ``plan``, picked end to end."""

    def __call__(
        self, captured: Any, example_inputs: Sequence[Any], space: Partitioner, **options: Any
    ) -> Any: ...


@dataclass(frozen=True)
class Planned:
    """A plan and how it was arrived at: the search's record (tuned), the timed choice
    between untuned plans (None: not timed or tuned)."""

    plan: Plan
    tuning: Any = None
    choice: PlanChoice | None = None
    entry: Any = None  # what the store saved the search's result as (its key)
    call: Any = None  # the call record the store wrote


def assemble(
    graph: Graph, groups: Sequence[frozenset[int]], choices: Any = None, label: str = "plan"
) -> Plan:
    """The one place a plan is put together from its groups and their choices (a config or a
    library call per group; ``build_plan``): the planner's own plans, the search's candidates
    (``tune/tuner.py``) and a bucket's plan at a new shape (:meth:`Planner.rebuilt`)."""
    return build_plan(graph, groups, choices, label=label)


class Planner:
    """Plans for one graph (see the module docstring)."""

    def __init__(self, graph: Graph, variants: Sequence[tuple[str, Graph]] = ()) -> None:
        self.graph = graph
        # graphs computing the same from the same inputs (a front end's rewrite, by what it
        # is: SDPA written out), whose untuned plans are timed beside this graph's
        self.variants = tuple(variants)

    @cached_property
    def space(self) -> Partitioner:
        """The graph's legal fusion decisions (built when a plan is first made)."""
        return Partitioner(self.graph)

    def build(
        self, groups: Sequence[frozenset[int]], choices: Any = None, label: str = "plan"
    ) -> Plan:
        return assemble(self.graph, groups, choices, label=label)

    def rebuilt(self, part: tuple, label: str) -> Plan | None:
        """The partition ``part`` (``buckets.partition_of`` a plan of another shape of this
        graph's structure) built for this graph; None where it does not fit (a group the kinds
        refuse at this shape)."""
        try:
            return self.build(part[0], part[1], label=label)
        except Exception:  # noqa: BLE001 - a partition that does not fit: a fresh plan is made
            return None

    def fitted(self, plan: Plan) -> Plan | None:
        """A cached ``plan`` as it runs this graph: itself where it was made for this graph,
        its partition and choices rebuilt where it was made for another size of the graph's
        structure (a shape bucket's entry); None where it cannot run this graph."""
        if plan.graph.key == self.graph.key:
            return plan
        if any(plan.graph.key == g.key for _, g in self.other_graphs):
            return plan  # a timed alternative (another layout, BatchNorm folded) was chosen
        if structure_key(plan.graph) != structure_key(self.graph):
            return None
        return self.rebuilt(partition_of(plan), plan.label)

    def first_fit(self, offered: Iterable[tuple[Plan, Any]]) -> Planned | None:
        """The first of the cached ``(plan, record)`` pairs ``offered`` whose plan runs this
        graph (:meth:`fitted`), with its record (whose ``plan``, where it has one, is the
        fitted plan); None where none does."""
        for cached, record in offered:
            plan = self.fitted(cached)
            if plan is None:
                continue
            if plan is not cached and is_dataclass(record) and hasattr(record, "plan"):
                record = replace(record, plan=plan)
            return Planned(plan, record)
        return None

    def cached(
        self, store: PlanStore, captured: Any, example_inputs: Sequence[Any], options: dict
    ) -> Planned | None:
        """The ``store``'s plan for this graph and inputs, as it runs this graph, or None."""
        hit = store.lookup(captured, example_inputs, options)
        return None if hit is None else self.first_fit([hit])

    def greedy(self, label: str = "greedy") -> Plan:
        return self.build(self.space.greedy().groups, label=label)

    def explained(self) -> tuple[Plan, Plan, Any]:
        """(the unfused plan, the greedy plan, the greedy partition) ``explain`` compares."""
        greedy = self.space.greedy()
        unfused = self.build(self.space.unfused().groups, label="unfused")
        return unfused, self.build(greedy.groups, label="fused (greedy)"), greedy

    def untuned(
        self,
        label: str,
        on_cuda: bool,
        inputs: Callable[[], Sequence[torch.Tensor]],
        time_config: ConfigTimer | None = None,
    ) -> Planned:
        """The untuned plan and, where two or more were timed, the choice; ``inputs()`` gives
        the graph's inputs to time on (called only when timing); ``time_config`` times the
        quick configs of its kernels (``config_choice.py``; None: the default configs)."""
        base = self.space.untuned()
        plan = self.build(base.groups, label=label)
        if not on_cuda or interpreting():
            return Planned(plan)
        try:
            measured = self.configs_timed(base, plan, time_config)
            others = self.alternatives(base, label)
            variants = library_variants(self.graph)
            timed = bool(others or variants or fusions(plan) or any(map(fusions, others)))
            ins: Any = list(inputs()) if timed or measured else None
        except Exception as e:  # noqa: BLE001 - a measurement never fails the plan: the fused one
            why = f"not timed: {type(e).__name__}: {e}"[:300]
            return Planned(plan, None, PlanChoice(plan.label, ((plan.label, None),), why))
        run = lambda p: execute(p, ins)  # noqa: E731
        kept, notes = agreeing(plan, [measured], run) if measured is not None else ([], [])
        for note in notes:  # the timed configs' plan gave other values: the rule's runs
            logs.emit("search", note)
        if kept:
            # the timed configs lead; the rule's plan is timed against them end to end
            plan, others = measured, [replace(plan, label=f"{label}, default configs"), *others]
        elif not timed:
            return Planned(plan)
        plan, choices = timed_choices(plan, others, run)
        if not choices:
            return Planned(plan)
        return Planned(_measured(plan, merged(choices), label), None, merged(choices))

    def configs_timed(self, base: Any, plan: Plan, time_config: ConfigTimer | None) -> Plan | None:
        """``plan`` with each kernel at the fastest of its kind's quick configs, timed alone by
        ``time_config`` (each step saying the times); None where none is timed or none differs
        from its default."""
        try:
            timed = None if time_config is None else timed_configs(plan, base.groups, time_config)
        except Exception as e:  # noqa: BLE001 - the default configs then; the rest still timed
            logs.emit("search", f"{plan.label}: configs not timed: {type(e).__name__}: {e}")
            return None
        if timed is None:
            return None
        choices, reasons = timed
        measured = self.build(base.groups, choices, label=plan.label)
        return annotated(measured, lambda s: reasons.get(frozenset(s.nodes)))

    def alternatives(self, base: Any, label: str) -> list[Plan]:
        """The untuned plans timed beside ``base``'s: every matmul in cuBLAS where ``base``
        fuses one; every convolution contiguous where ``base`` keeps one's result
        channels-last (whether the kernels reading it are as fast in that layout); every
        convolution channels-last where their measured picks differ (each picked alone, with
        its input's conversion in its time: a network whose convolutions all run
        channels-last converts once, at its input); inference BatchNorm folded into the
        convolutions before it (``ir/conv_fold.py``: the folded weight is computed on every
        call, kernels the plan without it does not launch, for a bias cuDNN's fused call
        takes); each variant graph's untuned plan."""
        out = []
        alt = self.space.library_gemms(base)
        if alt is not None:
            out.append(self.build(alt.groups, label=f"{label}, matmuls in cuBLAS"))
        return out + self.graph_alternatives(label)

    @cached_property
    def other_graphs(self) -> tuple[tuple[str, Graph], ...]:
        """(what, graph) for each graph computing the same from the same inputs whose plan is
        timed beside this graph's (:meth:`alternatives`): a cached plan of one of them runs
        this graph's calls as it is (:meth:`fitted`)."""
        out = []
        if any(n.attr("eager_strides") for n in self.graph.nodes):
            out.append(("convolutions contiguous", relaid(self.graph, "contiguous")))
        if channels_last_differs(self.graph):  # mixed picks, or a chain picked contiguous
            out.append(("convolutions channels-last", relaid(self.graph, "channels_last")))
        out += self.variants
        if settings().bn_fold == "measure":
            folded = fold_batchnorm(self.graph)
            if folded is not self.graph:
                out.append(("BatchNorm folded into the convolutions", folded))
        return tuple(out)

    def graph_alternatives(self, label: str) -> list[Plan]:
        """The untuned plan of each of :attr:`other_graphs`."""
        out = []
        for what, graph in self.other_graphs:
            other = Planner(graph)
            out.append(other.build(other.space.untuned().groups, label=f"{label}, {what}"))
        return out

    @staticmethod
    def replay(
        plan: Plan, on_cuda: bool, inputs: Callable[[], Sequence[torch.Tensor]]
    ) -> GraphChoice:
        """``cuda_graph="auto"``: whether ``plan`` replays a CUDA graph, timed kernel by kernel
        and replayed end to end on ``inputs()`` (a throwaway replay: the one kept captures the
        real inputs); off CUDA, or under the interpreter, no replay and nothing timed."""
        if not on_cuda or interpreting():
            return GraphChoice(False, None, None, "not on CUDA (or under the interpreter)")
        try:
            ins = list(inputs())
            probe = GraphReplay(plan)
            with torch.no_grad():
                choice = choose_replay(
                    lambda: execute(plan, ins),
                    lambda: probe(ins) or execute(plan, ins),
                    cuda_inputs(ins),
                )
        except Exception as e:  # noqa: BLE001 - a measurement never fails the plan: no replay
            return GraphChoice(False, None, None, f"not timed: {type(e).__name__}: {e}"[:300])
        if probe.off is not None:  # the replay timed was the plan run step by step
            return GraphChoice(False, choice.plain_s, None, f"replay off: {probe.off}"[:300])
        return choice

    def tuned(
        self,
        captured: Any,
        example_inputs: Sequence[Any],
        store: PlanStore,
        search: Searcher,
        *,
        retune: bool = False,
        fn: Any = None,
        **options: Any,
    ) -> Planned:
        """The cached plan for this graph and inputs, or the search's, saved (``retune``: the
        search's, whatever the cache holds); indexed by the call ``fn(*example_inputs)``
        where ``fn`` is given."""
        hit = None if retune else self.cached(store, captured, example_inputs, options)
        entry = None
        if hit is not None:
            plan, record = hit.plan, hit.tuning
        else:
            store.check_writable()
            record = search(captured, example_inputs, self.space, retune=retune, **options)
            record = self._library_choice(record, options.get("example_flat"))
            entry = store.save(captured, example_inputs, record, options)
            plan = record.plan
        call = store.record_call(fn, captured, example_inputs) if fn is not None else None
        return Planned(plan, record, None, entry, call)

    def _library_choice(self, record: Any, flat: Sequence[Any] | None) -> Any:
        """The search's record, its plan timed end to end on ``flat`` (the graph's inputs,
        where they are on CUDA) against the other graphs' untuned plans (another layout,
        BatchNorm folded: :attr:`other_graphs`, each with its fused calls, each agreeing with
        it), then the winner's library calls on offer (chains a call fuses, SDPA's backends)."""
        cuda = flat is not None and any(isinstance(t, torch.Tensor) and t.is_cuda for t in flat)
        if not cuda or interpreting():
            return record
        plan, ins = record.plan, list(flat)
        run = lambda p: execute(p, ins)  # noqa: E731
        others = self.graph_alternatives(plan.label)
        if not (others or library_variants(self.graph) or fusions(plan)):
            return record
        chosen, choices = timed_choices(plan, others, run)
        if chosen is plan:
            return record
        chosen = _measured(replace(chosen, label=plan.label), merged(choices), plan.label)
        return replace(record, plan=chosen)


def timed_choices(
    plan: Plan, others: Sequence[Plan], run: Callable[[Plan], Any]
) -> tuple[Plan, list[PlanChoice]]:
    """``plan`` against ``others`` (fused matmuls against cuBLAS, another layout, BatchNorm
    folded; each with its fused calls, each checked against ``plan`` first: one that differs
    is not timed, and the choice says why),
    then the winner's chains a library call fuses (cuDNN's conv + ReLU), then the library
    calls on offer (SDPA's), each round timed end to end by ``run``: the plan chosen and each
    round's choice."""
    choices = []
    if others:
        cands, notes = agreeing(plan, with_fused_variants(others, run), run)
        plan, choice = choose_plan([plan, *cands], run, True)
        choices.append(replace(choice, why="; ".join([choice.why, *notes])) if notes else choice)
    fused = choose_fused(plan, run)
    if fused is not None:
        plan, choice = fused
        choices.append(choice)
    variants = library_variants(plan.graph)
    if variants:
        plan, choice = choose_plan([plan, *(with_calls(plan, v) for v in variants)], run, True)
        choices.append(choice)
    return plan, choices


def _measured(plan: Plan, choice: PlanChoice, label: str) -> Plan:
    """``plan`` with each step's reason followed by the timed ``choice`` (where anything was
    timed)."""
    logs.emit("search", f"{label}: {choice.why} -> {choice.chosen}")
    if not any(t is not None for _, t in choice.times):
        return plan
    measured = f"measured: {choice.why} -> {choice.chosen}"
    return annotated(plan, lambda s: f"{s.reason}; {measured}" if s.reason else measured)


__all__ = ["PlanStore", "Planned", "Planner", "Searcher", "assemble", "timed_choices"]
