"""The partitioner: which nodes share a kernel.

The space is explicit: one fuse / don't-fuse decision per edge. Vertical edges join a producer and
its consumer; horizontal edges join two consumers of one tensor (``sin(x)``, ``cos(x)``). A set of
decisions maps to a partition by union-find; a component that is not a legal kernel is split
again by merging along its chosen edges one at a time, keeping each merge only if it stays legal.
Every refused merge keeps its reason (:class:`Refusal`), which the report shows.

A group is legal when it is convex (no path leaves it and comes back), holds only pointwise and
reduction ops, and lowers to one kernel (``codegen.analyze_group``: one iteration domain, every
reduced value read on its own row). Convex groups alone do not make a runnable partition: two
groups can each be convex and still need each other's results (one reads a value of the other
that is computed from its own), a cycle no order of kernels runs. A partition is therefore also
checked as a whole (:meth:`Partitioner.acyclic`), and where the decisions' groups form such a
cycle they are built again one merge at a time, each merge refused that would close one.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from autofuse.ir.graph import Graph
from autofuse.kernels import (
    INLINE_OPS,
    FusionRefused,
    GroupInfo,
    analyze_group,
    fusible,
    library_first,
    library_node,
    proposed_groups,
    unlowerable,
)


@dataclass(frozen=True, order=True)
class Edge:
    a: int
    b: int
    kind: str  # "vertical" | "horizontal"

    @property
    def name(self) -> str:
        return f"{'v' if self.kind == 'vertical' else 'h'}{self.a}_{self.b}"


@dataclass(frozen=True)
class Refusal:
    edge: Edge
    reason: str


@dataclass(frozen=True)
class Partition:
    groups: tuple[frozenset[int], ...]
    refusals: tuple[Refusal, ...] = ()

    @property
    def key(self) -> tuple[tuple[int, ...], ...]:
        return tuple(sorted(tuple(sorted(g)) for g in self.groups))

    def __len__(self) -> int:
        return len(self.groups)


class TooManyPartitions(RuntimeError):
    pass


class Partitioner:
    """Enumerates and builds legal partitions of one graph (with memoized legality)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        fus = [i for i in graph.compute_nodes() if fusible(graph, i)]
        self.eager = {i: r for i in fus if (r := unlowerable(graph, i)) is not None}
        self.nodes = tuple(i for i in fus if i not in self.eager)
        self._legal: dict[frozenset[int], GroupInfo | str] = {}

    # -- structure ---------------------------------------------------------------------------
    @cached_property
    def edges(self) -> tuple[Edge, ...]:
        g, nodes = self.graph, set(self.nodes)
        out: dict[tuple[int, int], Edge] = {}
        for c in self.nodes:
            for p in g.compute_inputs(c):
                if p in nodes:
                    out[(p, c)] = Edge(p, c, "vertical")
        readers: dict[int, list[int]] = {}
        for c in self.nodes:
            for p in g.compute_inputs(c):
                if g[p].op not in INLINE_OPS:
                    readers.setdefault(p, []).append(c)
        for cs in readers.values():
            for a, b in zip(cs, cs[1:]):
                # a value computed again for other readers (ir/recompute.py) is there to run
                # in their kernel: never joined sideways to the kernel computing the original
                if bool(g[a].attr("recomputed")) != bool(g[b].attr("recomputed")):
                    continue
                if (a, b) not in out and (b, a) not in out:
                    out[(a, b)] = Edge(a, b, "horizontal")
        return tuple(sorted(out.values(), key=lambda e: (e.b, e.a)))

    @cached_property
    def _reach(self) -> dict[int, int]:
        """Bitset of the compute nodes reachable from each compute node."""
        g = self.graph
        reach: dict[int, int] = {}
        for i in reversed(g.compute_nodes()):
            bits = 0
            for u in g.compute_users[i]:
                bits |= (1 << u) | reach.get(u, 0)
            reach[i] = bits
        return reach

    def convex(self, group: frozenset[int]) -> bool:
        gbits = 0
        for m in group:
            gbits |= 1 << m
        out = 0
        for m in group:
            out |= self._reach[m]
        out &= ~gbits
        u = 0
        while out:
            if out & 1 and self._reach.get(u, 0) & gbits:
                return False
            out >>= 1
            u += 1
        return True

    def acyclic(self, groups: list[frozenset[int]] | tuple[frozenset[int], ...]) -> bool:
        """Whether ``groups`` (every other compute node alone) run in some order: no group
        needs, through other groups or nodes, a value computed from its own results."""
        g = self.graph
        unit = {n: k for k, grp in enumerate(groups) for n in grp}
        for n in g.compute_nodes():
            unit.setdefault(n, len(unit) + len(groups))
        deps: dict[int, set[int]] = {}
        for n in g.compute_nodes():
            for u in g.compute_users[n]:
                if unit[u] != unit[n]:
                    deps.setdefault(unit[u], set()).add(unit[n])
        indeg = {u: len(d) for u, d in deps.items()}
        users: dict[int, list[int]] = {}
        for u, d in deps.items():
            for p in d:
                users.setdefault(p, []).append(u)
        ready = [u for u in set(unit.values()) if not indeg.get(u)]
        placed = 0
        while ready:
            placed += 1
            for u in users.get(ready.pop(), ()):
                indeg[u] -= 1
                if not indeg[u]:
                    ready.append(u)
        return placed == len(set(unit.values()))

    def _closes_cycle(self, merged: frozenset[int], owner: dict) -> bool:
        """Whether a path leaves ``merged`` and comes back into it when every node of another
        group (``owner``: node -> its group; others alone) counts as one step: entering a
        group reaches all of its outputs."""
        users = self.graph.compute_users
        todo = [u for m in merged for u in users[m] if u not in merged]
        seen = set(todo)
        while todo:
            n = todo.pop()
            for m in owner.get(n, (n,)):
                for u in users[m]:
                    if u in merged:
                        return True
                    if u not in seen:
                        seen.add(u)
                        todo.append(u)
        return False

    # -- legality ----------------------------------------------------------------------------
    def check(self, group: frozenset[int]) -> GroupInfo | str:
        """The group's info if it can be one kernel, else the reason it cannot."""
        hit = self._legal.get(group)
        if hit is not None:
            return hit
        if len(group) > 1 and not self.convex(group):
            res: GroupInfo | str = "not convex: a path leaves the group and comes back into it"
        else:
            try:
                res = analyze_group(self.graph, group)
            except FusionRefused as e:
                res = e.reason
        self._legal[group] = res
        return res

    def legal(self, group: frozenset[int]) -> bool:
        return isinstance(self.check(group), GroupInfo)

    # -- decisions -> partition --------------------------------------------------------------
    @cached_property
    def edge_names(self) -> dict[Edge, str]:
        """Each edge's readable decision name, the search parameter's: ``fuse:mul→add`` for a
        producer and its consumer, ``fuse:sin&cos`` for two readers of one tensor; where two
        edges would share a name, each of them names its node ids (``fuse:mul#3→add#4``).
        Stable for a graph: a resumed study finds its parameters again."""
        sep = {"vertical": "→", "horizontal": "&"}

        def short(e: Edge) -> str:
            return f"fuse:{self.graph[e.a].op}{sep[e.kind]}{self.graph[e.b].op}"

        seen: dict[str, int] = {}
        for e in self.edges:
            seen[short(e)] = seen.get(short(e), 0) + 1
        out = {}
        for e in self.edges:
            name = short(e)
            if seen[name] > 1:
                a, b = self.graph[e.a].op, self.graph[e.b].op
                name = f"fuse:{a}#{e.a}{sep[e.kind]}{b}#{e.b}"
            out[e] = name
        return out

    def from_decisions(self, fuse: Mapping[str, bool]) -> Partition:
        """Partition for a fuse/don't-fuse choice per edge, keyed by :attr:`edge_names` (or
        the terse ``Edge.name``); a missing edge is not fused."""
        names = self.edge_names
        chosen = [e for e in self.edges if fuse.get(names[e], fuse.get(e.name, False))]
        comp = sorted(_union_find(self.nodes, chosen), key=min)
        groups, refusals = self._build(comp, chosen, None)
        if not self.acyclic(groups):
            groups, refusals = self._build(comp, chosen, {})
        return Partition(tuple(sorted(groups, key=min)), tuple(refusals))

    def _build(
        self, comp: list[frozenset[int]], chosen: list[Edge], owner: dict | None
    ) -> tuple[list[frozenset[int]], list[Refusal]]:
        """The groups of the components ``comp`` of the ``chosen`` edges, each component split
        (:meth:`_repair`) where it is not one legal kernel. With ``owner`` (node -> its group
        so far, filled here) a group that would close a cycle with those built before it is
        split too."""
        groups: list[frozenset[int]] = []
        refusals: list[Refusal] = []
        for members in comp:
            if self.legal(members) and (owner is None or not self._closes_cycle(members, owner)):
                found = [members]
            else:
                inner = [e for e in chosen if e.a in members and e.b in members]
                found, r = self._repair(members, inner, owner)
                refusals += r
            groups += found
            for grp in found if owner is not None else ():
                owner.update(dict.fromkeys(grp, grp))
        return groups, refusals

    def _merge_refusal(self, merged: frozenset[int], cluster: dict, owner: dict | None):
        """Why ``merged`` cannot be one group beside the current ``cluster`` (this component's
        groups so far) and ``owner`` (the groups built before it), or its info if it can."""
        why = self.check(merged)
        if isinstance(why, GroupInfo) and owner is not None:
            if self._closes_cycle(merged, {**owner, **cluster}):
                return CYCLE_REASON
        return why

    def _repair(self, members: frozenset[int], edges: list[Edge], owner: dict | None = None):
        """Merge along ``edges`` in order, each merge checked; a refused edge is tried again
        after the others (a partial group can be illegal where the larger one is not: an
        index mask stored beside the values it masks, before both join their scatter). With
        ``owner`` (see :meth:`_build`) a merge that closes a cycle between groups is refused."""
        cluster = {m: frozenset({m}) for m in members}
        refusals = []
        chosen = set(edges)
        for seed in proposed_groups(self.graph, members, self._reach):
            inside = [e for e in self.edges if e.a in seed and e.b in seed]
            if not inside or not chosen.issuperset(inside):
                continue  # the decisions keep some of it apart
            why = self.check(seed)
            why = None if isinstance(why, GroupInfo) else why
            if why is None and owner is not None:
                why = self._merge_refusal(seed, cluster, owner)
                why = None if isinstance(why, GroupInfo) else why
            if why is not None:
                refusals.append(Refusal(inside[0], why))
            elif all(len(cluster[m]) == 1 for m in seed):
                for m in seed:
                    cluster[m] = seed
        pending, refused = list(edges), []
        while pending:
            refused, merged_any = [], False
            for e in pending:
                ca, cb = cluster[e.a], cluster[e.b]
                if ca is cb:
                    continue
                merged = ca | cb
                why = self._merge_refusal(merged, cluster, owner)
                if isinstance(why, GroupInfo):
                    merged_any = True
                    for m in merged:
                        cluster[m] = merged
                else:
                    refused.append(Refusal(e, why))
            pending = [r.edge for r in refused] if merged_any else []
        refusals += refused
        return list(dict.fromkeys(cluster.values())), refusals

    def greedy(self) -> Partition:
        """Every legal fusion taken (edges in topological order of their consumer)."""
        return self.from_decisions({n: True for n in self.edge_names.values()})

    def library_gemms(self, partition: Partition) -> Partition | None:
        """``partition`` with every matmul (and convolution) split out of its group, to run as
        torch's own GEMM (cuBLAS; cuDNN) while the rest of the group stays fused (the epilogue
        as one kernel); None where ``partition`` has no fused matmul or convolution."""
        mms = {n for n in self.nodes if library_node(self.graph, n)}
        fused = [g for g in partition.groups if len(g) > 1 and g & mms]
        if not fused:
            return None
        fuse = self.decisions_of(partition)
        for e in self.edges:
            if e.a in mms or e.b in mms:
                fuse[self.edge_names[e]] = False
        return self.from_decisions(fuse)

    def untuned(self) -> Partition:
        """The plan to run without measuring: :meth:`greedy`, except that groups whose kind is
        ``library_first`` (GEMM + epilogue; convolution + epilogue but where its rule says)
        run their matmul (convolution) in cuBLAS (cuDNN) beside one fused epilogue kernel, as
        torch.compile's default mode does; attention and row-GEMM groups stay."""
        greedy = self.greedy()
        infos = [self.check(g) for g in greedy.groups if len(g) > 1]
        first = [i for i in infos if isinstance(i, GroupInfo) and library_first(i, self.graph)]
        mms = {n for i in first for n in i.nodes if library_node(self.graph, n)}
        if not mms:
            return greedy
        # greedy again without those matmuls' edges: an epilogue freed from its GEMM fuses on
        # (a scale with the softmax after it)
        return self.from_decisions(
            {name: e.a not in mms and e.b not in mms for e, name in self.edge_names.items()}
        )

    def unfused(self) -> Partition:
        return Partition(tuple(frozenset({n}) for n in self.nodes))

    def decisions_of(self, partition: Partition) -> dict[str, bool]:
        """Decisions that reproduce ``partition`` (every edge inside a group fused), keyed by
        :attr:`edge_names`."""
        where = {n: k for k, g in enumerate(partition.groups) for n in g}
        return {self.edge_names[e]: where[e.a] == where[e.b] for e in self.edges}

    # -- enumeration -------------------------------------------------------------------------
    def enumerate(self, limit: int = 20000) -> list[Partition]:
        """Every legal partition of the fusible nodes (raises TooManyPartitions past limit)."""
        out: list[Partition] = []
        count = [0]

        def rec(k: int, groups: list[frozenset[int]]) -> None:
            count[0] += 1
            if count[0] > limit * 20:
                raise TooManyPartitions(f"more than {limit} partitions to visit")
            if k == len(self.nodes):
                if all(self._connected(g) and self.legal(g) for g in groups) and self.acyclic(
                    groups
                ):
                    out.append(Partition(tuple(sorted(groups, key=min))))
                    if len(out) > limit:
                        raise TooManyPartitions(f"more than {limit} legal partitions")
                return
            n = self.nodes[k]
            for j, g in enumerate(groups):
                cand = g | {n}
                if not self.convex(cand):
                    continue
                rec(k + 1, groups[:j] + [cand] + groups[j + 1 :])
            rec(k + 1, groups + [frozenset({n})])

        rec(0, [])
        return out

    def _connected(self, group: frozenset[int]) -> bool:
        """Whether the group's nodes are joined by edges of the space (else it is not reachable
        by decisions and fuses nothing that shares data)."""
        if len(group) == 1:
            return True
        adj: dict[int, set[int]] = {m: set() for m in group}
        for e in self.edges:
            if e.a in group and e.b in group:
                adj[e.a].add(e.b)
                adj[e.b].add(e.a)
        start = next(iter(group))
        seen, todo = {start}, [start]
        while todo:
            for nb in adj[todo.pop()] - seen:
                seen.add(nb)
                todo.append(nb)
        return len(seen) == len(group)

    def sample(self, n: int, seed: int = 0) -> list[Partition]:
        """Up to ``n`` distinct partitions from random decisions (plus greedy and unfused)."""
        rng = random.Random(seed)
        seen: dict[tuple, Partition] = {}
        for p in (self.greedy(), self.unfused()):
            seen[p.key] = p
        tries = 0
        while len(seen) < n and tries < 20 * n:
            tries += 1
            p = self.from_decisions({e.name: rng.random() < 0.5 for e in self.edges})  # terse
            seen.setdefault(p.key, p)
        return list(seen.values())

    def partitions(
        self, max_enumerate: int = 2000, sample: int = 64, seed: int = 0
    ) -> list[Partition]:
        """All legal partitions if there are at most ``max_enumerate``, else a seeded sample."""
        try:
            return self.enumerate(limit=max_enumerate)
        except TooManyPartitions:
            return self.sample(sample, seed)


CYCLE_REASON = (
    "cycle between groups: each group is convex, but this merge would make two groups need "
    "each other's results (one reads a value computed from the other's), which no order of "
    "kernels runs"
)


def _union_find(nodes, edges) -> list[frozenset[int]]:
    parent = {n: n for n in nodes}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for e in edges:
        ra, rb = find(e.a), find(e.b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    comps: dict[int, set[int]] = {}
    for n in nodes:
        comps.setdefault(find(n), set()).add(n)
    return [frozenset(c) for c in comps.values()]
