"""The measurement layer: what one candidate kernel costs, and whether it is correct.

The search sees one call, ``measurer.measure(candidate) -> Measurement``. A :class:`Candidate`
is one fusion group of a graph under one launch config. Implementations:

- :class:`GPUTimer`: verifies the kernel on CUDA against a float64 eager reference, then times it
  with ``triton.testing.do_bench`` (median; L2 flushed between runs, inputs rotated when they
  would fit in L2). ``source="measured"``.
- :class:`CostModel`: an analytical *model* (bytes / bandwidth, flops / rate, occupancy and
  wave penalties, launch overhead), optionally verifying on CPU through Triton's interpreter.
  ``source="modeled"``: its figures are estimates, never measurements.
- :class:`Memo`: measures each structurally distinct candidate once.
- :class:`Isolated`: runs another measurer in a spawned worker process with a timeout, so a
  hanging kernel or one that kills its process (segfault, illegal memory access) scores as a
  failure and the search goes on.

A candidate's ``key`` is structural: :func:`extract_subgraph` cuts the group out of its graph
as a standalone graph (inputs = the buffers the kernel loads), so the same subgraph at other node
ids, in other layers or in other partitions has the same key and is measured once.

Fault injection (tests): ``Candidate.source_override`` replaces the generated kernel source. The
override must take the generated kernel's arguments (same loads, stores, sizes and constexprs);
its last ``@triton.jit`` function is the one launched.
"""

from __future__ import annotations

import hashlib
import math
import multiprocessing
import os
import re
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

import torch

from autofuse import logs
from autofuse.interpreter import interpreting
from autofuse.ir.eager import eval_node
from autofuse.ir.graph import FLOAT_DTYPES, Graph, Node, contiguous_strides, make_attrs, numel
from autofuse.kernels.codegen import INLINE_OPS, GroupInfo, Kernel, generate
from autofuse.report import nbytes

# ---------------------------------------------------------------------------------------------
# Candidates and their structural key
# ---------------------------------------------------------------------------------------------


def _extract(
    graph: Graph, members: Iterable[int], loads: Sequence[int], stored: Sequence[int]
) -> tuple[Graph, dict[int, int]]:
    """Cut ``members`` out of ``graph``: inputs = ``loads``, then the members and the view /
    const nodes they read, in their original order; outputs = ``stored``. Returns the graph and
    the map from old node ids to new ones."""
    member_set, load_set = set(members), set(loads)
    keep: set[int] = set()

    def visit(j: int) -> None:
        if j in keep or j in load_set or j in member_set:
            return
        node = graph[j]
        if node.kind == "view":
            keep.add(j)
            visit(node.inputs[0])
        elif node.op in INLINE_OPS:
            keep.add(j)
        else:
            raise ValueError(
                f"node %{j} ({node.op}) is read by the group but is neither loaded, a member, "
                "a view nor a constant"
            )

    for m in member_set:
        for j in graph[m].inputs:
            visit(j)
    nodes: list[Node] = []
    remap: dict[int, int] = {}
    for k, j in enumerate(loads):
        n = graph[j]
        # the runtime materializes every non-input buffer contiguously before a kernel reads it
        strides = n.strides if n.kind == "input" else contiguous_strides(n.shape)
        nodes.append(Node("input", (), n.shape, n.dtype, strides, make_attrs(index=k), n.name))
        remap[j] = k
    for j in sorted(keep | member_set):
        n = graph[j]
        nodes.append(replace(n, inputs=tuple(remap[x] for x in n.inputs)))
        remap[j] = len(nodes) - 1
    sub = Graph(tuple(nodes), tuple(range(len(loads))), tuple(remap[s] for s in stored))
    return sub, remap


def extract_group(graph: Graph, info: GroupInfo) -> tuple[Graph, GroupInfo]:
    """The group as a standalone graph, with its :class:`GroupInfo` renumbered to match."""
    sub, remap = _extract(graph, info.nodes, info.loads, info.stored)
    sub_info = replace(
        info,
        nodes=tuple(remap[m] for m in info.nodes),
        stored=tuple(remap[s] for s in info.stored),
        loads=tuple(range(len(info.loads))),
        matmuls=tuple(remap[m] for m in info.matmuls),
    )
    return sub, sub_info


def extract_subgraph(graph: Graph, info: GroupInfo) -> Graph:
    """A standalone IR graph of the group: inputs = ``info.loads`` (as ``input`` nodes with their
    shape, dtype and strides; contiguous for a load of a non-input node, as the runtime
    materializes those), then the group's nodes and the view / const nodes they read, renumbered
    in order; outputs = ``info.stored``. Generating the kernel of the subgraph's whole group
    gives the same source as generating it in ``graph``."""
    return extract_group(graph, info)[0]


