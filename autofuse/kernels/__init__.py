"""Kernel kinds: one fusion group + one launch config -> one Triton kernel with its metadata.

Each kind is a plugin (``common.base.KernelKind``) in its folder and owns its config class:
``pointwise/``, ``reduction/`` (``reduction`` and ``scan``: a reduction kernel with a cumsum /
cumprod), ``gemm/`` (``gemm`` and ``gemm_row``), ``attention/`` (matmul, softmax, matmul:
flash-attention style), ``attention_bwd/`` (its backward: dQ, dK, dV from recomputed tiles),
``scatter/`` (index_put / scatter / scatter_add), ``fill/`` (a pointwise group that reads no
buffer), ``conv/`` (a forward convolution as an implicit GEMM, its epilogue fused: the one
kind whose groups hold an opaque op, beside the library call); ``common/`` holds what they
share. This registry is the one list of kinds:
``analyze_group`` asks the kinds in order which one claims a set of nodes, and every other call
finds the plugin by the kind named in the group's ``GroupInfo``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autofuse.ir.graph import Graph
from autofuse.kernels.attention.emit import AttentionConfig
from autofuse.kernels.attention.kind import AttentionKind
from autofuse.kernels.attention_bwd.emit import AttentionBwdConfig
from autofuse.kernels.attention_bwd.kind import AttentionBwdKind
from autofuse.kernels.common.base import (
    INLINE_OPS,
    FusionRefused,
    GroupInfo,
    Kernel,
    KernelKind,
    KernelMeta,
    describe,
    next_pow2,
)
from autofuse.kernels.common.configs import KernelConfig
from autofuse.kernels.common.cost import LoopCost, TileCost
from autofuse.kernels.conv import LONE_RULE, library_alternative, lone_library, takes
from autofuse.kernels.conv.kind import ConvKind
from autofuse.kernels.fill.kind import FillKind
from autofuse.kernels.gemm.kind import GemmKind
from autofuse.kernels.gemm.row import GemmRowKind, RowGemmConfig
from autofuse.kernels.gemm.template import GemmConfig
from autofuse.kernels.library import (
    SDPA_FORWARD_OPS,
    LibraryCall,
    bind_call,
    call_reason,
    check_call,
    library_calls,
    library_key_parts,
    library_note,
    preferred_call,
)
from autofuse.kernels.pointwise.kind import PointwiseKind
from autofuse.kernels.reduction.kind import ReductionKind
from autofuse.kernels.reduction.scan import ScanKind
from autofuse.kernels.scatter.kind import ScatterKind

__all__ = [
    "EAGER",
    "SDPA_FORWARD_OPS",
    "KernelChoice",
    "Offer",
    "offers",
    "LibraryCall",
    "bind_call",
    "call_reason",
    "check_call",
    "library_calls",
    "library_key_parts",
    "library_note",
    "preferred_call",
    "INLINE_OPS",
    "KINDS",
    "AttentionBwdConfig",
    "AttentionConfig",
    "FusionRefused",
    "GemmConfig",
    "GroupInfo",
    "Kernel",
    "KernelConfig",
    "KernelKind",
    "KernelMeta",
    "LONE_RULE",
    "RowGemmConfig",
    "analyze_group",
    "bucket_config_fits",
    "check_config",
    "config_classes",
    "config_label",
    "config_space",
    "cost_facts",
    "default_config",
    "quick_configs",
    "fusible",
    "generate",
    "kind_of",
    "library_first",
    "library_node",
    "lone_library",
    "next_pow2",
    "proposed_groups",
    "rule_note",
    "switches",
    "unlowerable",
]

KINDS: tuple[KernelKind, ...] = (
    ConvKind(),
    AttentionKind(),
    AttentionBwdKind(),
    ScatterKind(),
    GemmRowKind(),
    GemmKind(),
    ScanKind(),
    ReductionKind(),
    FillKind(),
    PointwiseKind(),
)
_BY_NAME = {k.name: k for k in KINDS}
_LOWERED = frozenset({"pointwise", "reduction", "matmul"})


def bucket_config_fits(info: GroupInfo) -> bool:
    """Whether a launch config chosen for one shape of a bucket is kept for the bucket's other
    shapes (the kinds that take runtime sizes, whose configs are chosen by bucket, but for the
    groups their ``bucket_rule`` refuses); other kinds choose again at each exact shape."""
    kind = kind_of(info)
    rule = getattr(kind, "bucket_rule", None)
    return kind.runtime_sizes and (rule is None or rule(info))


def kind_of(info: GroupInfo) -> KernelKind:
    """The plugin that analyzed ``info``'s group."""
    try:
        return _BY_NAME[info.kind]
    except KeyError:
        raise ValueError(
            f"unknown kernel kind {info.kind!r}: expected one of {sorted(_BY_NAME)}"
        ) from None


