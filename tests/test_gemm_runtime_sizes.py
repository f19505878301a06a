"""GEMM kernels under runtime sizes (``kernels/common/sizes.py``): a matmul whose row count
varies (batch x sequence) gets one kernel text per shape bucket, every tile edge masked against
the M, N, K arguments, its config chosen at the bucket's extents; results equal eager's at
every length, forward and backward. Tiny shapes, Triton's interpreter."""

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse.capture import capture
from autofuse.frontend import dynamo
from autofuse.kernels import analyze_group, bucket_config_fits, default_config, generate
from autofuse.kernels.common.loader import kernels_built
from autofuse.kernels.common.sizes import runtime_sizes
from autofuse.kernels.gemm.kind import GemmKind, gemm_configs
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import build_plan, execute
from experiments.bench.workloads import attention_scores_causal
from tests.helpers import assert_close

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py


@pytest.fixture
def gemm_kernels(monkeypatch):
    """Untuned plans run GEMM groups as generated kernels (not the library call + epilogue)."""
    monkeypatch.setattr(GemmKind, "library_first", False)


def mlp(x, w1, b1, w2):
    """A GEMM + bias + GELU kernel forward; its backward a GEMM + GELU-gradient epilogue."""
    return F.gelu(x.reshape(-1, 16) @ w1 + b1) @ w2


def _params(hidden: int = 8):
    torch.manual_seed(0)
    return [torch.randn(16, hidden), torch.randn(hidden), torch.randn(hidden, 4)]


def _built_per_length(fast, fn, make_args, lengths) -> dict[int, int]:
    """Kernels built by ``fast``'s call and backward at each length (``make_args(t)``: its
    arguments, requiring grad), its results and gradients checked against ``fn``'s."""
    built = {}
    for t in lengths:
        torch.manual_seed(t)
        args = [a.requires_grad_() for a in make_args(t)]
        before = kernels_built()
        got = fast(*args)
        grads = torch.autograd.grad(got.square().sum(), args)
        built[t] = kernels_built() - before
        want = fn(*args)
        assert_close(got, want, torch.float32, f"length {t}")
        for g, r in zip(grads, torch.autograd.grad(want.square().sum(), args)):
            assert_close(g, r, torch.float32, f"length {t} grad")
    return built


# a width per front: the graphs differ, so neither reuses a plan the other made (whose kernels
# name the other graph's nodes in their comments)
@pytest.mark.parametrize("front, hidden", [("compile", 8), ("optimize", 12)])
def test_a_gemm_kernel_is_built_once_per_bucket(gemm_kernels, front, hidden):
    """Rows 2 x (9, 13, 16) share a bucket (a tile edge inside the last block at 18 and 26
    rows, none at 32): the bucket's first length builds its kernels, the others none; 17 opens
    the next bucket (17..32 a length) and 24 builds nothing again. Forward and backward."""
    params = [p.requires_grad_() for p in _params(hidden)]
    if front == "compile":
        fast = torch.compile(mlp, backend=dynamo.make_backend(), dynamic=True)
    else:
        fast = autofuse.optimize(mlp, (torch.randn(2, 9, 16), *params), dynamic={"x": [1]})
    built = _built_per_length(
        fast, mlp, lambda t: [torch.randn(2, t, 16), *params], (9, 13, 16, 17, 24)
    )
    assert built[13] == built[16] == built[24] == 0, built


def _gemm_kernel(rows: int, bucket):
    args = (torch.randn(rows, 16), *_params())
    graph = capture(lambda x, w1, b1, w2: F.gelu(x @ w1 + b1), args).graph
    (group,) = [g for g in Partitioner(graph).greedy().groups if len(g) > 1]
    info = analyze_group(graph, group)
    with runtime_sizes(bucket):
        return generate(graph, info, default_config(info, graph))


def test_runtime_sizes_mask_every_edge_and_choose_the_config_by_bucket():
    """Outside runtime sizes a block that divides M drops the A tile's mask; with them every
    shape of a bucket gets the same text and config (the M edge masked by the argument)."""
    static = [_gemm_kernel(m, None) for m in (26, 32)]
    assert static[0].source != static[1].source  # 32 rows: no mask on the A tile
    shared = [_gemm_kernel(m, ("bucket",)) for m in (18, 26, 32)]
    assert len({k.source for k in shared}) == 1 and len({k.config for k in shared}) == 1
    assert "mask_m[:, None] & mask_k[None, :]" in shared[0].source
    assert [k.layout[2] for k in shared] == [("int", m) for m in (18, 26, 32)]  # M


