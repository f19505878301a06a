"""The analytical cost model: an estimate of a kernel's time from its group and its config
(bytes, flops, occupancy), with no kernel rendered; every figure it gives is *modeled*, never
measured."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from autofuse.interpreter import interpreting
from autofuse.ir.graph import Graph
from autofuse.kernels import GroupInfo, cost_facts
from autofuse.kernels.common.cost import LoopCost, TileCost
from autofuse.measure.candidate import (
    Candidate,
    Measurement,
    describe_error,
)
from autofuse.measure.verify import verify_candidate
from autofuse.report import nbytes
from autofuse.settings import HOPPER

# ---------------------------------------------------------------------------------------------
# The analytical cost model
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CostModel:
    """An analytical *model* of a kernel's time on an H100/H200-class GPU; never a measurement.

    Each kernel's kind tells what it moves and computes (``kernels.cost_facts``), from the
    group and the config alone (pricing renders no kernel): a loop kernel (``LoopCost``) or a
    tiled product (``TileCost``); this model prices the facts and names no kind.

    Loop kernels: time = max(t_memory, t_compute) * spill_penalty + waves * program_cost +
    launch_overhead.

    - t_memory = bytes / effective bandwidth. Bytes are the loads' and stores' sizes; a kernel
      that walks a row in several steps counts each load once per pass that reads it. The
      effective bandwidth is ``bandwidth`` capped by Little's law: the bytes the resident
      programs have in flight per step, divided by ``latency``, and by the SMs that have a
      program (one SM draws at most ``sm_bandwidth_share`` times its fair share): few or tiny
      programs cannot saturate HBM.
    - t_compute = flops / (``flops_rate`` * thread utilisation); flops count each member op
      over its shape (transcendentals and divisions 4x); tensor-core flops at ``mma_rate``.
    - Occupancy: resident programs per SM from warps (64 per SM), a block limit (32) and a
      register estimate (live values x elements per thread); over 255 registers per thread
      the kernel spills and is penalised proportionally.
    - waves * program_cost: per-program scheduling / index overhead, one ``program_cost`` per
      wave of resident programs.

    Tiled products: the product's flops at ``mma_rate`` for 16-bit operands (else
    ``flops_rate``) at the kind's tile efficiency (and, where the facts say so, the last
    wave's), beside their CUDA-core work; DRAM and L2 traffic; the shared memory limit (a
    config over it fails as out of resources).

    With ``verify=True`` each candidate is first checked by :func:`verify_candidate` (on CPU
    through Triton's interpreter when there is no GPU: use small shapes there).
    """

    bandwidth: float = 4.3e12  # achievable HBM bytes/s
    launch_overhead: float = 4e-6
    flops_rate: float = 5.0e13  # fp32 CUDA-core op/s
    mma_rate: float = 7.9e14  # bf16/fp16 tensor-core FLOP/s
    sm_count: int = HOPPER.sm_count
    latency: float = 8e-7  # DRAM round trip (s), for Little's law
    program_cost: float = 1.5e-7  # per wave of programs
    sm_bandwidth_share: float = 2.0  # one SM pulls at most 2x its fair share of bandwidth
    smem_bytes: int = HOPPER.smem_bytes  # shared memory per block (H100/H200: 227 KiB)
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
            sub, info = candidate.standalone_parts
            seconds = self.kernel_time(sub, info, candidate.config)
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
    def kernel_time(self, g: Graph, info: GroupInfo, config: Any) -> float | str:
        """The modeled seconds of the kernel of ``info``'s group under ``config``, or why it
        fails (out of shared memory)."""
        facts = cost_facts(g, info, config)
        if isinstance(facts, TileCost):
            return self._tile_time(facts)
        return self._loop_time(facts)

    def _loop_time(self, f: LoopCost) -> float:
        per_thread = max(1.0, f.elems / f.threads)
        regs = 24 + f.live * per_thread * (2 if f.wide else 1)
        spill = max(1.0, regs / 255.0)
        regs = min(regs, 255.0)
        resident = max(1, min(32, 64 // (f.threads // 32), int(65536 // (regs * f.threads))))
        slots = self.sm_count * resident
        bytes_per_step = f.bytes / (f.programs * f.steps)
        in_flight = min(f.programs, slots) * bytes_per_step
        sm_cap = min(f.programs, self.sm_count) * self.sm_bandwidth_share * self.bandwidth
        eff_bw = max(1.0, min(self.bandwidth, sm_cap / self.sm_count, in_flight / self.latency))
        t_mem = f.bytes / eff_bw
        util = min(1.0, f.elems / f.threads)
        t_cmp = f.flops / (self.flops_rate * util)
        t_cmp += f.mma_flops / self.mma_rate
        waves = math.ceil(f.programs / slots)
        return max(t_mem, t_cmp) * spill + waves * self.program_cost + self.launch_overhead

    def _tile_time(self, f: TileCost) -> float | str:
        if f.smem > self.smem_bytes:
            return f"out of resources: shared memory {f.smem} > {self.smem_bytes} (modeled)"
        resident = max(1, min(64 // f.warps, self.smem_bytes // max(f.smem, 1), 32))
        slots = self.sm_count * resident
        waves = math.ceil(f.programs / slots)
        eff = 1.0
        if f.quantized:  # the last wave's idle slots lower the efficiency
            eff = f.programs / (waves * slots) if f.programs < slots * 4 else 1.0
        for factor in f.efficiency:
            eff *= factor
        rate = self.mma_rate if f.tensor_cores else self.flops_rate
        t_cmp = f.mma_flops / (rate * max(1e-3, eff)) + f.core_ops / self.flops_rate
        t_mem = max(f.dram / self.bandwidth, f.l2 / (3 * self.bandwidth))
        t = max(t_cmp, t_mem)
        if not f.quantized:
            t = t + waves * self.program_cost
        return t + self.launch_overhead

    def eager_time(self, graph: Graph, i: int) -> float:
        """Modeled time of one eager op (bytes moved, matmul flops at ``mma_rate``)."""
        node = graph[i]
        moved = sum(nbytes(graph, j) for j in graph.compute_inputs(i)) + nbytes(graph, i)
        flops = 0.0
        if node.kind == "matmul":
            a = graph[node.inputs[0]].shape
            flops = 2.0 * a[-2] * a[-1] * node.shape[-1] * (a[0] if len(a) == 3 else 1)
        return max(moved / self.bandwidth, flops / self.mma_rate) + self.launch_overhead