def eager_subgraph(graph: Graph, i: int) -> Graph:
    """Node ``i`` (an eager op) with the buffers it reads as a standalone graph."""
    loads = tuple(j for j in graph.compute_inputs(i) if graph[j].op not in INLINE_OPS)
    return _extract(graph, (i,), loads, (i,))[0]


@dataclass(frozen=True)
class Candidate:
    """One kernel to measure: a group of ``graph`` (``info`` from ``codegen.analyze_group``)
    under one launch config. ``source_override`` (tests, fault injection) is kernel source used
    instead of the generated one; it must take the generated kernel's arguments."""

    graph: Graph
    info: GroupInfo
    config: Any  # KernelConfig, or gemm_template.GemmConfig for GEMM groups
    source_override: str | None = None

    @cached_property
    def standalone_parts(self) -> tuple[Graph, GroupInfo]:
        return extract_group(self.graph, self.info)

    @cached_property
    def key(self) -> str:
        """Structural: the subgraph's key, the config and any source override."""
        sub, _ = self.standalone_parts
        h = hashlib.sha256()
        h.update(sub.key.encode())
        h.update(f"|{type(self.config).__name__}{self.config!r}".encode())
        if self.source_override is not None:
            h.update(b"|override:" + self.source_override.encode())
        return h.hexdigest()[:24]

    def standalone(self) -> Candidate:
        """The same candidate on its extracted subgraph (small to pickle, same key)."""
        sub, sub_info = self.standalone_parts
        if sub is self.graph:
            return self
        c = Candidate(sub, sub_info, self.config, self.source_override)
        c.__dict__["standalone_parts"] = (sub, sub_info)
        c.__dict__["key"] = self.key
        return c

    def label(self) -> str:
        cfg = self.config.label() if hasattr(self.config, "label") else str(self.config)
        ops = ",".join(self.graph[i].op for i in self.info.nodes)
        return f"[{ops}] {cfg}"


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    seconds: float | None  # None when failed
    failure: str | None  # why it failed: "compile/run error: ...", "wrong result: ...", ...
    source: str  # "measured" (GPU timer) or "modeled" (cost model)

    @property
    def ok(self) -> bool:
        return self.failure is None and self.seconds is not None

    @staticmethod
    def failed(reason: str, source: str) -> Measurement:
        return Measurement(None, reason, source)


@runtime_checkable
class Measurer(Protocol):
    def measure(self, candidate: Candidate) -> Measurement: ...


_CUDA_FATAL = (
    "cuda error",
    "illegal memory access",
    "illegal address",
    "cuda_error",
    "cudaerror",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction",
)


def is_fatal(reason: str | None) -> bool:
    """A CUDA error after which the process's CUDA context is unusable."""
    return reason is not None and any(k in reason.lower() for k in _CUDA_FATAL)


def describe_error(e: BaseException, limit: int = 300) -> str:
    """One line for a failed compile or launch: the error class and the telling line."""
    names = {c.__name__ for c in type(e).__mro__}
    msg = str(e)
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    telling = next((ln for ln in lines if is_fatal(ln)), None)
    if telling is None and lines:
        telling = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    text = telling or ""
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    if "OutOfResources" in names:
        return f"out of resources: {text}"
    if "OutOfMemoryError" in names:
        return f"out of memory: {text}"
    return f"compile/run error: {type(e).__name__}: {text}"


# ---------------------------------------------------------------------------------------------
# Kernels, inputs, reference, comparison
# ---------------------------------------------------------------------------------------------

_JIT_DEF = re.compile(r"^@triton\.jit\s*\n\s*def\s+(\w+)\s*\(", re.MULTILINE)


def build_kernel(candidate: Candidate) -> tuple[Graph, GroupInfo, Kernel]:
    """Generate the candidate's kernel on its standalone subgraph (or apply the override)."""
    sub, info = candidate.standalone_parts
    kernel = generate(sub, info, candidate.config)
    if candidate.source_override is not None:
        names = _JIT_DEF.findall(candidate.source_override)
        if not names:
            raise ValueError("source_override defines no @triton.jit function")
        kernel = replace(kernel, source=candidate.source_override, name=names[-1])
    return sub, info, kernel


def _torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _extent(shape: Sequence[int], strides: Sequence[int]) -> int:
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * abs(st) for s, st in zip(shape, strides))