def _scores(scale):
    def scores(q, k, bias):
        return torch.tanh(q @ k.transpose(1, 2) * scale + bias)

    return scores


@pytest.mark.parametrize("front, scale", [("compile", 0.25), ("optimize", 0.5)])
def test_a_length_in_a_batched_gemm_s_strides_is_an_argument(gemm_kernels, front, scale):
    """q @ k^T [2, t, t] plus a [t, t] bias: the length is in the operands' batch strides
    (the tile loads) and the epilogue's addresses, arguments from the second length on; the
    third length of a bucket, and the next bucket's, build nothing. Forward and backward."""
    fn = _scores(scale)
    if front == "compile":
        fast = torch.compile(fn, backend=dynamo.make_backend(), dynamic=True)
    else:
        example = (torch.randn(2, 5, 16), torch.randn(2, 5, 16), torch.randn(5, 5))
        fast = autofuse.optimize(fn, example, dynamic={"q": [1], "k": [1], "bias": [0, 1]})
    built = _built_per_length(
        fast,
        fn,
        lambda t: [torch.randn(2, t, 16), torch.randn(2, t, 16), torch.randn(t, t)],
        (5, 6, 7, 9, 11),
    )
    assert built[7] == built[9] == built[11] == 0, built


def linear_norm(x, w, b):
    return F.layer_norm(x.reshape(-1, 16) @ w, (32,), b)


def test_a_row_gemm_kernel_is_built_once_per_bucket():
    """A 2-D row GEMM (a linear layer's rows normalized in its kernel) is a loop kernel: under
    runtime sizes its rows are the ``xnumel`` argument, its text the same at every length, its
    configs kept for a bucket; a batched one's are chosen per exact shape (BLOCK_M divides M)."""
    backend = dynamo.make_backend()
    fast = torch.compile(linear_norm, backend=backend, dynamic=True)
    built = _built_per_length(
        fast,
        linear_norm,
        lambda t: [torch.randn(2, t, 16), torch.randn(16, 32), torch.randn(32)],
        (9, 13, 16, 17, 24),
    )
    rows = [k.info for r in backend.records for k in r.plan.kernels if k.info.kind == "gemm_row"]
    assert rows and all(map(bucket_config_fits, rows))
    assert built[13] == built[16] == built[17] == built[24] == 0, built
    q = torch.randn(2, 32, 16)
    space = Partitioner(capture(attention_scores_causal, (q, q)).graph)
    info = space.check(frozenset(space.nodes))  # a batched row GEMM
    assert info.kind == "gemm_row" and not bucket_config_fits(info)


def test_tma_descriptors_span_the_size_arguments():
    """Under runtime sizes a TMA descriptor's shape is the M, K (K, N) arguments: 40 and 33
    rows share the kernel text, and rows past the edge read as zero at both."""

    def fn(x, w, b):
        return F.gelu(x @ w + b)

    sources = set()
    for rows in (40, 33):
        g = torch.Generator().manual_seed(rows)
        args = (torch.randn(rows, 64, generator=g), torch.randn(64, 48, generator=g) * 0.2,
                torch.randn(48, generator=g))  # fmt: skip
        graph = capture(fn, args).graph
        groups = Partitioner(graph).greedy().groups
        (group,) = [grp for grp in groups if len(grp) > 1]
        with runtime_sizes(("bucket",)):
            info = analyze_group(graph, group)
            cfg = next(c for c in gemm_configs(graph, info) if c.TMA)
            plan = build_plan(graph, groups, [cfg if grp == group else None for grp in groups])
        (kernel,) = plan.kernels
        assert "shape=[M, K]" in kernel.source and "shape=[K, N]" in kernel.source
        sources.add(kernel.source)
        assert_close(execute(plan, list(args))[0], fn(*args), torch.float32, f"{rows} rows")
    assert len(sources) == 1
