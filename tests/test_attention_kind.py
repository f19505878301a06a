"""The ``attention`` kernel kind: softmax(mask(q @ k^T * scale)) @ v written the eager way is
found from the IR by the greedy plan and runs as one flash-attention style kernel (through the
interpreter), equal to eager also on rows the mask hides entirely, with no T x T buffer."""

import math

import pytest
import torch

import autofuse
from autofuse.capture.trace import capture
from autofuse.kernels.attention.emit import AttentionConfig, generate_attention
from autofuse.kernels.attention.kind import attention_configs
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import build_plan, execute

B, H, T, D = 2, 2, 37, 16
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}


def _scores(q, k):
    return q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])


def _attend(s, v):  # softmax in float32 (float64 for the reference)
    return (
        torch.softmax(s, dim=-1, dtype=torch.promote_types(s.dtype, torch.float32)).to(v.dtype) @ v
    )


def causal_tril(q, k, v):
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    return _attend(_scores(q, k).masked_fill(~mask, torch.finfo(q.dtype).min), v)


def causal_shifted(q, k, v):  # the first 3 rows see no key: uniform rows (finfo.min)
    i = torch.arange(q.shape[-2], device=q.device)[:, None]
    j = torch.arange(k.shape[-2], device=q.device)[None, :]
    return _attend(_scores(q, k).masked_fill(j > i - 3, torch.finfo(q.dtype).min), v)


def causal_shifted_inf(q, k, v):  # the same rows under -inf: NaN rows, as in eager
    i = torch.arange(q.shape[-2], device=q.device)[:, None]
    j = torch.arange(k.shape[-2], device=q.device)[None, :]
    return _attend(_scores(q, k).masked_fill(j > i - 3, float("-inf")), v)


def where_then_add(q, k, v, amask):  # GPT-2's eager path: a causal where, then a padding mask
    i = torch.arange(q.shape[-2], device=q.device)[:, None]
    j = torch.arange(k.shape[-2], device=q.device)[None, :]
    s = torch.where(i >= j, _scores(q, k), torch.finfo(q.dtype).min)
    return _attend(s + amask, v)


def additive(q, k, v, amask):
    return _attend(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + amask, v)


def bool_mask(q, k, v, keep):
    return _attend(_scores(q, k).masked_fill(~keep, float("-inf")), v)


def sliding(q, k, v):
    i = torch.arange(q.shape[-2], device=q.device)[:, None]
    j = torch.arange(k.shape[-2], device=q.device)[None, :]
    live = (j <= i) & ((i - j) < 8)
    return _attend(_scores(q, k).masked_fill(~live, torch.finfo(q.dtype).min), v)


def gqa_expand(q, k, v):
    b, hk, t, d = k.shape
    g = q.shape[1] // hk
    k = k[:, :, None].expand(b, hk, g, t, d).reshape(b, hk * g, t, d)
    v = v[:, :, None].expand(b, hk, g, t, d).reshape(b, hk * g, t, d)
    return causal_tril(q, k, v)


def gqa_repeat(q, k, v):
    g = q.shape[1] // k.shape[1]
    return torch.softmax(_scores(q, k.repeat_interleave(g, 1)), -1) @ v.repeat_interleave(g, 1)


def no_mask(q, k, v):
    return torch.softmax(_scores(q, k), dim=-1) @ v


def attention_cases(dtype, t=T, d=D, device="cpu"):
    """name -> (fn, args): the masks and head layouts of the eager attention paths."""
    gen = torch.Generator().manual_seed(0)

    def r(*s):
        return torch.randn(*s, generator=gen).to(device=device, dtype=dtype)

    q, k, v = r(B, H, t, d), r(B, H, t, d), r(B, H, t, d)
    pad = torch.zeros(B, 1, 1, t, dtype=dtype)
    pad[0, ..., 20:] = torch.finfo(dtype).min  # padded keys
    pad[1] = torch.finfo(dtype).min  # every key padded: uniform rows (the mean of V)
    keep = torch.rand(B, 1, t, t, generator=gen) > 0.3
    keep[0, 0, :4] = False  # rows with no live key: NaN under -inf, as in eager
    pad, keep = pad.to(device), keep.to(device)
    huge = q.clone()
    huge[0, 0, 5] *= 1e6  # scores ~1e6: one key takes the whole row
    return {
        "causal_tril": (causal_tril, (q, k, v)),
        "causal_shifted": (causal_shifted, (q, k, v)),
        "causal_shifted_inf": (causal_shifted_inf, (q, k, v)),
        "additive": (additive, (q, k, v, pad)),
        "where_then_add": (where_then_add, (q, k, v, pad)),
        "bool_mask": (bool_mask, (q, k, v, keep)),
        "sliding": (sliding, (q, k, v)),
        "gqa_expand": (gqa_expand, (r(B, 2 * H, t, d), k, v)),
        "gqa_repeat": (gqa_repeat, (r(B, 2 * H, t, d), k, v)),
        "no_mask": (no_mask, (q, k, v)),
        "huge_scores": (causal_tril, (huge, k, v)),
    }