def random_tensor(node: Node, device: Any, generator: torch.Generator) -> torch.Tensor:
    """Random values laid out with ``node``'s strides: floats N(0, 1), bools fair coins, ints
    small nonzero values (never all zeros, so a kernel that writes zeros cannot pass)."""
    dtype = _torch_dtype(node.dtype)
    n = _extent(node.shape, node.strides)
    kw = {"generator": generator, "device": device}
    if node.dtype in FLOAT_DTYPES:
        flat = torch.randn(n, dtype=dtype, **kw)
    elif node.dtype == "bool":
        flat = torch.rand(n, **kw) < 0.5
    else:
        mag = torch.randint(1, 8, (n,), dtype=torch.int64, **kw)
        if node.dtype != "uint8":
            mag = mag * (torch.randint(0, 2, (n,), dtype=torch.int64, **kw) * 2 - 1)
        flat = mag.to(dtype)
    return flat.as_strided(node.shape, node.strides)


def random_inputs(graph: Graph, device: Any = "cpu", seed: int = 0) -> list[torch.Tensor]:
    """Fresh random inputs for ``graph``'s input nodes, with their strides."""
    device = torch.device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return [random_tensor(graph[i], device, gen) for i in graph.inputs]


def poisoned_outputs(
    graph: Graph, info: GroupInfo, device: Any, flip: bool = False
) -> list[torch.Tensor]:
    """Output buffers filled with values a correct kernel overwrites: NaN for floats, an
    extreme value for ints, True for bools (False with ``flip``: a second run with the other
    poison catches unwritten bool elements)."""
    from autofuse.plan.runtime import allocate_outputs

    outs = allocate_outputs(graph, info, torch.device(device))
    for t in outs:
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype == torch.bool:
            t.fill_(not flip)
        else:
            ii = torch.iinfo(t.dtype)
            t.fill_(ii.min if ii.min < 0 and not flip else ii.max)
    return outs


def reference_outputs(
    graph: Graph, inputs: Sequence[torch.Tensor], device: Any = None
) -> list[torch.Tensor]:
    """Eager evaluation of ``graph`` in float64 wherever values are floating point.

    Inputs are upcast, every floating node is evaluated in float64, except that a ``cast`` to a
    floating type rounds through that type first (as the kernel does) and then goes back to
    float64."""
    if device is None:  # a subgraph without inputs (arange and friends) names its device
        device = inputs[0].device if inputs else torch.device("cpu")
    env: dict[int, Any] = {}
    for idx, x in zip(graph.inputs, inputs):
        env[idx] = x.double() if x.is_floating_point() else x
    for i, node in enumerate(graph.nodes):
        if i in env:
            continue
        args = [env[j] for j in node.inputs]
        if node.dtype in FLOAT_DTYPES:
            if node.op == "cast":
                v = eval_node(node, args, device).double()
            else:
                v = eval_node(replace(node, dtype="float64"), args, device)
        else:
            v = eval_node(node, args, device)
        env[i] = v
    return [env[j] for j in graph.outputs]


# (relative to max |ref|, absolute)
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-10),
    "float32": (1e-4, 1e-5),
    "float16": (5e-3, 1e-3),
    "bfloat16": (2e-2, 1e-2),
}


def tolerance_dtype(graph: Graph, info: GroupInfo) -> str | None:
    """The float dtype whose tolerance applies: the least precise of the stored outputs and of
    the casts inside the group (a value rounded to bf16 mid-kernel is only bf16-accurate)."""
    dts = [graph[s].dtype for s in info.stored]
    dts += [graph[m].attr("dtype") for m in info.nodes if graph[m].op == "cast"]
    floats = [d for d in dts if d in TOLERANCES]
    return max(floats, key=lambda d: TOLERANCES[d][0]) if floats else None


