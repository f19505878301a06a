"""Reports: what a plan launches, what it keeps in memory and how many bytes it moves."""

from __future__ import annotations

from dataclasses import dataclass

from autofuse.ir.conv_fold import bias_adds_of, is_convolution
from autofuse.kernels import INLINE_OPS, config_label, kind_of, rule_note
from autofuse.kernels.common.memory import nbytes
from autofuse.plan import EagerStep, KernelStep, LibraryStep, Plan


@dataclass(frozen=True)
class StepRow:
    name: str
    kind: str  # "poi" / "per" / "red" / "library" / "eager"
    ops: tuple[str, ...]
    reads: int  # tensors read from memory
    writes: int  # tensors written
    bytes_read: int
    bytes_written: int
    config: str
    time_s: float | None = None
    time_source: str | None = None  # "measured" | "modeled"


@dataclass(frozen=True)
class PlanSummary:
    label: str
    rows: tuple[StepRow, ...]
    intermediates: int  # buffers written and read back that the function does not return
    fallbacks: tuple[str, ...]
    convolutions: tuple[str, ...] = ()  # per convolution: how it runs (:func:`conv_notes`)
    # which implementation runs each group and why (``Step.describe``), one per step
    implementations: tuple[str, ...] = ()
    layouts: tuple[str, ...] = ()  # the plan's layout map (``Plan.layouts``), in words

    @property
    def launches(self) -> int:
        return len(self.rows)

    @property
    def memory_ops(self) -> int:
        return sum(r.reads + r.writes for r in self.rows)

    @property
    def bytes_total(self) -> int:
        return sum(r.bytes_read + r.bytes_written for r in self.rows)


def summarize(plan: Plan, times: dict[str, tuple[float, str]] | None = None) -> PlanSummary:
    g = plan.graph
    times = times or {}
    rows = []
    notes = conv_notes(plan)
    outputs = {g.base_of(o) for o in g.outputs}
    written: set[int] = set()
    for step in plan.steps:
        if isinstance(step, KernelStep):
            k = step.kernel
            reads = list(k.info.loads)
            writes = list(k.info.stored)
            kind = kind_of(k.info).prefix(k.info, k.config)
            ops = tuple(g[i].op for i in k.info.nodes)
            name, cfg = k.name, config_label(k.config)
        elif isinstance(step, LibraryStep):
            reads = [j for j in step.reads(g) if g[j].op not in INLINE_OPS]
            writes = [step.out]
            kind, name = "library", f"{step.implementation}_{g[step.out].name or step.out}"
            ops, cfg = tuple(g[i].op for i in step.nodes), step.implementation
        else:
            assert isinstance(step, EagerStep)
            reads = [j for j in g.compute_inputs(step.node) if g[j].op not in INLINE_OPS]
            writes = [step.node]
            kind, name = "eager", f"eager_{g[step.node].attr('target', g[step.node].op)}"
            ops, cfg = (g[step.node].op,), notes.get(step.node, step.reason)
        written.update(writes)
        t = times.get(name)
        rows.append(
            StepRow(
                name=name,
                kind=kind,
                ops=ops,
                reads=len(reads),
                writes=len(writes),
                bytes_read=sum(nbytes(g, i) for i in reads),
                bytes_written=sum(nbytes(g, i) for i in writes),
                config=cfg,
                time_s=t[0] if t else None,
                time_source=t[1] if t else None,
            )
        )
    intermediates = len([w for w in written if w not in outputs and g[w].op != "getitem"])
    fallbacks = tuple(
        f"{g[s.node].name}: {s.reason}"
        for s in plan.fallbacks
        if g[s.node].kind == "opaque" and s.node not in notes
    )
    convs = tuple(f"{g[i].name}: {note}" for i, note in notes.items())
    why = tuple(step.describe(g) for step in plan.steps)
    return PlanSummary(plan.label, tuple(rows), intermediates, fallbacks, convs, why,
                       layout_notes(plan))  # fmt: skip


def layout_notes(plan: Plan) -> tuple[str, ...]:
    """The plan's layout map in words: each buffer, its strides in the plan against eager's,
    and the steps that read it in that layout."""
    g = plan.graph
    readers: dict[int, list[str]] = {}
    for step in plan.steps:
        label = step.implementation
        for j in step.reads(g):
            readers.setdefault(g.base_of(j), []).append(label)
    return tuple(
        f"{g[i].name or i}: strides {list(mine)} (eager {list(eager)}), read by "
        + (", ".join(dict.fromkeys(readers.get(i, []))) or "nothing")
        for i, (mine, eager) in plan.layouts.items()
    )


def conv_notes(plan: Plan) -> dict[int, str]:
    """For each convolution of the plan: how it runs (the library call, or autofuse's
    implicit-GEMM kernel named, with the rule that chose it unmeasured, if one did) and what
    was done with it (its bias peeled into a named kernel or kept in the call, an inference
    BatchNorm folded into its weight by a named kernel)."""
    g = plan.graph
    owner = {n: s.kernel.name for s in plan.steps if isinstance(s, KernelStep) for n in s.nodes}
    notes = {}
    for step in plan.steps:
        if isinstance(step, EagerStep) and is_convolution(g[step.node]):
            notes[step.node] = "; ".join(_conv_parts(g, step.node, owner, None))
        elif isinstance(step, KernelStep):  # a kernel whose product is a convolution
            convs = [i for i in step.kernel.info.matmuls if is_convolution(g[i])]
            for conv in convs:
                notes[conv] = "; ".join(_conv_parts(g, conv, owner, step.kernel))
    return notes