_cases = attention_cases


def _check(fn, args, dtype, out):
    """``out`` against eager in float64 (and eager itself): NaN rows where eager has them."""
    ref = fn(*[a.double() if a.is_floating_point() else a for a in args])
    eager = fn(*args)
    assert torch.equal(out.isnan(), eager.isnan()), "NaN rows differ from eager"
    torch.testing.assert_close(out.double(), ref, equal_nan=True, **TOL[dtype])


def _no_square_buffer(plan, t=T):
    """No kernel writes, and no eager op computes, a buffer with a T x T plane."""
    assert not plan.fallbacks, [s for s in plan.fallbacks]
    for k in plan.kernels:
        for s in k.info.stored:
            assert tuple(plan.graph[s].shape[-2:]) != (t, t), (k.name, plan.graph[s].shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(_cases(torch.float32)))
def test_greedy_plan_is_one_attention_kernel(name, dtype):
    fn, args = _cases(dtype)[name]
    fast = autofuse.optimize(fn, args)
    kinds = [k.info.kind for k in fast.plan.kernels]
    assert kinds == ["attention"], kinds
    kernel = fast.plan.kernels[0]
    assert kernel.name.startswith("autofuse_att_fused_") and kernel.meta.dots == 2
    _no_square_buffer(fast.plan)
    _check(fn, args, dtype, fast(*args))


def test_causal_bounds_the_key_loop():
    """An index-expression mask stops the key loop at the diagonal (the tiles below it need no
    mask, those across it are masked); the masked keys are added back only in a guarded pass
    (needed only by rows the mask hides entirely)."""
    fn, args = _cases(torch.float32)["causal_tril"]
    src = autofuse.optimize(fn, args).plan.kernels[0].source
    assert "range(lo, flo, BLOCK_N)" in src and "hi = tl.minimum(" in src
    body = src.split("range(flo, fhi, BLOCK_N)")[1].split("range(fhi, hi")[0]
    assert "tl.where" not in body.split("m_new = ")[0]  # the unmasked loop: no mask
    assert "keys the mask hides: no product" in src
    fn, args = _cases(torch.float32)["causal_shifted_inf"]
    src = autofuse.optimize(fn, args).plan.kernels[0].source
    assert "no product" not in src  # -inf keys add nothing: no pass over them
    fn, args = _cases(torch.float32)["bool_mask"]
    src = autofuse.optimize(fn, args).plan.kernels[0].source
    assert "range(0, 37, BLOCK_N)" in src  # a mask tensor: every key tile


