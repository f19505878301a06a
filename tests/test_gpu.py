"""GPU tier: generated kernels on CUDA (skipped without a GPU)."""

import pytest
import torch

import autofuse

from .helpers import assert_close, plain_build, reference
from .workloads import cases, gemm_cases

pytestmark = pytest.mark.gpu


def _cuda(args):
    return tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)


@pytest.mark.parametrize("name", list(cases()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_plan_on_gpu(name, dtype):
    fn, args = cases(dtype, seed=5)[name]
    args = _cuda(args)
    opt = autofuse.optimize(fn, args)
    out = opt(*args)
    out = out if isinstance(out, tuple) else (out,)
    for o, r in zip(out, reference(fn, args, dtype)):
        assert_close(o, r, dtype, name)


@pytest.mark.parametrize("name", list(gemm_cases()))
def test_gemm_greedy_plan_on_gpu(name):
    # the greedy plan: the generated GEMM kernels (an untuned optimize runs cuBLAS instead)
    from autofuse.capture.trace import capture
    from autofuse.partition.partitioner import Partitioner
    from autofuse.plan.runtime import build_plan, execute

    fn, args = gemm_cases(torch.bfloat16, seed=7)[name]
    args = _cuda(args)
    graph = capture(fn, args).graph
    plan = build_plan(graph, Partitioner(graph).greedy().groups)
    assert any(k.info.kind == "gemm" for k in plan.kernels), name
    out = execute(plan, list(args))
    for o, r in zip(out, reference(fn, args, torch.bfloat16)):
        assert_close(o, r, torch.bfloat16, name)


def test_tuned_plan_on_gpu(tmp_path):
    fn, args = cases(torch.bfloat16)["softmax"]
    args = _cuda(args)
    opt = autofuse.optimize(fn, args, trials=8, cache_dir=str(tmp_path), progress=False)
    assert opt.tuning.source == "measured"
    assert_close(opt(*args), reference(fn, args, torch.bfloat16)[0], torch.bfloat16)


@plain_build
def test_lean_launch_reuses_the_binary_and_respects_alignment():
    from autofuse.plan import launcher

    def f(x, w):
        return torch.sigmoid(x * w + 1.0)

    x, w = torch.randn(1000, 64, device="cuda"), torch.randn(64, device="cuda")
    opt = autofuse.optimize(f, (x, w))
    opt(x, w)
    before = launcher.stats()
    out = opt(x, w)
    assert launcher.stats()["lean"] == before["lean"] + 1, (before, launcher.stats())
    assert_close(out, f(x, w), torch.float32)
    # same shape, dtype and strides but not 16-byte aligned: Triton specialized the first
    # binary on aligned pointers, so this call must not reuse it
    xm = torch.randn(1000 * 64 + 1, device="cuda")[1:].view(1000, 64)
    assert xm.data_ptr() % 16 != 0
    assert_close(opt(xm, w), f(xm, w), torch.float32)
    assert_close(opt(x, w), f(x, w), torch.float32)


def test_direct_launch_binds_torch_static_launcher_and_matches_triton(monkeypatch):
    """The lean path's binaries go through torch's static launcher (one C++ call per kernel)
    and compute what Triton's own launch computes, on fresh and on misaligned buffers, for a
    plan of several kernels (a reduction, a pointwise epilogue)."""
    from autofuse.plan import launcher

    def f(x, w):
        y = torch.softmax(x * w, dim=-1)
        return y.sum(0), y * 2.0

    x, w = torch.randn(333, 257, device="cuda"), torch.randn(257, device="cuda")
    before = launcher.stats()["direct"]
    opt = autofuse.optimize(f, (x, w))
    opt(x, w)
    assert launcher.stats()["direct"] > before, launcher.stats()
    for xi in (x, torch.randn(333 * 257 + 1, device="cuda")[1:].view(333, 257)):
        for got, want in zip(opt(xi, w), f(xi, w)):
            assert_close(got, want, torch.float32)
    monkeypatch.setenv("AUTOFUSE_DIRECT_LAUNCH", "0")
    from autofuse.settings import reload_settings

    reload_settings()
    try:
        triton_path = autofuse.optimize(f, (x, w))
        for got, want in zip(opt(x, w), triton_path(x, w)):
            assert torch.equal(got, want)
    finally:
        monkeypatch.delenv("AUTOFUSE_DIRECT_LAUNCH")
        reload_settings()


def test_a_restored_binary_launches_without_tritons_launcher():
    """A binary restored from its record (as a cache entry holds it) is loaded and launched by
    the direct path alone: Triton never loads it nor builds its launcher (the compile a new
    process would otherwise pay per kernel signature), and the result is Triton's."""
    import triton
    import triton.language as tl

    from autofuse.cache.binaries import compiled_from_record, record_from_compiled
    from autofuse.plan import direct_launch

    @triton.jit
    def _scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * 3.0, mask=i < n)

    x = torch.randn(1000, device="cuda")
    y = torch.empty_like(x)
    compiled = _scale[(8,)](x, y, 1000, BLOCK=128)
    record = record_from_compiled(compiled)
    assert record is not None
    restored = compiled_from_record(_scale, record)
    run = direct_launch.bind(restored, (8, 1, 1), n_args=3, device=0)
    assert run is not None and getattr(restored, "module", None) is None
    z = torch.zeros_like(x)
    run([x, z, 1000])
    torch.cuda.synchronize()
    assert torch.equal(z, y)


@pytest.mark.parametrize("variant", ["causal", "gqa"])
def test_attention_backward_tma_configs_on_gpu(variant):
    """The attention backward's TMA configs (tiles through tensor descriptors) compile and
    match eager on the GPU (bf16, d = 128, causal and grouped-query with a mask tensor), beside
    the configs with the key programs' whole-tile loop."""
    from autofuse.frontend import dynamo
    from autofuse.kernels import analyze_group
    from autofuse.kernels.attention_bwd.emit import AttentionBwdConfig
    from autofuse.kernels.attention_bwd.kind import attention_bwd_configs
    from autofuse.measure import Candidate, verify_candidate
    from autofuse.partition import Partitioner
    from experiments.bench.attention_bench import make

    fn, args, _, _ = make(variant, 2, 8, 256, 128)
    for a in args[:3]:
        a.requires_grad_()
    backend = dynamo.make_backend()
    torch.compile(fn, backend=backend)(*args).float().sum().backward()
    graph = [r for r in backend.records if r.kind == "backward"][-1].plan.graph
    (group,) = [g for g in Partitioner(graph).greedy().groups
                if sum(graph[m].kind == "matmul" for m in g) > 2]  # fmt: skip
    info = analyze_group(graph, group)
    space = attention_bwd_configs(graph, info)
    picked = [c for c in space if c.TMA and c in {
        AttentionBwdConfig(64, 64, 8, 3, TMA=True), AttentionBwdConfig(64, 32, 8, 3, TMA=True),
        AttentionBwdConfig(128, 64, 8, 2, TMA=True), AttentionBwdConfig(32, 64, 8, 3, swap=True, TMA=True),
        AttentionBwdConfig(64, 64, 8, 3, flip=True, TMA=True),
        AttentionBwdConfig(64, 64, 8, 3, whole=True, TMA=True), AttentionBwdConfig(64, 64, 8, 3, whole=True),
    }]  # fmt: skip
    assert len(picked) >= 5, [c.label() for c in space]
    for cfg in picked:
        assert verify_candidate(Candidate(graph, info, cfg), "cuda") is None, cfg.label()


def test_one_stage_looped_reduction_and_kept_loads_on_cuda():
    """A looped reduction launched with num_stages=1 (``ONE_STAGE``) and with Triton's default
    give eager's values on CUDA; so does RoPE with its cos/sin loaded ``evict_last``; both
    plans' later calls take the C-level input guard."""
    import dataclasses

    from autofuse.capture.trace import capture
    from autofuse.kernels import config_space
    from autofuse.partition.partitioner import Partitioner
    from autofuse.plan.runtime import build_plan, execute, input_guard
    from experiments.bench.model_functions import rope_apply

    def seed(x):
        return (x * 2.0).sum(-1) + 1.0

    x = torch.randn(64, 3000, device="cuda", dtype=torch.bfloat16)
    graph = capture(seed, (x,)).graph
    (group,) = Partitioner(graph).greedy().groups
    info = Partitioner(graph).check(group)
    looped = next(c for c in config_space(info, graph) if c.RBLOCK == 1024 and c.num_warps == 4)
    for cfg in (looped, dataclasses.replace(looped, ONE_STAGE=True)):
        plan = build_plan(graph, [group], [cfg])
        for _ in range(2):
            assert_close(execute(plan, [x])[0], seed(x), torch.bfloat16, cfg.label())
        assert type(input_guard(plan).fast).__name__ == "TensorGuards"
    q, k = (torch.randn(2, 4, 33, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cos, sin = (torch.randn(2, 33, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    opt = autofuse.optimize(rope_apply, (q, k, cos, sin))
    assert opt.plan.kernels[0].meta.kept_loads
    for got, want in zip(opt(q, k, cos, sin), rope_apply(q, k, cos, sin)):
        assert_close(got, want, torch.bfloat16, "rope_apply")


@pytest.mark.parametrize("name", ["masked", "causal"])
def test_gemm_row_configs_on_gpu(name):
    """Every kind of row-GEMM config (row loop or whole row, one K step or a K loop) compiles
    and matches eager on the GPU."""
    from autofuse.kernels.gemm.row import gemm_row_configs
    from autofuse.measure import Candidate, verify_candidate
    from autofuse.partition.partitioner import Partitioner
    from experiments.bench.workloads import attention_scores, attention_scores_causal

    q, k = (torch.randn(4, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    if name == "masked":
        fn, args = attention_scores, (q, k, torch.rand(256, 256, device="cuda") < 0.1)
    else:
        fn, args = attention_scores_causal, (q, k)
    graph = autofuse.capture(fn, args).graph
    space = Partitioner(graph)
    group = max(space.greedy().groups, key=len)
    info = space.check(group)
    assert info.kind == "gemm_row"
    kinds: dict = {}
    for c in gemm_row_configs(graph, info):
        kinds.setdefault((c.RBLOCK >= info.rnumel, c.BLOCK_K >= 64, c.num_warps), c)
    assert len(kinds) >= 6, sorted(kinds)
    for cfg in kinds.values():
        assert verify_candidate(Candidate(graph, info, cfg), "cuda") is None, cfg.label()


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("name", ["causal_tril", "causal_shifted", "additive", "gqa_expand"])
def test_attention_configs_on_gpu(name, d):
    """Every attention config compiles and matches eager on the GPU (bf16, 300 queries: uneven
    tails, rows the mask hides entirely)."""
    from autofuse.kernels.attention.kind import attention_configs
    from autofuse.measure import Candidate, verify_candidate
    from autofuse.partition.partitioner import Partitioner

    from .test_attention_kind import attention_cases

    fn, args = attention_cases(torch.bfloat16, t=300, d=d, device="cuda")[name]
    graph = autofuse.capture(fn, args).graph
    space = Partitioner(graph)
    (group,) = space.greedy().groups
    info = space.check(group)
    assert info.kind == "attention"
    for cfg in attention_configs(graph, info):
        assert verify_candidate(Candidate(graph, info, cfg), "cuda") is None, cfg.label()


def test_reused_buffers_stay_right_on_cuda_and_under_a_cuda_graph():
    """Kernel outputs written into dead buffers (program.py) on CUDA, launched through the
    static launcher, kernel by kernel and replayed as a CUDA graph, call after call."""
    from autofuse.partition import Partitioner
    from autofuse.plan.graphs import GraphReplay
    from autofuse.plan.runtime import build_plan, execute

    def chain(x, w):
        y = x
        for _ in range(6):
            y = torch.sigmoid(y * w)
        return y

    x, w = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    g = autofuse.capture(chain, (x, w)).graph
    plan = build_plan(g, Partitioner(g).unfused().groups)
    for _ in range(3):
        assert_close(execute(plan, [x, w])[0], chain(x, w), torch.float32)
    assert plan.__dict__["_program"].reused >= 3
    replay = GraphReplay(plan)
    for _ in range(3):
        x2 = torch.randn_like(x)
        assert_close(replay([x2, w])[0], chain(x2, w), torch.float32)


def test_untuned_attention_times_the_fused_and_the_cublas_plans_on_cuda():
    """On CUDA the untuned plan of attention is chosen by timing it against cuBLAS; whichever
    runs, it computes eager's attention."""

    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 8.0, -1) @ v

    q, k, v = (torch.randn(4, 8, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    opt = autofuse.optimize(attention, (q, k, v))
    choice = opt.plan_choice
    assert choice is not None and len(choice.times) == 2, choice
    assert all(t is not None for _, t in choice.times), choice.why
    assert_close(opt(q, k, v), attention(q, k, v), torch.bfloat16)