def library_first(info: GroupInfo, graph: Graph | None = None) -> bool:
    """Whether an unmeasured plan runs the group's matmuls (convolutions) in the library: its
    kind says so, per group where it has a ``library_rule`` and the graph is given."""
    kind = kind_of(info)
    rule = getattr(kind, "library_rule", None)
    return kind.library_first if rule is None or graph is None else rule(graph, info)


def rule_note(graph: Graph, info: GroupInfo) -> str | None:
    """What the group's kind says of its kernel chosen by the untuned rule (a convolution's:
    why not the library call), or None."""
    note = getattr(kind_of(info), "rule_note", None)
    return note(graph, info) if note is not None else None


def fusible(graph: Graph, i: int) -> bool:
    """Nodes the partitioner places in groups (a lone matmul runs as torch.mm / cuBLAS): the
    lowered kinds' ops, and the convolutions the convolution kind takes (``conv.takes``)."""
    n = graph[i]
    if n.kind == "opaque":
        return takes(graph, i)
    return n.kind in _LOWERED and n.op not in INLINE_OPS


def library_node(graph: Graph, i: int) -> bool:
    """A fusible node a library can run alone: a matmul (cuBLAS), a convolution (cuDNN, but
    where its kernel is forced: ``conv.library_alternative``); the nodes an unmeasured plan
    splits from a ``library_first`` group."""
    n = graph[i]
    return n.kind == "matmul" or (n.kind == "opaque" and library_alternative(graph, i))


def _claims(kind: KernelKind, graph: Graph, members: frozenset[int]) -> bool:
    """``kind.claims``, for a group with an opaque member only where the kind lowers one."""
    if not getattr(kind, "lowers_opaque", False):
        if any(graph[m].kind == "opaque" for m in members):
            return False
    return kind.claims(graph, members)


def unlowerable(graph: Graph, i: int) -> str | None:
    """Why node ``i`` cannot be a kernel even alone (it then runs in eager), or None."""
    try:
        analyze_group(graph, frozenset({i}))
    except FusionRefused as e:
        return f"no kernel for {graph[i].op}: {e.reason}; runs in eager"
    return None


def analyze_group(
    graph: Graph, group: frozenset[int] | set[int], kind: str | None = None
) -> GroupInfo:
    """Check that ``group`` can be one kernel (of ``kind``; None: of the first kind that claims
    it); raise FusionRefused naming the reason if not."""
    members = frozenset(group)
    for m in sorted(members):
        if graph[m].kind not in _LOWERED and not fusible(graph, m):
            target = graph[m].attr("target", graph[m].op)
            raise FusionRefused(
                f"{describe(graph, m)} is an unsupported op ({target}) and runs in eager"
            )
    for k in KINDS:
        if (kind is None or k.name == kind) and _claims(k, graph, members):
            return k.analyze(graph, members)
    whose = f"the kind {kind}" if kind is not None else "no kernel kind"
    raise FusionRefused(f"{whose} takes the group {sorted(members)}")