def _conv_parts(g, conv: int, owner: dict[int, str], kernel) -> list[str]:
    node = g[conv]
    if kernel is None:
        parts = ["library call (cuDNN on GPU)"]
    else:
        why = rule_note(g, kernel.info)
        parts = [f"autofuse implicit-GEMM kernel {kernel.name}" + (f" ({why})" if why else "")]
    adds = bias_adds_of(g, conv)
    if len(node.inputs) >= 3:
        parts.append("bias in the call")
    elif adds:
        kernels = ", ".join(dict.fromkeys(owner.get(a, "eager") for a in adds))
        parts.append(f"bias peeled into kernel{'s' if ',' in kernels else ''} {kernels}")
    else:
        parts.append("no bias in the call")
    parts += _layout_parts(node, kernel)
    if node.attr("folded") == "batchnorm":
        weight = g.base_of(node.inputs[1])
        parts.append(f"BatchNorm folded into its weight (kernel {owner.get(weight, 'eager')})")
    return parts


def _layout_parts(node, kernel) -> list[str]:
    """A convolution's layout and why (measured alone, the whole plan timed, or forced)."""
    layout, times = node.attr("layout"), node.attr("layout_us")
    if not layout:
        return []
    if node.attr("layout_by") == "plan":
        alone = (
            f"; alone {times[0]:g} us contiguous, {times[1]:g} us channels-last" if times else ""
        )
        part = f"{layout} (the plan with every convolution so timed faster end to end{alone})"
    elif times:
        part = f"{layout} (measured {times[0]:g} us contiguous, {times[1]:g} us channels-last)"
    else:
        part = f"{layout} (AUTOFUSE_CONV_LAYOUT)"
    if kernel is not None:
        part += " for the library call; the kernel reads its operands in place"
    parts = [part]
    if node.attr("eager_strides"):
        parts.append("result kept channels-last for the kernels that read it")
    return parts


def _mb(b: int) -> str:
    return f"{b / 1e6:.3f} MB" if b >= 1e5 else f"{b} B"


def format_summary(s: PlanSummary) -> str:
    head = f"{'kernel':<52} {'reads':>5} {'writes':>6} {'bytes read':>12} {'bytes written':>14}  config / time"
    lines = [f"[{s.label}]", head, "-" * len(head)]
    for r in s.rows:
        t = ""
        if r.time_s is not None:
            t = f"  {r.time_s * 1e6:.2f} us ({r.time_source})"
        lines.append(
            f"{r.name:<52} {r.reads:>5} {r.writes:>6} {_mb(r.bytes_read):>12} "
            f"{_mb(r.bytes_written):>14}  {r.config}{t}"
        )
    lines.append(
        f"total: {s.launches} launches, {s.intermediates} intermediate buffers, "
        f"{s.memory_ops} memory ops, {_mb(s.bytes_total)} moved"
    )
    if s.implementations:
        lines.append("implementations:")
        lines += [f"  {why}" for why in s.implementations]
    return "\n".join(lines)


@dataclass(frozen=True)
class Explanation:
    """``autofuse.explain``: the unfused plan (one kernel per op) against the fused one."""

    unfused: PlanSummary
    fused: PlanSummary
    refusals: tuple[str, ...]
    fused_plan: Plan

    @property
    def launches(self) -> tuple[int, int]:
        return self.unfused.launches, self.fused.launches

    @property
    def memory_ops(self) -> tuple[int, int]:
        return self.unfused.memory_ops, self.fused.memory_ops

    @property
    def intermediates_removed(self) -> int:
        return self.unfused.intermediates - self.fused.intermediates

    def __str__(self) -> str:
        u, f = self.unfused, self.fused
        parts = [
            format_summary(u),
            "",
            format_summary(f),
            "",
            f"kernel launches: {u.launches} -> {f.launches}",
            f"intermediate buffers: {u.intermediates} -> {f.intermediates} "
            f"({self.intermediates_removed} removed)",
            f"memory ops: {u.memory_ops} -> {f.memory_ops}",
            f"bytes moved: {_mb(u.bytes_total)} -> {_mb(f.bytes_total)}",
        ]
        if f.convolutions:
            parts.append("convolutions:")
            parts += [f"  - {c}" for c in f.convolutions]
        if f.layouts:
            parts.append("layouts (buffers not in eager's strides):")
            parts += [f"  - {c}" for c in f.layouts]
        if f.fallbacks:
            parts.append("runs in eager (fallback): " + "; ".join(f.fallbacks))
        if self.refusals:
            parts.append("fusions refused:")
            parts += [f"  - {r}" for r in self.refusals]
        return "\n".join(parts)