def compare(out: torch.Tensor, ref: torch.Tensor, dtype: str | None, k: int) -> str | None:
    """None when ``out`` matches the float64 reference ``ref`` within tolerance, else why."""
    if tuple(out.shape) != tuple(ref.shape):
        return f"wrong result: output {k} has shape {list(out.shape)}, expected {list(ref.shape)}"
    if not out.is_floating_point():
        ref = ref.to(out.dtype)
        if not torch.equal(out, ref):
            bad = int((out != ref).sum().item())
            return f"wrong result: {bad} of {out.numel()} elements differ on output {k} (exact)"
        return None
    rtol, atol = TOLERANCES.get(dtype or "", TOLERANCES["float32"])
    o, r = out.double(), ref.double()
    o_nan, r_nan = torch.isnan(o), torch.isnan(r)
    if not torch.equal(o_nan, r_nan):
        extra = int((o_nan & ~r_nan).sum().item())
        missing = int((r_nan & ~o_nan).sum().item())
        if extra:
            return (
                f"wrong result: NaN at {extra} positions where the reference has none on "
                f"output {k} (unwritten or invalid elements)"
            )
        return f"wrong result: {missing} values where the reference is NaN on output {k}"
    r_inf = torch.isinf(r)
    if not torch.equal(o[r_inf], r[r_inf]) or bool(torch.isinf(o[~r_inf & ~r_nan]).any()):
        return f"wrong result: infinities differ from the reference on output {k}"
    finite = torch.isfinite(r)
    if not bool(finite.any()):
        return None
    scale = r[finite].abs().max().item()
    err = (o[finite] - r[finite]).abs().max().item()
    if err > rtol * scale + atol:
        rel = err / (scale + 1e-30)
        return f"wrong result: max rel err {rel:.3g} > {rtol:g} on output {k}"
    return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def verify_candidate(candidate: Candidate, device: Any = "cpu", seed: int = 0) -> str | None:
    """Run the candidate's kernel on fresh random inputs and compare with the float64 eager
    reference. None when correct, else the reason. On CPU this needs ``TRITON_INTERPRET=1``."""
    device = torch.device(device)
    if device.type == "cpu" and not interpreting():
        return "cannot verify on CPU: set TRITON_INTERPRET=1 before triton is imported"
    from autofuse.plan.runtime import launch

    try:
        sub, info, kernel = build_kernel(candidate)
        inputs = random_inputs(sub, device, seed)
        runs = [poisoned_outputs(sub, info, device)]
        if any(sub[s].dtype == "bool" for s in info.stored):
            runs.append(poisoned_outputs(sub, info, device, flip=True))
        with warnings.catch_warnings():
            # the interpreter evaluates masked-off lanes too (inf - inf there is harmless)
            warnings.simplefilter("ignore", RuntimeWarning)
            for outs in runs:
                launch(kernel, [*inputs, *outs])
        _sync(device)
    except Exception as e:  # noqa: BLE001 - any failure to build or run is the candidate's
        return describe_error(e)
    try:
        refs = reference_outputs(sub, inputs, device)
        tol = tolerance_dtype(sub, info)
        for outs in runs:
            for k, (o, r) in enumerate(zip(outs, refs)):
                why = compare(o, r.to(o.device), tol, k)
                if why:
                    return why
    except Exception as e:  # noqa: BLE001 - a check that cannot run rejects the candidate
        return f"reference failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return None


# ---------------------------------------------------------------------------------------------
# The analytical cost model
# ---------------------------------------------------------------------------------------------

_SFU_OPS = frozenset(
    "exp exp2 log log2 log1p expm1 sqrt rsqrt reciprocal sigmoid tanh erf sin cos div "
    "pow_scalar".split()
)
_LOOP = re.compile(r"^(\s*)for roffset in range\(")
_LOAD = re.compile(r"tl\.load\(in_ptr(\d+)\b")


def load_passes(source: str, n_loads: int) -> list[int]:
    """How many times a reduction kernel reads each loaded buffer: once per ``for roffset``
    loop that loads it (a looped kernel recomputes each phase from its loads), once if it is
    only loaded outside loops."""
    regions: list[set[int]] = [set()]
    cur, loop_indent = 0, None
    for line in source.splitlines():
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if loop_indent is not None and stripped and indent <= loop_indent:
            cur, loop_indent = 0, None
        m = _LOOP.match(line)
        if m:
            regions.append(set())
            cur, loop_indent = len(regions) - 1, len(m.group(1))
            continue
        for lm in _LOAD.finditer(line):
            regions[cur].add(int(lm.group(1)))
    return [max(1, sum(k in r for r in regions)) for k in range(n_loads)]


