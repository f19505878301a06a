"""The measurement layer: verification, structural keys, memo, cost model, isolation, GPU timer.

CPU tests run kernels through Triton's interpreter; the ``gpu`` test needs CUDA.
"""

import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:  # before triton is imported anywhere
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pickle  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402

from autofuse.capture.trace import capture  # noqa: E402
from autofuse.kernels import KernelConfig, analyze_group, config_space, generate  # noqa: E402
from autofuse.measure import (  # noqa: E402
    Candidate,
    CostModel,
    GPUTimer,
    Isolated,
    Measurement,
    Memo,
    extract_group,
    extract_subgraph,
    time_callable,
    verify_candidate,
)
from autofuse.partition.partitioner import Partitioner  # noqa: E402

from .workloads import layernorm, pointwise_example, softmax  # noqa: E402

DEV = "cuda" if HAS_CUDA else "cpu"


def groups_of(fn, args, which="greedy"):
    graph = capture(fn, args).graph
    space = Partitioner(graph)
    part = space.greedy() if which == "greedy" else space.unfused()
    return graph, [analyze_group(graph, g) for g in part.groups]


def seed_group(dtype=torch.float32, n=(33, 17)):
    args = (torch.randn(*n), torch.randn(n[-1]), torch.randn(*n))
    graph, infos = groups_of(pointwise_example, tuple(a.to(dtype) for a in args))
    assert len(infos) == 1
    return graph, infos[0]


def softmax_group(dtype=torch.float32):
    graph, infos = groups_of(softmax, (torch.randn(7, 45).to(dtype),))
    assert len(infos) == 1
    return graph, infos[0]


# ---------------------------------------------------------------------------------------------
# verification
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_verify_passes_for_correct_kernels(dtype):
    graph, info = seed_group(dtype)
    for cfg in (KernelConfig(1024, 0, 4), KernelConfig(128, 0, 2)):  # one block, several
        assert verify_candidate(Candidate(graph, info, cfg), DEV) is None
    graph, info = softmax_group(dtype)
    persistent = KernelConfig(4, 64, 2)  # RBLOCK >= 45: a whole row per block
    looped = KernelConfig(2, 16, 1)  # RBLOCK < 45: walks the row in chunks
    for cfg in (persistent, looped):
        assert verify_candidate(Candidate(graph, info, cfg), DEV, seed=3) is None


def test_verify_honours_input_strides():
    x = torch.randn(17, 33).t()  # a transposed (non-contiguous) input
    graph, infos = groups_of(pointwise_example, (x, torch.randn(17), torch.randn(33, 17)))
    assert graph[graph.inputs[0]].strides == (1, 33)
    assert verify_candidate(Candidate(graph, infos[0], KernelConfig(256, 0, 2)), DEV) is None


def test_verify_is_exact_for_bool_and_int_outputs():
    graph, infos = groups_of(lambda x: (x > 0.5) | (x < -1.0), (torch.randn(6, 10),))
    cfg = KernelConfig(64, 0, 1)
    assert verify_candidate(Candidate(graph, infos[0], cfg), DEV) is None
    half = generate(graph, infos[0], cfg).source.replace("xnumel\n", "xnumel // 2\n")
    why = verify_candidate(Candidate(graph, infos[0], cfg, source_override=half), DEV)
    assert why is not None and "differ on output 0 (exact)" in why  # unwritten bools caught
    ints = (torch.randint(-5, 5, (6, 10), dtype=torch.int32),) * 2
    graph, infos = groups_of(lambda x, y: (x * 3 + y).sum(-1), ints)
    assert verify_candidate(Candidate(graph, infos[0], KernelConfig(2, 16, 1)), DEV) is None


WRONG = """
import triton
import triton.language as tl

@triton.jit
def wrong(in_ptr0, in_ptr1, in_ptr2, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    x = tl.load(in_ptr0 + xindex, xmask, other=0)
    tl.store(out_ptr0 + xindex, x + 1.0, xmask)
"""

HALF = """
import triton
import triton.language as tl

@triton.jit
def half(in_ptr0, in_ptr1, in_ptr2, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel // 2
    x = tl.load(in_ptr0 + xindex, xmask, other=0)
    w = tl.load(in_ptr1 + (xindex % 17), xmask, other=0)
    b = tl.load(in_ptr2 + xindex, xmask, other=0)
    tl.store(out_ptr0 + xindex, tl.sigmoid(x * w + b), xmask)
"""

BROKEN = """
import triton
import triton.language as tl

@triton.jit
def broken(in_ptr0, in_ptr1, in_ptr2, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(out_ptr0 + xindex, tl.not_a_triton_function(xindex))
"""

