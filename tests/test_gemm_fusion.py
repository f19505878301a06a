"""GEMM groups: every listed partition of the GEMM workloads matches eager in the interpreter,
and the greedy plan fuses epilogues, prologues and sibling GEMMs into the matmul kernel."""

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse.capture.trace import capture
from autofuse.kernels.gemm.kind import gemm_configs
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import build_plan, eager_group, execute

from .helpers import assert_close, check_partitions, reference
from .workloads import gemm_cases

NAMES = list(gemm_cases())


@pytest.mark.parametrize("name", NAMES)
def test_sampled_partitions_fp32(name):
    """Every partition where there are at most 24 (swiglu), else the greedy one and 11 drawn."""
    fn, args = gemm_cases(torch.float32)[name]
    n_parts, n_checked = check_partitions(
        fn, args, torch.float32, configs_per_group=2, max_enumerate=24, sample=12
    )
    assert n_parts > 1 and n_checked >= n_parts


@pytest.mark.exhaustive
@pytest.mark.parametrize("name", NAMES)
def test_every_partition_fp32(name):
    fn, args = gemm_cases(torch.float32)[name]
    n_parts, n_checked = check_partitions(fn, args, torch.float32, configs_per_group=2)
    assert n_parts > 1 and n_checked >= n_parts


@pytest.mark.parametrize("name", ["gemm_bias_gelu", "swiglu"])
def test_greedy_bf16(name):
    fn, args = gemm_cases(torch.bfloat16, seed=3)[name]
    check_partitions(fn, args, torch.bfloat16, configs_per_group=1, max_enumerate=4, sample=3)


def greedy_plan(fn, args):
    """The greedy plan (every legal fusion: the GEMM kernels) and its outputs."""
    graph = capture(fn, args).graph
    plan = build_plan(graph, Partitioner(graph).greedy().groups)
    return plan, execute(plan, list(args))


def test_epilogue_fused_into_the_gemm():
    fn, args = gemm_cases()["gemm_bias_gelu"]
    plan, outs = greedy_plan(fn, args)
    (k,) = plan.kernels
    assert k.name.startswith("autofuse_mm_fused_") and not plan.fallbacks
    assert "tl.dot(" in k.source and "tl.erf(" in k.source
    assert_close(outs[0], fn(*args), torch.float32)


def test_untuned_plan_runs_gemms_in_cublas_with_one_fused_epilogue():
    """Without a search, a GEMM + epilogue runs as torch.mm and one generated kernel (the kind
    is ``library_first``); attention-style groups are not split (see test_attention_kind)."""
    for name, epilogue_ops in (("gemm_bias_gelu", {"erf", "add"}), ("swiglu", {"sigmoid"})):
        fn, args = gemm_cases()[name]
        opt = autofuse.optimize(fn, args)
        assert [s.reason for s in opt.plan.library if "cuBLAS" in s.reason]
        (k,) = opt.plan.kernels
        assert epilogue_ops <= {opt.plan.graph[n].op for n in k.info.nodes}, name
        assert_close(opt(*args), fn(*args), torch.float32)


def test_horizontal_gemm_pair_shares_the_a_tile():
    fn, args = gemm_cases()["swiglu"]
    plan, outs = greedy_plan(fn, args)
    (k,) = plan.kernels
    assert "acc1" in k.source and k.source.count("tl.dot(") == 2
    assert_close(outs[0], fn(*args), torch.float32)


def test_prologue_fused_into_operand_load():
    def scaled(x, s, w):
        return (x * s).to(torch.bfloat16) @ w

    x, s = torch.randn(33, 40), torch.rand(33, 1) + 0.5
    w = torch.randn(40, 24).to(torch.bfloat16)
    opt = autofuse.optimize(scaled, (x, s, w))
    (k,) = opt.plan.kernels  # mul and cast happen while loading A
    assert_close(opt(x, s, w), scaled(x, s, w), torch.bfloat16)


def test_transposed_weight_is_strides_not_a_copy():
    def linear(x, w, b):
        return F.relu(F.linear(x, w, b))

    x, w, b = torch.randn(17, 24), torch.randn(30, 24), torch.randn(30)
    plan, outs = greedy_plan(linear, (x, w, b))
    assert len(plan.kernels) == 1 and not plan.fallbacks
    assert "clone" not in plan.kernels[0].name
    assert_close(outs[0], linear(x, w, b), torch.float32)


def test_lone_matmul_runs_as_torch_mm():
    def mm(a, b):
        return a @ b

    a, b = torch.randn(8, 16), torch.randn(16, 4)
    opt = autofuse.optimize(mm, (a, b))
    assert not opt.plan.kernels and not opt.plan.fallbacks
    (step,) = opt.plan.library
    assert step.implementation == "cublas.mm" and "cuBLAS" in step.reason


@pytest.mark.parametrize(
    ("name", "epilogues"), [("gemm_bias_gelu", 1), ("swiglu", 1), ("mlp_block", 3)]
)
def test_library_gemm_plan_keeps_each_epilogue_fused(name, epilogues):
    """The cuBLAS + fused epilogue candidate: every matmul alone (torch.mm), the ops around it
    still fused, and the plan matches eager."""
    fn, args = gemm_cases()[name]
    graph = autofuse.capture(fn, args).graph
    space = Partitioner(graph)
    lib = space.library_gemms(space.greedy())
    mms = [g for g in lib.groups if eager_group(graph, g)]
    fused = [g for g in lib.groups if not eager_group(graph, g)]
    assert len(mms) == sum(graph[n].kind == "matmul" for n in space.nodes) > 0
    assert len(fused) == epilogues and all(len(g) > 1 for g in fused), lib.groups
    assert all(space.check(g).kind != "gemm" for g in fused)
    (out,) = execute(build_plan(graph, lib.groups), args)
    assert_close(out, fn(*args), torch.float32)
    assert space.library_gemms(lib) is None  # nothing fused with a matmul is left
    assert space.library_gemms(space.greedy()) == lib


