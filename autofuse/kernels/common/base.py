"""What every kernel kind shares: the group record, the kernel record and its metadata, the
plugin protocol, and the refusal a kind raises when a group cannot be one of its kernels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from autofuse.ir.graph import Graph, numel


class FusionRefused(Exception):
    """A group that cannot be one kernel; ``reason`` says why (the report shows it)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def prev_pow2(n: int) -> int:
    """The largest power of two <= n (1 for n < 1)."""
    return 1 if n <= 1 else 1 << (n.bit_length() - 1)


# ---------------------------------------------------------------------------------------------
# Groups
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class TileConfig:
    """The attention kinds' tiles: BLOCK_M query rows by BLOCK_N keys, warps and pipeline
    stages."""

    SWITCHES: ClassVar[tuple[str, ...]] = ()  # fields the search and the polish switch on and off
    BLOCK_M: int
    BLOCK_N: int
    num_warps: int = 4
    num_stages: int = 2

    def label(self) -> str:
        return (
            f"BLOCK_M={self.BLOCK_M} BLOCK_N={self.BLOCK_N} num_warps={self.num_warps} "
            f"num_stages={self.num_stages}"
        )


def nearest_config(configs: list[TileConfig], want: tuple[int, int, int, int]) -> TileConfig:
    """The config of ``configs`` closest to ``want`` (BLOCK_M, BLOCK_N, num_warps,
    num_stages): powers of two compared by their exponents, stages by their difference."""
    return min(
        configs,
        key=lambda c: (
            sum(
                abs(a.bit_length() - b.bit_length())
                for a, b in zip((c.BLOCK_M, c.BLOCK_N, c.num_warps), want)
            )
            + abs(c.num_stages - want[3])
        ),
    )


@dataclass(frozen=True)
class GroupInfo:
    """A group that one kernel of kind ``kind`` computes (the name of its plugin)."""

    nodes: tuple[int, ...]
    kind: str
    domain: tuple[int, ...]  # full iteration shape
    reduce_dims: tuple[int, ...]  # reduced positions of ``domain`` (empty: no row reduction)
    stored: tuple[int, ...]  # members written to memory
    loads: tuple[int, ...]  # base nodes read from memory
    # GEMM groups: the mm/bmm nodes (two for a horizontal pair); a convolution group: its
    # convolution (the product its kernel accumulates)
    matmuls: tuple[int, ...] = ()

    @property
    def xnumel(self) -> int:
        return numel(s for i, s in enumerate(self.domain) if i not in self.reduce_dims)

    @property
    def rnumel(self) -> int:
        return numel(self.domain[i] for i in self.reduce_dims) if self.reduce_dims else 1

    @property
    def reduces(self) -> bool:
        """The kernel walks rows (a reduction over ``reduce_dims``)."""
        return bool(self.reduce_dims)


DESCRIPTOR_ALIGNMENT = 16  # a TMA tensor descriptor's base must be 16-byte aligned

INLINE_OPS = ("const", "iota")  # computed where they are read; never loaded, never a group


def stored_nodes(graph: Graph, members: frozenset[int]) -> tuple[int, ...]:
    outputs = {graph.base_of(o) for o in graph.outputs}
    stored = []
    for m in sorted(members):
        users = graph.compute_users[m]
        if m in outputs or any(u not in members for u in users):
            stored.append(m)
    return tuple(stored)


def loaded_nodes(graph: Graph, members: frozenset[int]) -> tuple[int, ...]:
    loads: dict[int, None] = {}
    for m in sorted(members):
        for j in graph.compute_inputs(m):
            if j not in members and graph[j].op not in INLINE_OPS:
                loads[j] = None
    return tuple(loads)


def describe(graph: Graph, i: int) -> str:
    n = graph[i]
    return f"{n.op} %{i} ({n.name or n.op}, {list(n.shape)})"


# ---------------------------------------------------------------------------------------------
# Kernels and their metadata
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelMeta:
    """What the runtime needs to know of a kernel, and what its emitter did, given by the
    emitter (no one reads the generated source for it). The cost model reads none of it: it
    finds the same facts from the group and the config (``common/reads.py``, the kinds'
    ``cost_facts``; ``tests/test_cost_facts.py`` checks that they agree).

    ``load_passes[k]``: how many times the kernel reads its k-th loaded buffer (a looped
    reduction recomputes each phase from its loads). ``dots``: ``tl.dot`` calls per column
    tile (a row-GEMM recomputes its product in every pass). ``tiles``: a GEMM kernel's output
    tiling ``(BLOCK_M, BLOCK_N, BLOCK_K, shared memory bytes)``, None for other kernels.
    ``needs_allocator``: the kernel makes tensor descriptors on the device (Triton's scratch
    allocator must be set). ``input_alignment``: the bytes every loaded buffer's base must be
    a multiple of (a tensor descriptor's: :data:`DESCRIPTOR_ALIGNMENT`), 0 for any; the runtime
    runs the group's ops in eager on inputs that are not. ``work``: the fraction of its product
    tiles the kernel computes (an attention kernel whose mask bounds the key loop: about half
    for a causal one).
    ``selective_loads``: the positions in ``info.loads`` of buffers read only on the lanes a
    ``where`` takes them from (``masked_fill(~tril, min)``: the masked half is not read).
    ``kept_loads``: the positions of broadcast buffers loaded ``evict_last`` (re-read by other
    programs).
    """

    load_passes: tuple[int, ...] = ()
    dots: int = 0
    tiles: tuple[int, int, int, int] | None = None
    needs_allocator: bool = False
    input_alignment: int = 0
    work: float = 1.0
    selective_loads: tuple[int, ...] = ()
    kept_loads: tuple[int, ...] = ()