@dataclass(frozen=True)
class CostModel:
    """An analytical *model* of a kernel's time on an H100/H200-class GPU; never a measurement.

    time = max(t_memory, t_compute) * spill_penalty + waves * program_cost + launch_overhead

    - t_memory = bytes / effective bandwidth. Bytes are the loads' and stores' sizes
      (``report.nbytes``); a looped reduction (RBLOCK < rnumel) counts each load once per loop
      that reads it. The effective bandwidth is ``bandwidth`` capped by Little's law: the bytes
      the resident programs have in flight per step, divided by ``latency``, and by the SMs that
      have a program (one SM draws at most ``sm_bandwidth_share`` times its fair share): few or
      tiny programs cannot saturate HBM.
    - t_compute = flops / (``flops_rate`` * thread utilisation); flops count each member op
      over its shape (transcendentals and divisions 4x). GEMM groups use ``mma_rate`` for
      16-bit operands, a tile-padding, tile-size and wave-quantization efficiency, and the
      smem limit (a config over it fails as out of resources).
    - Occupancy: resident programs per SM from warps (64 per SM), a block limit (32) and a
      register estimate (live values x elements per thread); over 255 registers per thread
      the kernel spills and is penalised proportionally.
    - waves * program_cost: per-program scheduling / index overhead, one ``program_cost`` per
      wave of resident programs.

    With ``verify=True`` each candidate is first checked by :func:`verify_candidate` (on CPU
    through Triton's interpreter when there is no GPU: use small shapes there).
    """

    bandwidth: float = 4.3e12  # achievable HBM bytes/s
    launch_overhead: float = 4e-6
    flops_rate: float = 5.0e13  # fp32 CUDA-core op/s
    mma_rate: float = 7.9e14  # bf16/fp16 tensor-core FLOP/s
    sm_count: int = 132
    latency: float = 8e-7  # DRAM round trip (s), for Little's law
    program_cost: float = 1.5e-7  # per wave of programs
    sm_bandwidth_share: float = 2.0  # one SM pulls at most 2x its fair share of bandwidth
    verify: bool = False
    device: str | None = None  # verification device; None: CUDA if present, else the CPU
    seed: int = 0

    source = "modeled"

    def measure(self, candidate: Candidate) -> Measurement:
        try:
            if self.verify:
                why = verify_candidate(candidate, self.verify_device(), self.seed)
                if why:
                    return Measurement.failed(why, "modeled")
            sub, info, kernel = build_kernel(candidate)
            seconds = self.kernel_time(sub, info, kernel)
        except Exception as e:  # noqa: BLE001
            return Measurement.failed(describe_error(e), "modeled")
        if isinstance(seconds, str):
            return Measurement.failed(seconds, "modeled")
        return Measurement(seconds, None, "modeled")

    def verify_device(self) -> str:
        if self.device:
            return self.device
        return "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"

    # -- pieces ------------------------------------------------------------------------------
    def kernel_time(self, g: Graph, info: GroupInfo, kernel: Kernel) -> float | str:
        if info.kind == "gemm":
            return self._gemm_time(g, info, kernel)
        cfg = kernel.config
        red = info.kind in ("reduction", "gemm_row")
        looped = red and cfg.RBLOCK < info.rnumel
        passes = load_passes(kernel.source, len(info.loads)) if looped else [1] * len(info.loads)
        bytes_in = sum(nbytes(g, j) * p for j, p in zip(info.loads, passes))
        bytes_out = sum(nbytes(g, s) for s in info.stored)
        total = bytes_in + bytes_out
        programs = max(1, -(-info.xnumel // cfg.XBLOCK))
        steps = max(1, -(-info.rnumel // cfg.RBLOCK)) * max(passes, default=1) if looped else 1
        threads = 32 * cfg.num_warps
        elems = cfg.XBLOCK * (cfg.RBLOCK if red else 1)  # elements per program per step
        per_thread = max(1.0, elems / threads)
        wide = any(g[j].dtype in ("float64", "int64") for j in info.nodes)
        live = min(2 + len(info.loads) + (2 if red else 0), 8)
        regs = 24 + live * per_thread * (2 if wide else 1)
        spill = max(1.0, regs / 255.0)
        regs = min(regs, 255.0)
        resident = max(1, min(32, 64 // cfg.num_warps, int(65536 // (regs * threads))))
        slots = self.sm_count * resident
        bytes_per_step = total / (programs * steps)
        in_flight = min(programs, slots) * bytes_per_step
        sm_cap = min(programs, self.sm_count) * self.sm_bandwidth_share * self.bandwidth
        eff_bw = max(1.0, min(self.bandwidth, sm_cap / self.sm_count, in_flight / self.latency))
        t_mem = total / eff_bw
        flops = 0.0
        for m in info.nodes:
            node = g[m]
            size = numel(g[node.inputs[0]].shape) if node.kind == "reduction" else numel(node.shape)
            flops += size * (4.0 if node.op in _SFU_OPS else 1.0)
        flops *= max(passes, default=1) if looped else 1
        util = min(1.0, elems / threads)
        t_cmp = flops / (self.flops_rate * util)
        if info.kind == "gemm_row":  # the product is recomputed in every pass over the row
            mm = g[info.matmuls[0]]
            mm_flops = 2.0 * numel(mm.shape) * g[mm.inputs[0]].shape[-1]
            t_cmp += mm_flops * (kernel.source.count("tl.dot(") or 1) / self.mma_rate
        waves = math.ceil(programs / slots)
        return max(t_mem, t_cmp) * spill + waves * self.program_cost + self.launch_overhead

    def _gemm_time(self, g: Graph, info: GroupInfo, kernel: Kernel) -> float | str:
        from autofuse.kernels.gemm_template import HOPPER_SMEM_BYTES

        cfg = kernel.config
        mm = g[info.matmuls[0]]
        a = g[mm.inputs[0]]
        batch = info.domain[0] if len(info.domain) == 3 else 1
        m, n, k = info.domain[-2], info.domain[-1], a.shape[-1]
        item = 2 if a.dtype in ("bfloat16", "float16") else 4
        smem = cfg.smem_bytes(item, len(info.matmuls))
        if smem > HOPPER_SMEM_BYTES:
            return f"out of resources: shared memory {smem} > {HOPPER_SMEM_BYTES} (modeled)"
        tm, tn = -(-m // cfg.BLOCK_M), -(-n // cfg.BLOCK_N)
        tiles = batch * tm * tn
        resident = max(1, min(64 // cfg.num_warps, HOPPER_SMEM_BYTES // max(smem, 1), 32))
        slots = self.sm_count * resident
        waves = math.ceil(tiles / slots)
        wave_eff = tiles / (waves * slots) if tiles < slots * 4 else 1.0
        pad_eff = (m * n) / (tm * cfg.BLOCK_M * tn * cfg.BLOCK_N)
        tile_eff = min(1.0, (cfg.BLOCK_M * cfg.BLOCK_N) / (128 * 128)) ** 0.5
        k_eff = min(1.0, cfg.BLOCK_K / 32) ** 0.5
        rate = self.mma_rate if item == 2 else self.flops_rate
        flops = 2.0 * batch * m * n * k * len(info.matmuls)
        eff = max(1e-3, wave_eff * pad_eff * tile_eff * k_eff)
        t_cmp = flops / (rate * eff)
        dram = sum(nbytes(g, j) for j in info.loads) + sum(nbytes(g, s) for s in info.stored)
        l2 = nbytes(g, g.base_of(mm.inputs[0])) * tn + nbytes(g, g.base_of(mm.inputs[1])) * tm
        t_mem = max(dram / self.bandwidth, l2 / (3 * self.bandwidth))
        return max(t_cmp, t_mem) + self.launch_overhead

    def eager_time(self, graph: Graph, i: int) -> float:
        """Modeled time of one eager op (bytes moved, matmul flops at ``mma_rate``)."""
        node = graph[i]
        moved = sum(nbytes(graph, j) for j in graph.compute_inputs(i)) + nbytes(graph, i)
        flops = 0.0
        if node.kind == "matmul":
            a = graph[node.inputs[0]].shape
            flops = 2.0 * a[-2] * a[-1] * node.shape[-1] * (a[0] if len(a) == 3 else 1)
        return max(moved / self.bandwidth, flops / self.mma_rate) + self.launch_overhead


# ---------------------------------------------------------------------------------------------
# Timing on the GPU
# ---------------------------------------------------------------------------------------------


def _bench_ms(fn: Callable[[], Any], warmup_ms: float, rep_ms: float, flush_l2: bool) -> float:
    """Median milliseconds of ``fn()`` on CUDA: triton's do_bench (which clears L2 before each
    timed run), or, without the flush, the same method on CUDA events."""
    if flush_l2:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(min(10000, max(1, int(warmup_ms / est)))):
        fn()
    n = min(10000, max(1, int(rep_ms / est)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def _bench_cpu_ms(fn: Callable[[], Any], warmup_ms: float, rep_ms: float) -> float:
    t0 = time.perf_counter()
    fn()
    est = max((time.perf_counter() - t0) * 1e3, 1e-3)
    for _ in range(min(100, max(1, int(warmup_ms / est)))):
        fn()
    times = []
    for _ in range(min(1000, max(3, int(rep_ms / est)))):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def time_callable(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    warmup_ms: float = 25,
    rep_ms: float = 100,
    flush_l2: bool = True,
) -> float:
    """Seconds per call of ``fn(*args)`` (median, under no_grad): do_bench on CUDA, the same for
    eager and torch.compile baselines as for plans. Without CUDA, the wall-clock median of the
    CPU calls (a CPU time, not comparable with GPU figures)."""
    args = tuple(args)

    def call() -> Any:
        return fn(*args)

    with torch.no_grad():
        if torch.cuda.is_available():
            return _bench_ms(call, warmup_ms, rep_ms, flush_l2) * 1e-3
        return _bench_cpu_ms(call, warmup_ms, rep_ms) * 1e-3


def time_plan(
    plan: Any, inputs: Sequence[torch.Tensor], warmup_ms: float = 25, rep_ms: float = 100
) -> float:
    """End-to-end seconds of ``runtime.execute(plan, inputs)`` (median), as time_callable."""
    from autofuse.plan.runtime import execute

    inputs = list(inputs)
    return time_callable(lambda: execute(plan, inputs), (), warmup_ms, rep_ms)


def l2_cache_bytes(device: Any = None) -> int:
    try:
        props = torch.cuda.get_device_properties(device if device is not None else 0)
        return int(getattr(props, "L2_cache_size", 0)) or 50 * 2**20
    except Exception:  # noqa: BLE001
        return 50 * 2**20


@dataclass
class GPUTimer:
    """Measures candidates on CUDA: verify (fresh random inputs, float64 eager reference), then
    the median of ``do_bench`` over the kernel launch alone. When the buffers are under ~2x the
    L2 size, launches rotate among several input/output sets so consecutive runs do not find
    them in cache. Compile errors, out-of-resources and wrong results are failures."""

    warmup_ms: float = 25
    rep_ms: float = 100
    verify: bool = True
    flush_l2: bool = True
    rotate: bool = True
    seed: int = 0
    max_sets: int = 16
    device: str = "cuda"

    source = "measured"

    def measure(self, candidate: Candidate) -> Measurement:
        if not torch.cuda.is_available():
            return Measurement.failed("no CUDA device: GPUTimer needs a GPU", "measured")
        device = torch.device(self.device)
        if self.verify:
            why = verify_candidate(candidate, device, self.seed)
            if why:
                return Measurement.failed(why, "measured")
        from autofuse.plan.runtime import kernel_args, launcher_for

        try:
            sub, info, kernel = build_kernel(candidate)
            sets = self._buffer_sets(sub, info, device)
            calls = [kernel_args(kernel, bufs) for bufs in sets]
            launch = launcher_for(kernel)  # launched as plans launch it
            for pos in calls:  # compiles on the first launch
                launch(pos)
            torch.cuda.synchronize(device)
            state = [0]

            def run() -> None:
                pos = calls[state[0]]
                state[0] = (state[0] + 1) % len(calls)
                launch(pos)

            ms = _bench_ms(run, self.warmup_ms, self.rep_ms, self.flush_l2)
        except Exception as e:  # noqa: BLE001
            return Measurement.failed(describe_error(e), "measured")
        if not (ms > 0 and math.isfinite(ms)):
            return Measurement.failed(f"timer returned {ms!r} ms", "measured")
        return Measurement(ms * 1e-3, None, "measured")

    def _buffer_sets(self, sub: Graph, info: GroupInfo, device) -> list[list[torch.Tensor]]:
        size = sum(nbytes(sub, j) for j in info.loads) + sum(nbytes(sub, s) for s in info.stored)
        n = 1
        l2 = l2_cache_bytes(device)
        if self.rotate and size < 2 * l2:
            n = max(2, min(self.max_sets, math.ceil(4 * l2 / max(size, 1))))
        out = []
        for k in range(n):
            ins = random_inputs(sub, device, self.seed + 1 + k)
            outs = poisoned_outputs(sub, info, device)
            out.append([*ins, *outs])
        return out

    def eager_time(self, graph: Graph, i: int) -> float:
        """Measured time of eager op ``i`` on random inputs (integer inputs are zeros here, so
        index-like arguments stay in range); falls back to the model if it cannot run."""
        try:
            return self.eager_time_of(eager_subgraph(graph, i))
        except Exception as e:  # noqa: BLE001
            logs.log.warning("eager op %%%d could not be timed (%s): modeled", i, describe_error(e))
            return CostModel().eager_time(graph, i)

    def eager_time_of(self, sub: Graph) -> float:
        from autofuse.ir.eager import run_graph

        device = torch.device(self.device)
        ins = random_inputs(sub, device, self.seed)
        ins = [x if x.is_floating_point() else torch.zeros_like(x) for x in ins]
        run_graph(sub, ins)
        torch.cuda.synchronize(device)
        return time_callable(run_graph, (sub, ins), self.warmup_ms, self.rep_ms, self.flush_l2)


# ---------------------------------------------------------------------------------------------
# Memoization
# ---------------------------------------------------------------------------------------------


@dataclass
class Memo:
    """Measures each structurally distinct candidate once (by ``candidate.key``); failures are
    remembered too. ``calls``: inner measurements; ``hits``: answers from the memo."""

    inner: Any
    cache: dict[str, Measurement] = field(default_factory=dict)
    calls: int = 0
    hits: int = 0

    @property
    def source(self) -> str:
        return getattr(self.inner, "source", "measured")

    def measure(self, candidate: Candidate) -> Measurement:
        key = candidate.key
        hit = self.cache.get(key)
        if hit is not None:
            self.hits += 1
            return hit
        self.calls += 1
        m = self.inner.measure(candidate)
        self.cache[key] = m
        return m


# ---------------------------------------------------------------------------------------------
# Isolation in a worker process
# ---------------------------------------------------------------------------------------------


def _spec_source(spec: Any) -> str:
    if isinstance(spec, tuple) and spec and isinstance(spec[0], str):
        return "modeled" if spec[0] == "cost_model" else "measured"
    return getattr(spec, "source", "measured")


def _child_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if k.startswith("AUTOFUSE_") or k == "TRITON_INTERPRET" or k == "CUDA_VISIBLE_DEVICES"
    }


class Isolated:
    """Runs an inner measurer in a worker process (``spawn``: fresh CUDA state).

    ``inner_spec`` is how the worker builds it: ``("cost_model", kwargs)``, ``("gpu", kwargs)``,
    ``("package.module:factory", kwargs)``, or a picklable measurer object. A job that runs
    past ``timeout_s`` (counted from when the worker received it) gets its worker killed and
    scores ``"timeout after N s"``; a worker that dies mid-job scores ``"worker died: exit code
    ..."``. Either way the next job starts a fresh worker. After a CUDA error the worker reports
    it and exits, since its CUDA context is unusable.
    """

    def __init__(self, inner_spec: Any, timeout_s: float = 60, start_timeout_s: float = 300):
        from autofuse.measure import worker as _worker

        _worker.check_spec(inner_spec)
        self.spec = inner_spec
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.source = _spec_source(inner_spec)
        self.restarts = 0  # workers started after the first
        self._timed_out = False
        self._starts = 0
        self._proc: Any = None
        self._conn: Any = None
        self._job = 0

    # -- worker lifecycle --------------------------------------------------------------------
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def start(self) -> None:
        """Start the worker (if none is running) and wait until it is ready for jobs."""
        if self.alive():
            return
        if self._proc is not None:
            self._discard()
        if self._starts:
            self.restarts += 1
        self._starts += 1
        from autofuse.measure import worker as _worker

        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=_worker.main, args=(child, self.spec, _child_env()), daemon=True)
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent
        msg = self._recv(self.start_timeout_s)
        if msg is None or msg[0] != "ready":
            why = self._death_reason() if msg is None else msg[1]
            self._discard()
            raise RuntimeError(f"measurement worker failed to start: {why}")

    def close(self) -> None:
        if self._proc is None:
            return
        try:
            if self._proc.is_alive():
                self._conn.send(("stop",))
                self._proc.join(5)
        except Exception:  # noqa: BLE001
            pass
        self._discard()

    def __enter__(self) -> Isolated:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def _discard(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if proc is not None and proc.is_alive():
            proc.kill()
        if proc is not None:
            proc.join(10)
        if conn is not None:
            conn.close()

    def _death_reason(self) -> str:
        proc = self._proc
        if proc is None:
            return "worker died"
        proc.join(2)
        code = proc.exitcode
        if code is None:
            return "worker stopped answering"
        if code < 0:
            try:
                import signal

                return f"worker died: exit code {code} ({signal.Signals(-code).name})"
            except ValueError:
                pass
        return f"worker died: exit code {code}"

    def _recv(self, timeout: float) -> tuple | None:
        """The next message, or None when the worker died or ``timeout`` passed (then
        ``self._timed_out`` is set)."""
        self._timed_out = False
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._timed_out = True
                return None
            try:
                if self._conn.poll(min(left, 0.2)):
                    return self._conn.recv()
            except (EOFError, OSError):
                return None
            if not self._proc.is_alive() and not self._conn.poll(0):
                return None

    # -- jobs --------------------------------------------------------------------------------
    def _run(self, kind: str, payload: Any) -> tuple[Any, str | None]:
        """(result, None) or (None, failure reason)."""
        try:
            self.start()
        except RuntimeError as e:
            return None, str(e)
        self._job += 1
        job = self._job
        try:
            self._conn.send((kind, job, payload))
        except (BrokenPipeError, OSError):
            self._discard()
            return None, "worker died: the job could not be sent"
        msg = self._recv(self.start_timeout_s)
        if msg is None or msg[0] != "started":
            why = self._death_reason() if msg is None else f"unexpected worker message {msg[0]}"
            self._discard()
            return None, why
        while True:
            msg = self._recv(self.timeout_s)
            if msg is None:
                why = (
                    f"timeout after {self.timeout_s:g} s"
                    if self._timed_out
                    else self._death_reason()
                )
                self._discard()
                return None, why
            if msg[0] == "result" and msg[1] == job:
                return msg[2], None

    def measure(self, candidate: Candidate) -> Measurement:
        result, why = self._run("measure", candidate.standalone())
        if why is not None:
            return Measurement.failed(why, self.source)
        return result

    def eager_time(self, graph: Graph, i: int) -> float:
        """Time of eager op ``i`` from the inner measurer (modeled if it has none)."""
        result, why = self._run("eager", eager_subgraph(graph, i))
        if why is not None or not isinstance(result, float):
            logs.log.warning("eager op %%%d not timed in the worker (%s): modeled", i, why)
            return CostModel().eager_time(graph, i)
        return result
