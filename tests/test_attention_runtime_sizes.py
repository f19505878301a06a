"""The attention kernel under runtime sizes (``kernels/attention/runtime.py``): its query and key
counts, and the strides that hold them, are arguments; its row and key masks are always on; its
config is chosen by the lengths' bucket. The lengths of one bucket share one kernel text, built
once, through both front ends; results equal eager's at every length (1 and lengths no block
divides too). Tiny shapes, Triton's interpreter."""

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse.capture import capture
from autofuse.frontend import dynamo
from autofuse.kernels import analyze_group, bucket_config_fits, default_config, generate
from autofuse.kernels.attention.kind import attention_configs
from autofuse.kernels.common.loader import kernels_built
from autofuse.kernels.common.sizes import runtime_sizes, size_bucket
from autofuse.partition.partitioner import Partitioner
from tests.helpers import assert_close, settings_env

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py

B, H, D = 2, 2, 16
LENGTHS = (5, 6, 7, 8, *range(9, 17))  # two buckets: 5..8 and 9..16


def causal(q, k, v):
    """softmax(q @ k^T * scale + causal mask) @ v, written the eager way."""
    t = q.shape[-2]
    mask = torch.full((t, t), float("-inf")).triu(1)
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + mask
    return torch.softmax(scores, -1) @ v


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2.0


@pytest.fixture
def written(monkeypatch):
    """SDPA written out for autofuse's attention kernel (not run as the library call)."""
    with settings_env(monkeypatch, AUTOFUSE_SDPA="autofuse"):
        yield


def _qkv(t: int, d: int = D):
    g = torch.Generator().manual_seed(t)
    return tuple(torch.randn(B, H, t, d, generator=g) for _ in range(3))


def _front(front: str, fn, d: int, backend=None):
    """``fn`` through a front end, its lengths dynamic, called once at a length of a bucket of
    its own (3): the first shape of a traced graph, and ``optimize``'s example, run SDPA as
    the library call (its written-out variant is not made there). Each test its own head dim
    ``d``: the kernels of one do not share a text with another's, built already."""
    args = _qkv(3, d)
    if front == "compile":
        fast = torch.compile(fn, backend=backend or dynamo.make_backend(), dynamic=True)
    else:
        fast = autofuse.optimize(fn, args, dynamic={"q": [2], "k": [2], "v": [2]})
    assert_close(fast(*args), fn(*args), torch.float32, "length 3")
    return fast


def _rebuilt_per_bucket(fast, fn, lengths, d: int) -> dict[int, int]:
    """Runs every length, checked against eager; {bucket: kernels built by the calls after
    the bucket's first}."""
    rebuilt: dict[int, int] = {}
    for t in lengths:
        args = _qkv(t, d)
        before = kernels_built()
        assert_close(fast(*args), fn(*args), torch.float32, f"length {t}")
        bucket = size_bucket(t)
        if bucket in rebuilt:
            rebuilt[bucket] += kernels_built() - before
        else:
            rebuilt[bucket] = 0
    return rebuilt


def _attention_kernels(records) -> list:
    return [k for r in records for k in r.plan.kernels if k.info.kind == "attention"]


@pytest.mark.parametrize("fn", [causal, sdpa], ids=["eager", "sdpa"])
def test_compile_builds_the_attention_kernel_once_per_bucket(written, fn):
    backend = dynamo.make_backend()
    fast = _front("compile", fn, 16, backend)
    rebuilt = _rebuilt_per_bucket(fast, fn, LENGTHS, 16)
    assert rebuilt == {8: 0, 16: 0}, rebuilt
    kernels = _attention_kernels(backend.records)
    assert kernels and all(bucket_config_fits(k.info) for k in kernels)
    assert all("xmask = xindex < T" in k.source for k in kernels)


@pytest.mark.parametrize("fn", [causal, sdpa], ids=["eager", "sdpa"])
def test_optimize_builds_the_attention_kernel_once_per_bucket(written, fn):
    fast = _front("optimize", fn, 8)
    rebuilt = _rebuilt_per_bucket(fast, fn, LENGTHS, 8)
    assert rebuilt == {8: 0, 16: 0}, rebuilt
    kinds = {k.info.kind for k in fast.plan.kernels}
    assert "attention" in kinds, kinds


@pytest.mark.parametrize("front, d", [("compile", 24), ("optimize", 32)])
@pytest.mark.parametrize("fn", [causal, sdpa], ids=["eager", "sdpa"])
def test_lengths_no_block_divides_and_a_length_of_one(written, fn, front, d):
    """37, 45 and 33 rows and keys (no block of 16, 32 or 64 divides them: one bucket, one
    kernel), 1 and 2 between them (buckets of their own): equal to eager, the row and key
    masks cutting the last tile (a head dim of 24: its mask too)."""
    fast = _front(front, fn, d)
    rebuilt = _rebuilt_per_bucket(fast, fn, (37, 1, 45, 2, 33), d)
    assert rebuilt[64] == 0, rebuilt