def _loop(src: str, start: str) -> str:
    """The body of the key loop ``for start_n in range(start, ...)``."""
    return src.split(f"in range({start}, ")[1].split("    for start_n")[0].split("\n\n")[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_lean_inner_loop(dtype):
    """The tutorial's inner loop: a scaled causal case folds the softmax scale into the exp2
    (``p = exp2(fma(qk, qk_scale, -m))``: one exp2, no separate scale multiply, no per-score
    ``* log2 e``), the row statistics are [BLOCK_M] vectors, the mask's index arithmetic is
    int32, and tiles that cannot run past the extents load without masks."""
    fn, args = _cases(dtype, t=64)["causal_tril"]
    graph = capture(fn, args).graph
    plan = build_plan(graph, Partitioner(graph).greedy().groups)
    info = plan.kernels[0].info
    src = generate_attention(graph, info, AttentionConfig(32, 16), 0).source
    assert "m_i = tl.full([BLOCK_M]," in src and "l_i = tl.zeros([BLOCK_M]," in src
    assert "qk_scale = " in src
    full = _loop(src, "flo")
    assert full.count("tl.exp2(") == 2  # p and the per-row alpha
    assert "tl.exp2(tl.fma(qk, qk_scale, -m_use[:, None]))" in full
    assert "alpha = tl.exp2(m_i - m_use)" in full
    assert "tmp" not in full and "1.4426950408889634" not in full and "tl.where(rmask" not in full
    diag = _loop(src, "lo")
    assert "qk * qk_scale" in diag and "int64" not in diag and "1.4426950408889634" not in diag
    assert (
        diag.count("tl.exp2(") == 2
        and "acc * keep[:, None]" in diag
        and "p = p * r_new[:, None]" in diag
    )
    for load in (line for line in src.splitlines() if "tl.load(" in line):
        assert "mask" not in load, load  # T = 64: whole tiles of 32 x 16
    _check(fn, args, dtype, execute(plan, list(args))[0])
    # an additive padding mask: its [1, BLOCK_N] vector times log2 e is the FMA's addend
    fn, args = _cases(dtype, t=64)["additive"]
    src = autofuse.optimize(fn, args).plan.kernels[0].source
    assert "= tl.fma(qk, qk_scale, tmp" in src and "= qk * qk_scale" not in src
    (pad,) = (line for line in src.splitlines() if "# load" in line)
    assert "+ rindex)" in pad and "xmask" not in pad  # a [1, BLOCK_N] vector a key tile


def test_gqa_reads_shared_heads():
    """K and V of fewer heads are read by index arithmetic (no repeated copy is loaded)."""
    fn, args = _cases(torch.float32)["gqa_expand"]
    plan = autofuse.optimize(fn, args).plan
    kernel = plan.kernels[0]
    assert "(bh // 2)" in kernel.source
    assert sorted(kernel.info.loads) == sorted(plan.graph.inputs)


@pytest.mark.parametrize(
    "name", ["causal_tril", "sliding", "causal_shifted", "additive", "gqa_expand"]
)
def test_configs(name):
    """A few configs of the space (tiles smaller than T, uneven tails) equal eager."""
    fn, args = _cases(torch.float32)[name]
    graph = capture(fn, args).graph
    groups = Partitioner(graph).greedy().groups
    plan = build_plan(graph, groups)
    configs = attention_configs(graph, plan.kernels[0].info)
    assert {c.BLOCK_M for c in configs} >= {16, 32, 64}
    picked = [c for c in configs if c.BLOCK_N == 32 and c.num_stages == 2 and c.BLOCK_M < 64]
    assert picked
    for cfg in picked[:3]:
        out = execute(build_plan(graph, groups, [cfg]), list(args))[0]
        _check(fn, args, torch.float32, out)


def _block(x, wq, wk, wv, wo, heads=2):
    b, t, c = x.shape
    q, k, v = ((x @ w).view(b, t, heads, c // heads).transpose(1, 2) for w in (wq, wk, wv))
    return torch.relu(causal_tril(q, k, v).transpose(1, 2).reshape(b, t, c) @ wo) + x


def test_attention_inside_a_block():
    """In a whole block (projections before, an output projection after) the partitioner
    proposes the group from the first matmul of attention to the second on its own."""
    gen = torch.Generator().manual_seed(0)
    args = (torch.randn(2, T, 32, generator=gen),) + tuple(
        torch.randn(32, 32, generator=gen) / 6 for _ in range(4)
    )
    fast = autofuse.optimize(_block, args)
    assert [k.info.kind for k in fast.plan.kernels].count("attention") == 1
    torch.testing.assert_close(fast(*args), _block(*args), atol=1e-4, rtol=1e-4)


def _probs_too(q, k, v):  # the probabilities are an output: they must be stored
    p = torch.softmax(_scores(q, k), dim=-1)
    return p @ v, p


def _scaled_probs(q, k, v):  # an op between softmax and P @ V other than a cast
    return (torch.softmax(_scores(q, k), dim=-1) * 0.5) @ v


@pytest.mark.parametrize(
    "fn, reason",
    [(_probs_too, "must be stored"), (_scaled_probs, "through casts")],
)
def test_refusals_leave_the_group_to_gemm_row(fn, reason):
    args = _cases(torch.float32)["no_mask"][1]
    space = Partitioner(capture(fn, args).graph)
    assert reason in str(space.check(frozenset(space.nodes)))
    kinds = {space.check(g).kind for g in space.greedy().groups}
    assert "attention" not in kinds and kinds & {"gemm_row", "reduction"}


def test_head_dim_not_pow2_and_more_keys():
    """Head dim 24 (tiles padded to 32 with masks), 50 keys for 37 queries, V of head dim 8
    (padded to 16)."""
    gen = torch.Generator().manual_seed(2)
    args = (
        torch.randn(B, H, T, 24, generator=gen),
        torch.randn(B, H, 50, 24, generator=gen),
        torch.randn(B, H, 50, 8, generator=gen),
    )
    fast = autofuse.optimize(no_mask, args)
    assert [k.info.kind for k in fast.plan.kernels] == ["attention"]
    _check(no_mask, args, torch.float32, fast(*args))