@dataclass(frozen=True)
class KernelChoice:
    """A generated kernel of the kind named, under ``config`` (None: its default config);
    several kinds may claim one group."""

    kind: str
    config: Any = None


@dataclass(frozen=True)
class Offer:
    """One implementation of a group: ``family`` kernel / library / eager, ``choice`` what a
    plan is built from (a :class:`KernelChoice`, a :class:`LibraryCall` or :data:`EAGER`)."""

    family: str
    label: str
    choice: Any


EAGER = "eager"  # a group's choice: its ops run in eager, one step each


def offers(graph: Graph, group: frozenset[int]) -> tuple[Offer, ...]:
    """Every implementation of ``group``: each kind that claims it and accepts it, under each
    config of its space (its default first); each library call a provider offers; and eager
    (every op has eager semantics). "All claimers offer": a plan chooses among them."""
    members = frozenset(group)
    out: list[Offer] = []
    for kind in KINDS:
        if not _claims(kind, graph, members):
            continue
        try:
            info = kind.analyze(graph, members)
        except FusionRefused:
            continue
        default = kind.default_config(graph, info)
        space = kind.config_space(graph, info)
        for cfg in [default, *(c for c in space if c != default)]:
            label = f"{kind.name} kernel [{config_label(cfg)}]"
            out.append(Offer("kernel", label, KernelChoice(kind.name, cfg)))
    out += [Offer("library", c.label, c) for c in library_calls(graph, members)]
    out.append(Offer("eager", EAGER, EAGER))
    return tuple(out)


def proposed_groups(
    graph: Graph, members: frozenset[int], reach: dict[int, int]
) -> list[frozenset[int]]:
    """The candidate groups the kinds propose among ``members`` (see ``KernelKind``), in the
    kinds' order; not checked (the partitioner checks each)."""
    return [group for kind in KINDS for group in kind.proposals(graph, members, reach)]


def generate(graph: Graph, info: GroupInfo, config: Any, index: int = 0) -> Kernel:
    """Render the Triton source of ``info``'s group under ``config``."""
    kind = kind_of(info)
    kind.check_config(info, config)
    return kind.generate(graph, info, config, index)


def cost_facts(graph: Graph, info: GroupInfo, config: Any) -> LoopCost | TileCost:
    """What the kernel of ``info``'s group under ``config`` moves and computes, as its kind
    tells the cost model from the group and the config (no kernel rendered)."""
    kind = kind_of(info)
    kind.check_config(info, config)
    return kind.cost_facts(graph, info, config)


def check_config(info: GroupInfo, config: Any) -> None:
    kind_of(info).check_config(info, config)


def config_space(info: GroupInfo, graph: Graph | None = None) -> list[Any]:
    """The launch configs worth trying for this group (the search picks among them). GEMM
    kinds need the graph (their configs depend on the operand dtypes)."""
    return kind_of(info).config_space(graph, info)


def default_config(info: GroupInfo, graph: Graph | None = None) -> Any:
    """A heuristic config, used by the greedy plan before any tuning."""
    return kind_of(info).default_config(graph, info)


def quick_configs(info: GroupInfo, graph: Graph) -> list[Any]:
    """The configs an untuned plan on a GPU times for this group (the default first, each once);
    empty where the kind offers none besides its default."""
    kind = kind_of(info)
    offered = kind.quick_configs(graph, info)
    if not offered:
        return []
    return list(dict.fromkeys([kind.default_config(graph, info), *offered]))


def config_label(config: Any) -> str:
    return config.label() if hasattr(config, "label") else str(config)


def switches(config: Any) -> tuple[str, ...]:
    """The fields of ``config`` that the search and the polish switch on and off (its config
    class's ``SWITCHES``; none for a config of no kind)."""
    return tuple(getattr(type(config), "SWITCHES", ()))


def config_classes() -> dict[str, type]:
    """Config class name -> class, for every kind (the cache decodes configs by name)."""
    return {k.config_class.__name__: k.config_class for k in KINDS}
