"""The analytical cost model: an estimate of a kernel's time from its metadata and its group
(bytes, flops, occupancy); every figure it gives is *modeled*, never measured."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from autofuse.interpreter import interpreting
from autofuse.ir.graph import Graph, numel
from autofuse.ir.ops import op_def
from autofuse.kernels import GroupInfo, Kernel
from autofuse.measure.candidate import (
    Candidate,
    Measurement,
    describe_error,
)
from autofuse.measure.verify import (
    build_kernel,
    verify_candidate,
)
from autofuse.report import nbytes
from autofuse.settings import HOPPER

# ---------------------------------------------------------------------------------------------
# The analytical cost model
# ---------------------------------------------------------------------------------------------


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
        if kernel.meta.tiles is not None:
            return self._gemm_time(g, info, kernel)
        if info.kind == "attention":
            return self._attention_time(g, info, kernel)
        cfg = kernel.config
        red = info.reduces
        looped = red and cfg.RBLOCK < info.rnumel
        passes = kernel.meta.load_passes or (1,) * len(info.loads)
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
            flops += size * op_def(node.op).cost
        flops *= max(passes, default=1) if looped else 1
        util = min(1.0, elems / threads)
        t_cmp = flops / (self.flops_rate * util)
        if info.matmuls:  # a row-GEMM recomputes its product in every pass over the row
            mm = g[info.matmuls[0]]
            mm_flops = 2.0 * numel(mm.shape) * g[mm.inputs[0]].shape[-1]
            t_cmp += mm_flops * (kernel.meta.dots or 1) / self.mma_rate
        waves = math.ceil(programs / slots)
        return max(t_mem, t_cmp) * spill + waves * self.program_cost + self.launch_overhead

    def _gemm_time(self, g: Graph, info: GroupInfo, kernel: Kernel) -> float | str:
        bm, bn, bk, smem = kernel.meta.tiles
        warps = dict(kernel.launch_kw).get("num_warps", 4)
        mm = g[info.matmuls[0]]
        a = g[mm.inputs[0]]
        batch = info.domain[0] if len(info.domain) == 3 else 1
        m, n, k = info.domain[-2], info.domain[-1], a.shape[-1]
        item = 2 if a.dtype in ("bfloat16", "float16") else 4
        if smem > self.smem_bytes:
            return f"out of resources: shared memory {smem} > {self.smem_bytes} (modeled)"
        tm, tn = -(-m // bm), -(-n // bn)
        tiles = batch * tm * tn
        resident = max(1, min(64 // warps, self.smem_bytes // max(smem, 1), 32))
        slots = self.sm_count * resident
        waves = math.ceil(tiles / slots)
        wave_eff = tiles / (waves * slots) if tiles < slots * 4 else 1.0
        pad_eff = (m * n) / (tm * bm * tn * bn)
        tile_eff = min(1.0, (bm * bn) / (128 * 128)) ** 0.5
        k_eff = min(1.0, bk / 32) ** 0.5
        rate = self.mma_rate if item == 2 else self.flops_rate
        flops = 2.0 * batch * m * n * k * len(info.matmuls)
        eff = max(1e-3, wave_eff * pad_eff * tile_eff * k_eff)
        t_cmp = flops / (rate * eff)
        dram = sum(nbytes(g, j) for j in info.loads) + sum(nbytes(g, s) for s in info.stored)
        l2 = nbytes(g, g.base_of(mm.inputs[0])) * tn + nbytes(g, g.base_of(mm.inputs[1])) * tm
        t_mem = max(dram / self.bandwidth, l2 / (3 * self.bandwidth))
        return max(t_cmp, t_mem) + self.launch_overhead

    def _attention_time(self, g: Graph, info: GroupInfo, kernel: Kernel) -> float | str:
        """Two dots per visited (BLOCK_M, BLOCK_N) tile (``meta.work`` of them: a causal mask
        skips about half) at ``mma_rate`` for 16-bit operands, the epilogue and online softmax
        on CUDA cores; Q and the output once from DRAM, K and V once per program (from L2 but
        the first), the epilogue's loads once per visited tile."""
        kw = dict(kernel.launch_kw)
        bm, bn, warps = kw["BLOCK_M"], kw["BLOCK_N"], kw["num_warps"]
        bd, bdv, stages = kw["BLOCK_D"], kw["BLOCK_DV"], kw["num_stages"]
        mm1, mm2 = (g[m] for m in info.matmuls)
        q, k, v = mm1.inputs[0], mm1.inputs[1], mm2.inputs[1]
        heads = mm1.shape[0] if len(mm1.shape) == 3 else 1
        t, tk = mm1.shape[-2], mm1.shape[-1]
        item = 2 if g[q].dtype in ("bfloat16", "float16") else 4
        smem = (bm * bd + stages * bn * (bd + bdv)) * item
        if smem > self.smem_bytes:
            return f"out of resources: shared memory {smem} > {self.smem_bytes} (modeled)"
        programs, steps = heads * -(-t // bm), -(-tk // bn) * kernel.meta.work
        tile_elems = programs * steps * bm * bn
        rate = self.mma_rate if item == 2 else self.flops_rate
        tile_eff = min(1.0, bm * bn / (128 * 64)) ** 0.5
        t_dot = 2.0 * tile_elems * (bd + bdv) / (rate * tile_eff)
        epilogue = sum(op_def(g[m].op).cost for m in info.nodes if g[m].kind == "pointwise")
        t_sfu = tile_elems * (epilogue + 12) / self.flops_rate  # + exp, max, sum, rescale
        resident = max(1, min(64 // warps, self.smem_bytes // smem, 32))
        waves = math.ceil(programs / (self.sm_count * resident))
        operands = {g.base_of(j) for j in (q, k, v)}
        dram = nbytes(g, g.base_of(q)) + sum(nbytes(g, s) for s in info.stored)
        dram += sum(nbytes(g, j) for j in operands - {g.base_of(q)})
        l2 = programs * steps * bn * (bd + bdv) * item
        l2 += sum(nbytes(g, j) for j in info.loads if j not in operands) * kernel.meta.work
        t_mem = max(dram / self.bandwidth, l2 / (3 * self.bandwidth))
        t = max(t_dot + t_sfu, t_mem)
        return t + waves * self.program_cost + self.launch_overhead

    def eager_time(self, graph: Graph, i: int) -> float:
        """Modeled time of one eager op (bytes moved, matmul flops at ``mma_rate``)."""
        node = graph[i]
        moved = sum(nbytes(graph, j) for j in graph.compute_inputs(i)) + nbytes(graph, i)
        flops = 0.0
        if node.kind == "matmul":
            a = graph[node.inputs[0]].shape
            flops = 2.0 * a[-2] * a[-1] * node.shape[-1] * (a[0] if len(a) == 3 else 1)
        return max(moved / self.bandwidth, flops / self.mma_rate) + self.launch_overhead