def _greedy_gemm(fn, args):
    graph = autofuse.capture(fn, args).graph
    space = Partitioner(graph)
    groups = space.greedy().groups
    group = next(g for g in groups if space.check(g).kind == "gemm")
    return graph, groups, group, space.check(group)


@pytest.mark.parametrize("name", ["gemm_bias_gelu", "swiglu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tma_descriptor_loads(name, dtype):
    """TMA configs read row-major operands through tensor descriptors made once per program;
    rows and columns past the edges (40 rows, 48 columns) read as zero."""
    fn = gemm_cases()[name][0]
    g = torch.Generator().manual_seed(5)
    x, w1, w2 = (torch.randn(*s, generator=g).to(dtype) for s in ((40, 64), (64, 48), (64, 48)))
    args = (x, w1 * 0.2, torch.randn(48).to(dtype)) if name == "gemm_bias_gelu" else (x, w1, w2)
    graph, groups, group, info = _greedy_gemm(fn, args)
    picked = [c for c in gemm_configs(graph, info) if c.TMA]
    assert picked, "the workload's operands are row-major inputs: TMA configs expected"
    refs = reference(fn, args, dtype)
    for cfg in picked[:3]:
        plan = build_plan(graph, groups, [cfg if g == group else None for g in groups])
        (k,) = plan.kernels
        assert k.source.count("tl.make_tensor_descriptor(") == len(info.matmuls) + 1
        assert "_desc.load([" in k.source
        assert_close(execute(plan, list(args))[0], refs[0], dtype, f"{name} {cfg}")


def test_no_tma_for_misaligned_transposed_or_prologue_operands():
    def linear(x, w, b):  # w.t() is a view: the B operand is column-major
        return F.relu(F.linear(x, w, b))

    def scaled(x, s, w):  # A is computed while it is loaded
        return (x * s).to(torch.bfloat16) @ w

    cases = [
        gemm_cases()["gemm_bias_gelu"],  # rows of 45 fp32: a pitch of 180 bytes, not 16-aligned
        (linear, (torch.randn(17, 24), torch.randn(32, 24), torch.randn(32))),
        (scaled, (torch.randn(33, 40), torch.rand(33, 1), torch.randn(40, 24).bfloat16())),
    ]
    for fn, args in cases:
        graph, _, _, info = _greedy_gemm(fn, args)
        assert not any(c.TMA for c in gemm_configs(graph, info)), fn.__name__


def test_tma_kernel_on_a_misaligned_input_runs_in_eager():
    fn = gemm_cases()["swiglu"][0]
    g = torch.Generator().manual_seed(6)
    x, w1, w2 = (torch.randn(*s, generator=g) for s in ((40, 64), (64, 48), (64, 48)))
    graph, groups, group, info = _greedy_gemm(fn, (x, w1, w2))
    cfg = next(c for c in gemm_configs(graph, info) if c.TMA)
    plan = build_plan(graph, groups, [cfg if g == group else None for g in groups])
    buf = torch.randn(40 * 64 + 1, generator=g)
    shifted = buf[1:].view(40, 64)  # same strides, base 4 bytes off a 16-byte boundary
    with pytest.warns(RuntimeWarning, match="16-byte aligned"):
        out = execute(plan, [shifted, w1, w2])[0]
    assert_close(out, fn(shifted, w1, w2), torch.float32)


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("name", ["gemm_bias_gelu", "swiglu"])
def test_persistent_grid_walks_every_tile(name, tma):
    """A PERSISTENT config launches that many programs, each looping over output tiles
    (here 2 programs for 6 tiles, and more programs than tiles), with or without TMA loads."""
    from dataclasses import replace

    fn = gemm_cases()[name][0]
    g = torch.Generator().manual_seed(7)
    x, w1, w2 = (torch.randn(*s, generator=g) for s in ((40, 64), (64, 48), (64, 48)))
    args = (x, w1 * 0.2, torch.randn(48, generator=g)) if name == "gemm_bias_gelu" else (x, w1, w2)
    graph, groups, group, info = _greedy_gemm(fn, args)
    base = next(c for c in gemm_configs(graph, info) if c.TMA == tma)
    base = replace(base, BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, GROUP_M=2)  # 3 x 3 tiles
    ref = reference(fn, args, torch.float32)[0]
    for programs in (2, 64):
        cfg = replace(base, PERSISTENT=programs)
        plan = build_plan(graph, groups, [cfg if g == group else None for g in groups])
        (k,) = plan.kernels
        assert k.grid == (min(programs, 9),)
        assert f"for tile in tl.range(tl.program_id(0), num_tiles, {programs}" in k.source
        assert_close(execute(plan, list(args))[0], ref, torch.float32, f"{name} {cfg}")


def test_persistent_configs_only_for_2d_gemms():
    fn, args = gemm_cases()["gemm_bias_gelu"]
    big = (torch.randn(256, 256), torch.randn(256, 256), torch.randn(256))
    graph, _, _, info = _greedy_gemm(fn, big)
    assert any(c.PERSISTENT for c in gemm_configs(graph, info))
    q, k = torch.randn(2, 256, 64), torch.randn(2, 256, 64)
    graph, _, _, info = _greedy_gemm(lambda q, k: torch.relu(q @ k.transpose(1, 2)), (q, k))
    assert not any(c.PERSISTENT for c in gemm_configs(graph, info))