HANG = """
import triton
import triton.language as tl

@triton.jit
def hang(in_ptr0, in_ptr1, in_ptr2, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    while xnumel > 0:
        xindex = xindex + 0
    tl.store(out_ptr0 + xindex, tl.load(in_ptr0 + xindex))
"""


def test_verify_rejects_wrong_unwritten_and_broken_kernels():
    graph, info = seed_group()
    cfg = KernelConfig(128, 0, 2)
    why = verify_candidate(Candidate(graph, info, cfg, source_override=WRONG), DEV)
    assert why is not None and why.startswith("wrong result: max rel err") and "output 0" in why
    why = verify_candidate(Candidate(graph, info, cfg, source_override=HALF), DEV)
    assert why is not None and "NaN" in why and "unwritten" in why
    why = verify_candidate(Candidate(graph, info, cfg, source_override=BROKEN), DEV)
    assert why is not None and why.startswith("compile/run error") and "not_a_triton" in why
    # the measurers turn these into failures, never crashes
    m = CostModel(verify=True).measure(Candidate(graph, info, cfg, source_override=BROKEN))
    assert not m.ok and m.seconds is None and m.failure.startswith("compile/run error")
    assert m.source == "modeled"


# ---------------------------------------------------------------------------------------------
# structural keys and subgraphs
# ---------------------------------------------------------------------------------------------


def _layer(x):
    return x * 2.0 + 1.0


def test_candidate_key_is_structural():
    x = torch.randn(4, 8)
    graph, infos = groups_of(lambda x: _layer(_layer(x)), (x,), "unfused")
    cfg = KernelConfig(32, 0, 1)
    keys = [Candidate(graph, i, cfg).key for i in infos]
    assert len(keys) == 4 and infos[0].nodes != infos[2].nodes
    assert keys[0] == keys[2] and keys[1] == keys[3] and keys[0] != keys[1]
    assert Candidate(graph, infos[0], KernelConfig(64, 0, 1)).key != keys[0]
    # greedy: the layers are fused groups on either side of an eager logcumsumexp
    graph, infos = groups_of(lambda x: _layer(torch.logcumsumexp(_layer(x), -1)), (x,))
    assert len(infos) == 2 and infos[0].nodes != infos[1].nodes
    assert Candidate(graph, infos[0], cfg).key == Candidate(graph, infos[1], cfg).key
    # picklable (it is sent to worker processes), and the standalone form keeps its key
    c = Candidate(graph, infos[1], cfg)
    assert pickle.loads(pickle.dumps(c)).key == c.key == c.standalone().key
    assert Candidate(graph, infos[1], cfg, source_override=WRONG).key != c.key