@dataclass(frozen=True)
class Kernel:
    """A generated kernel: what it computes, its source and how to launch it.

    ``layout`` gives the kernel's positional arguments: ``("in", k)`` is the k-th loaded buffer
    (``info.loads[k]``), ``("out", k)`` the k-th stored one, ``("int", v)`` a constant;
    ``launch_kw`` holds the constexprs and num_warps / num_stages.
    """

    name: str
    source: str
    config: Any  # the kind's config record
    info: GroupInfo
    layout: tuple[tuple[str, int], ...] = ()
    grid: tuple[int, ...] = (1,)
    launch_kw: tuple[tuple[str, int], ...] = ()
    meta: KernelMeta = KernelMeta()


# (an opaque member is a convolution: the only opaque op a kind takes, kernels/conv)
_NAME_OP = {"pow_scalar": "pow", "copy": "clone", "cast": "to", "opaque": "convolution"}


def kernel_name(graph: Graph, info: GroupInfo, prefix: str, index: int) -> str:
    """``autofuse_<prefix>_fused_<ops>_<index>``: what the kernel fuses, for people."""
    ops = sorted(
        {
            _NAME_OP.get(graph[i].op, graph[i].op)
            for i in info.nodes
            if graph[i].op not in INLINE_OPS
        }
    )
    if len(ops) > 8:
        ops = ops[:8] + ["etc"]
    return f"autofuse_{prefix}_fused_{'_'.join(ops)}_{index}"


class ProposesNone:
    """For a kind whose every group pairwise merges reach: it proposes no candidate group (and,
    unless it says otherwise, no config an untuned plan times beside its default)."""

    def proposals(
        self, graph: Graph, members: frozenset[int], reach: dict[int, int]
    ) -> list[frozenset[int]]:
        return []

    def quick_configs(self, graph: Graph, info: GroupInfo) -> list[Any]:
        return []


class KernelKind(Protocol):
    """A kernel kind: a plugin of the registry in ``autofuse.kernels``.

    ``claims`` says whether a set of nodes is this kind's to analyze (the registry asks the
    kinds in order); ``analyze`` checks the group and describes it (or raises FusionRefused);
    ``config_space`` / ``default_config`` / ``check_config`` are over the kind's own config
    class; ``generate`` renders one kernel with its metadata; ``prefix`` names it.
    ``library_first``: a plan chosen without measuring runs this kind's matmuls as library
    calls (cuBLAS) with the rest of the group fused in its own kernel; only a search that
    times the generated kernel faster picks it. ``runtime_sizes``: its kernels take their row
    count as an argument under ``common.sizes.runtime_sizes`` (configs chosen by size bucket,
    one kernel for the bucket's shapes; an optional ``bucket_rule(info)`` keeps a group's
    configs per exact shape where it says False). ``proposals``: candidate groups among ``members`` that
    pairwise merging cannot reach (``reach[n]``: the bitset of nodes reachable from ``n``), which
    the partitioner tries first. ``cost_facts`` tells the cost model what its kernel of a
    group under a config moves and computes (``common.cost``: a loop or a tiled product),
    from the group and the config alone: pricing renders no kernel. ``quick_configs``: the
    few configs besides the default that an untuned plan on a GPU times for a group and keeps
    the fastest of (``plan/config_choice.py``, as Inductor times a handful per kernel); empty:
    the default alone.
    """

    name: str
    config_class: type
    library_first: bool
    runtime_sizes: bool

    def claims(self, graph: Graph, members: frozenset[int]) -> bool: ...

    def analyze(self, graph: Graph, members: frozenset[int]) -> GroupInfo: ...

    def config_space(self, graph: Graph, info: GroupInfo) -> list[Any]: ...

    def default_config(self, graph: Graph, info: GroupInfo) -> Any: ...

    def check_config(self, info: GroupInfo, config: Any) -> None: ...

    def prefix(self, info: GroupInfo, config: Any) -> str: ...

    def generate(self, graph: Graph, info: GroupInfo, config: Any, index: int) -> Kernel: ...

    def cost_facts(self, graph: Graph, info: GroupInfo, config: Any) -> Any: ...

    def quick_configs(self, graph: Graph, info: GroupInfo) -> list[Any]: ...

    def proposals(
        self, graph: Graph, members: frozenset[int], reach: dict[int, int]
    ) -> list[frozenset[int]]: ...
