"""What a kernel costs, told by its kind: the facts the analytical cost model
(``measure/cost_model.py``) prices, so the model reads no kind name and no config field.

Two shapes of kernel: a *loop* kernel (programs walking rows, a step of a row at a time:
pointwise, reduction, scan, scatter, the row GEMM, the attention backward), priced by its
bytes and CUDA-core flops under an occupancy estimate, and a *tiled product* (a GEMM, the
attention forward), priced by its tensor-core flops at a tile efficiency, its shared memory
and its DRAM and L2 traffic. Each kind's ``cost_facts`` gives one of the two records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autofuse.ir.graph import Graph, numel
from autofuse.ir.ops import op_def
from autofuse.kernels.common.base import GroupInfo, ProposesNone
from autofuse.kernels.common.memory import nbytes
from autofuse.kernels.common.reads import loop_reads


@dataclass(frozen=True)
class LoopCost:
    """A loop kernel: ``bytes`` moved (each load counted once per pass that reads it),
    ``programs`` launched, ``steps`` each walks (1 unless the row is looped), ``threads`` per
    program, ``elems`` per program and step, ``live`` values per element, ``wide`` (64-bit
    values), ``flops`` on CUDA cores and ``mma_flops`` on tensor cores (a row GEMM's products)."""

    bytes: int
    programs: int
    steps: int
    threads: int
    elems: int
    live: int
    wide: bool
    flops: float
    mma_flops: float = 0.0


@dataclass(frozen=True)
class TileCost:
    """A tiled product: ``programs`` (output tiles) of ``warps`` warps taking ``smem`` bytes of
    shared memory; ``mma_flops`` at the tensor-core rate where ``tensor_cores`` (16-bit
    operands; else the CUDA-core rate) at the product of ``efficiency`` (tile size, padding),
    ``core_ops`` on CUDA cores beside them; ``dram`` and ``l2`` bytes. ``quantized``: the
    tiles' last wave lowers the compute efficiency (a GEMM), else each wave costs a program's
    overhead."""

    programs: int
    warps: int
    smem: int
    mma_flops: float
    tensor_cores: bool
    efficiency: tuple[float, ...]
    core_ops: float
    dram: int
    l2: float
    quantized: bool


def loop_cost(
    g: Graph,
    info: GroupInfo,
    reads: tuple[tuple[int, ...], int],
    xblock: int,
    rblock: int,
    warps: int,
) -> LoopCost:
    """The facts of a loop kernel of ``xblock`` rows by ``rblock`` columns per step, whose
    ``reads`` are (the times it reads each load, its ``tl.dot`` calls per column tile:
    ``common/reads.py``)."""
    red = info.reduces
    looped = red and rblock < info.rnumel
    passes, dots = reads
    passes = passes or (1,) * len(info.loads)
    bytes_in = sum(nbytes(g, j) * p for j, p in zip(info.loads, passes))
    bytes_out = sum(nbytes(g, s) for s in info.stored)
    steps = max(1, -(-info.rnumel // rblock)) * max(passes, default=1) if looped else 1
    flops = 0.0
    for m in info.nodes:
        node = g[m]
        size = numel(g[node.inputs[0]].shape) if node.kind == "reduction" else numel(node.shape)
        flops += size * op_def(node.op).cost
    flops *= max(passes, default=1) if looped else 1
    mma_flops = 0.0
    if info.matmuls:  # a row-GEMM recomputes its product in every pass over the row
        mm = g[info.matmuls[0]]
        mma_flops = 2.0 * numel(mm.shape) * g[mm.inputs[0]].shape[-1] * (dots or 1)
    return LoopCost(
        bytes=bytes_in + bytes_out,
        programs=max(1, -(-info.xnumel // xblock)),
        steps=steps,
        threads=32 * warps,
        elems=xblock * (rblock if red else 1),
        live=min(2 + len(info.loads) + (2 if red else 0), 8),
        wide=any(g[j].dtype in ("float64", "int64") for j in info.nodes),
        flops=flops,
        mma_flops=mma_flops,
    )


class LoopKind(ProposesNone):
    """For a loop kind whose config holds ``XBLOCK`` rows by ``RBLOCK`` columns a step: its
    kernels' cost facts (and no proposed group)."""

    def reads(self, graph: Graph, info: GroupInfo, config: Any) -> tuple[tuple[int, ...], int]:
        """(the times its kernel under ``config`` reads each load, its dots per tile)."""
        return loop_reads(graph, info, config.RBLOCK)

    def cost_facts(self, graph: Graph, info: GroupInfo, config: Any) -> LoopCost:
        reads = self.reads(graph, info, config)
        return loop_cost(graph, info, reads, config.XBLOCK, config.RBLOCK, config.num_warps)