def _kernel(fn, t: int, bucket, d: int = D):
    graph = capture(fn, _qkv(t, d)).graph
    groups = [g for g in Partitioner(graph).greedy().groups if len(g) > 1]
    infos = [analyze_group(graph, g) for g in groups]
    (info,) = [i for i in infos if i.kind == "attention"]
    with runtime_sizes(bucket):
        return generate(graph, info, default_config(info, graph))


def _code(source: str) -> list[str]:
    return [line for line in source.splitlines() if not line.startswith("#")]


def test_two_lengths_of_a_bucket_generate_one_text():
    """Under runtime sizes 5 and 7 give one kernel text (comments aside), passed T, TK and the
    stride T * D as arguments; baked, each length its own text with no argument."""
    shared = [_kernel(causal, t, ("bucket",)) for t in (5, 7)]
    assert _code(shared[0].source) == _code(shared[1].source)
    assert shared[0].config == shared[1].config
    for t, k in zip((5, 7), shared):
        assert k.layout[0] == ("int", t * D) and k.layout[-2:] == (("int", t), ("int", t))
        assert "rmask = rindex < TK" in k.source
        assert "r1 = tl.minimum(r0 + BLOCK_M - 1, T - 1)" in k.source
    baked = [_kernel(causal, t, None) for t in (5, 7)]
    assert _code(baked[0].source) != _code(baked[1].source)
    assert all(("int", 5) not in k.layout and "xmask = xindex < 5" in k.source for k in baked[:1])


def test_no_tma_config_under_runtime_sizes():
    """A TMA descriptor spans a shape's rows and needs whole key tiles: offered per exact
    shape only (32 keys: some BLOCK_N divides them)."""
    graph = capture(causal, _qkv(32)).graph
    (group,) = [g for g in Partitioner(graph).greedy().groups if len(g) > 1]
    info = analyze_group(graph, group)
    assert any(c.TMA for c in attention_configs(graph, info))
    with runtime_sizes(("bucket",)):
        assert not any(c.TMA for c in attention_configs(graph, info))


def _trained(fast, fn, t: int, d: int) -> None:
    """``fast``'s output and its gradients at length ``t`` against eager's."""
    args = [a.requires_grad_() for a in _qkv(t, d)]
    outs = [f(*args) for f in (fast, fn)]
    grads = [torch.autograd.grad(out.square().sum(), args) for out in outs]
    for got, want, what in [(*outs, ""), *((g, r, " grad") for g, r in zip(*grads))]:
        assert_close(got, want, torch.float32, f"length {t}{what}")


@pytest.mark.parametrize("front, d", [("compile", 16), ("optimize", 8)])
def test_training_shares_the_forward_and_backward_kernels_per_bucket(front, d):
    """Forward and backward (dQ, dK, dV in one kernel) through both front ends at 5..8 and
    9..12, 1 and 37: equal to eager's; the attention kernels of a bucket's lengths have one
    text (the loader builds each once), T and TK their arguments."""
    backend = dynamo.make_backend()
    if front == "compile":
        fast = torch.compile(causal, backend=backend, dynamic=True)
    else:
        example = [a.requires_grad_() for a in _qkv(3, d)]
        fast = autofuse.optimize(causal, example, dynamic={"q": [2], "k": [2], "v": [2]})
    texts: dict[tuple[str, int], set] = {}
    for t in (3, 5, 6, 7, 8, 9, 12, 1, 37):
        count = dynamo.compiled_count()
        _trained(fast, causal, t, d)
        for r in dynamo.compiled_since(count):
            for k in r.plan.kernels:
                if k.info.kind.startswith("attention"):
                    texts.setdefault((k.info.kind, size_bucket(t)), set()).add(
                        "\n".join(_code(k.source))
                    )
    kinds = {kind for kind, _ in texts}
    assert kinds == {"attention", "attention_bwd"}, kinds
    assert all(len(v) == 1 for v in texts.values()), {k: len(v) for k, v in texts.items()}
    shared = texts[("attention_bwd", 8)].pop()
    assert "nk = tl.cdiv(TK, BLOCK_N)" in shared and "T, TK, BLOCK_M" in shared


def cross(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1) @ v


@pytest.mark.parametrize("front, d", [("compile", 16), ("optimize", 8)])
def test_keys_dynamic_rows_fixed(front, d):
    """Four query rows over a dynamic number of keys (T != TK): the key lengths of a bucket
    share the kernel, and the results equal eager's, 1 and 37 keys too."""

    def make(t: int):
        g = torch.Generator().manual_seed(t)
        return [torch.randn(B, H, n, d, generator=g) for n in (4, t, t)]

    if front == "compile":
        fast = torch.compile(cross, backend=dynamo.make_backend(), dynamic=True)
    else:
        fast = autofuse.optimize(cross, make(3), dynamic={"k": [2], "v": [2]})
    built = {}
    for t in (3, 5, 6, 7, 8, 1, 37, 45):
        before = kernels_built()
        assert_close(fast(*make(t)), cross(*make(t)), torch.float32, f"{t} keys")
        built[t] = kernels_built() - before
    assert built[6] == built[7] == built[8] == built[45] == 0, built