def test_subgraph_generates_the_same_kernel():
    for fn, args in [
        (layernorm, (torch.randn(5, 40), torch.randn(40), torch.randn(40))),
        (softmax, (torch.randn(7, 45),)),
        (pointwise_example, (torch.randn(17, 33).t(), torch.randn(17), torch.randn(33, 17))),
    ]:
        for which in ("greedy", "unfused"):
            graph, infos = groups_of(fn, args, which)
            for info in infos:
                sub, sub_info = extract_group(graph, info)
                assert extract_subgraph(sub, sub_info).key == sub.key  # idempotent
                assert analyze_group(sub, sub_info.nodes) == sub_info
                for cfg in config_space(info, graph)[:: max(1, len(config_space(info)) // 3)]:
                    assert generate(sub, sub_info, cfg).source == generate(graph, info, cfg).source


# ---------------------------------------------------------------------------------------------
# memo and cost model
# ---------------------------------------------------------------------------------------------


def test_memo_measures_each_candidate_once():
    x = torch.randn(4, 8)
    graph, infos = groups_of(lambda x: _layer(_layer(x)), (x,), "unfused")
    memo = Memo(CostModel())
    cfg = KernelConfig(32, 0, 1)
    a = memo.measure(Candidate(graph, infos[0], cfg))
    b = memo.measure(Candidate(graph, infos[0], cfg))
    c = memo.measure(Candidate(graph, infos[2], cfg))  # the same subgraph in the other layer
    assert a == b == c and a.ok
    assert memo.calls == 1 and memo.hits == 2


def test_cost_model_prefers_fusion_and_is_labelled_modeled():
    n = (2048, 1024)
    args = (torch.randn(*n), torch.randn(n[1]), torch.randn(*n))
    model = CostModel()
    graph, fused = groups_of(pointwise_example, args)
    graph_u, unfused = groups_of(pointwise_example, args, "unfused")
    cfg = KernelConfig(1024, 0, 4)
    t_fused = model.measure(Candidate(graph, fused[0], cfg))
    parts = [model.measure(Candidate(graph_u, i, cfg)) for i in unfused]
    assert len(unfused) == 3 and all(m.ok for m in parts)
    assert t_fused.source == "modeled" and all(m.source == "modeled" for m in parts)
    assert t_fused.seconds < sum(m.seconds for m in parts)
    # poor configs cost more: one element per thread and many programs; a huge block spills
    tiny = model.measure(Candidate(graph, fused[0], KernelConfig(128, 0, 4))).seconds
    huge = model.measure(Candidate(graph, fused[0], KernelConfig(4096, 0, 2))).seconds
    assert tiny > t_fused.seconds and huge > t_fused.seconds


def test_cost_model_counts_passes_of_looped_reductions():
    graph, infos = groups_of(layernorm, (torch.randn(4096, 4096), torch.randn(4096),
                                         torch.randn(4096)))  # fmt: skip
    info = infos[0]
    persistent, looped = KernelConfig(1, 4096, 8), KernelConfig(1, 1024, 8)
    passes = generate(graph, info, looped).meta.load_passes
    assert len(passes) == len(info.loads)
    assert max(passes) >= 2  # the row is read again for each phase and for the outputs
    assert generate(graph, info, persistent).meta.load_passes == (1,) * len(info.loads)
    model = CostModel()
    t_p = model.measure(Candidate(graph, info, persistent)).seconds
    t_l = model.measure(Candidate(graph, info, looped)).seconds
    assert t_l > t_p


# ---------------------------------------------------------------------------------------------
# isolation
# ---------------------------------------------------------------------------------------------


class CrashOn:
    """Kills its own process (SIGSEGV) on a marked candidate, else verifies and models."""

    source = "modeled"

    def measure(self, cand):
        if cand.source_override == "# crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        return CostModel(verify=True).measure(cand)


@pytest.mark.skipif(HAS_CUDA, reason="the hanging kernel relies on Triton's CPU interpreter")
def test_isolated_survives_hangs_and_crashes():
    graph, info = seed_group()
    cfg = KernelConfig(128, 0, 2)
    good = Candidate(graph, info, cfg)
    iso = Isolated(CrashOn(), timeout_s=5)
    try:
        iso.start()  # spawn + imports take seconds: not part of the timed job
        t0 = time.monotonic()
        m = iso.measure(Candidate(graph, info, cfg, source_override=HANG))
        elapsed = time.monotonic() - t0
        assert not m.ok and m.failure == "timeout after 5 s"
        assert 5 <= elapsed < 15
        m = iso.measure(good)  # a fresh worker
        assert m.ok and m.source == "modeled" and iso.restarts == 1
        m = iso.measure(Candidate(graph, info, cfg, source_override="# crash"))
        assert not m.ok and m.failure.startswith("worker died: exit code -11")
        m = iso.measure(Candidate(graph, info, cfg, source_override=WRONG))
        assert not m.ok and m.failure.startswith("wrong result")
        assert iso.restarts == 2
    finally:
        iso.close()


def test_isolated_cost_model_spec():
    graph, info = seed_group()
    with Isolated(("cost_model", {"verify": True}), timeout_s=60) as iso:
        m = iso.measure(Candidate(graph, info, KernelConfig(256, 0, 4)))
        assert isinstance(m, Measurement) and m.ok and m.source == "modeled"
    with pytest.raises(ValueError):
        Isolated(("no_such_measurer", {}))


def test_time_callable_returns_a_positive_time():
    x = torch.randn(64, device=DEV)
    assert time_callable(torch.sin, (x,), warmup_ms=1, rep_ms=5) > 0


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_timer_measures_the_seed_kernel():
    n = 2**24
    args = (torch.randn(n // 1024, 1024), torch.randn(1024), torch.randn(n // 1024, 1024))
    graph, infos = groups_of(pointwise_example, args)
    cand = Candidate(graph, infos[0], KernelConfig(1024, 0, 4))
    m = GPUTimer(warmup_ms=5, rep_ms=20).measure(cand)
    assert m.ok, m.failure
    assert m.source == "measured" and 0 < m.seconds < 1e-2
    bad = GPUTimer(warmup_ms=5, rep_ms=20).measure(
        Candidate(graph, infos[0], KernelConfig(1024, 0, 4), source_override=WRONG)
    )
    assert not bad.ok and bad.failure.startswith("wrong result")
