"""An additive index-expression mask bounds the attention kernel's key loop: Hugging Face's
``scores + where(cond, 0.0, finfo.min)`` (Llama, GPT-2), the negated ``where(~cond, C, 0.0)``
and ``zeros.masked_fill(~cond, C)`` skip the key tiles the causal condition hides, as a select
of the scores does, equal to eager (through the interpreter) also on rows the mask hides
entirely (finfo.min: uniform over every key; -inf: NaN). A conjunction with a padding tensor
bounds the loop by its causal part and masks the visited tiles element-wise by the rest."""

import math

import pytest
import torch

import autofuse
from autofuse.capture.trace import capture
from autofuse.kernels.attention.emit import AttentionConfig
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import build_plan, execute
from tests.test_attention_kind import _check

B, H, T, D = 2, 2, 37, 16
SMALL = AttentionConfig(16, 16)  # tiles smaller than T (37: an uneven tail): tiles are skipped


def _ij(q):
    i = torch.arange(q.shape[-2], device=q.device)[:, None]
    j = torch.arange(q.shape[-2], device=q.device)[None, :]
    return i, j


def _attend(q, k, v, bias):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
    return (
        torch.softmax(s, dim=-1, dtype=torch.promote_types(s.dtype, torch.float32)).to(v.dtype) @ v
    )


def _zero(q):
    return torch.zeros((), dtype=q.dtype, device=q.device)


def causal_add(q, k, v):  # Hugging Face's eager mask
    i, j = _ij(q)
    return _attend(q, k, v, torch.where(j <= i, _zero(q), torch.finfo(q.dtype).min))


def causal_add_negated(q, k, v):  # where(~cond, C, 0)
    i, j = _ij(q)
    return _attend(q, k, v, torch.where(j > i, torch.finfo(q.dtype).min, _zero(q)))


def causal_masked_fill(q, k, v):  # a zeros tensor, masked_fill-ed, then added
    i, j = _ij(q)
    t = q.shape[-2]
    bias = torch.zeros(t, t, dtype=q.dtype, device=q.device)
    return _attend(q, k, v, bias.masked_fill(~(j <= i), torch.finfo(q.dtype).min))


def causal_and_padding(q, k, v, keep):  # keep: (B, 1, 1, T) bool
    i, j = _ij(q)
    cond = (j <= i)[None, None] & keep
    return _attend(q, k, v, torch.where(cond, _zero(q), torch.finfo(q.dtype).min))


def shifted_min(q, k, v):  # the first 3 rows see no key: eager's rows are uniform
    i, j = _ij(q)
    return _attend(q, k, v, torch.where(j <= i - 3, _zero(q), torch.finfo(q.dtype).min))


def shifted_inf(q, k, v):  # the same rows under -inf: NaN, as in eager
    i, j = _ij(q)
    return _attend(q, k, v, torch.where(j <= i - 3, _zero(q), float("-inf")))


def small_constant(q, k, v):  # C = -1e9: s + C is not C, the general path (every key tile)
    i, j = _ij(q)
    return _attend(q, k, v, torch.where(j <= i - 3, _zero(q), -1e9))


def _cases(dtype):
    gen = torch.Generator().manual_seed(0)

    def r(*s):
        return torch.randn(*s, generator=gen).to(dtype)

    q, k, v = r(B, H, T, D), r(B, H, T, D), r(B, H, T, D)
    keep = torch.ones(B, 1, 1, T, dtype=torch.bool)
    keep[0, ..., :5] = False  # left padding: the first 5 rows see no key (uniform rows)
    keep[1, ..., 30:] = False  # right padding
    return {
        "causal_add": (causal_add, (q, k, v)),
        "causal_add_negated": (causal_add_negated, (q, k, v)),
        "causal_masked_fill": (causal_masked_fill, (q, k, v)),
        "causal_and_padding": (causal_and_padding, (q, k, v, keep)),
        "shifted_min": (shifted_min, (q, k, v)),
        "shifted_inf": (shifted_inf, (q, k, v)),
        "small_constant": (small_constant, (q, k, v)),
    }


BOUNDED = ["causal_add", "causal_add_negated", "causal_masked_fill", "shifted_min"]
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


def _run(fn, args, cfg=SMALL):
    """The one attention kernel's source at ``cfg`` and its output."""
    graph = capture(fn, args).graph
    groups = Partitioner(graph).greedy().groups
    plan = build_plan(graph, groups, [cfg] * len(groups))
    assert [k.info.kind for k in plan.kernels] == ["attention"]
    return plan.kernels[0].source, execute(plan, list(args))[0]


@DTYPES
@pytest.mark.parametrize("name", BOUNDED)
def test_additive_causal_bounds_the_key_loop(name, dtype):
    """The loop stops at the diagonal, the tiles of keys live on every row need no mask, the
    hidden keys come back only in the guarded pass; equal to eager."""
    fn, args = _cases(dtype)[name]
    src, out = _run(fn, args)
    assert "range(lo, flo, BLOCK_N)" in src and "hi = tl.minimum(" in src
    body = src.split("range(flo, fhi, BLOCK_N)")[1].split("range(fhi, hi")[0]
    assert "tl.where" not in body.split("m_new = ")[0]  # the unmasked loop: no mask
    assert "tl.exp2(tl.fma(qk, qk_scale, -m_use[:, None]))" in body  # the lean loop
    assert "keys the mask hides: no product" in src
    _check(fn, args, dtype, out)


@DTYPES
def test_causal_and_padding_bounds_by_the_causal_part(dtype):
    """``causal & padding``: the causal conjunct bounds the loop, the padding tensor masks
    the visited tiles; left-padded rows (no live key) are uniform as in eager."""
    fn, args = _cases(dtype)["causal_and_padding"]
    src, out = _run(fn, args)
    assert "hi = tl.minimum(" in src and "range(lo, hi, BLOCK_N)" in src
    assert "range(0, 37, BLOCK_N)" not in src.split("keys the mask hides")[0]
    _check(fn, args, dtype, out)
    eager = fn(*args)
    assert torch.allclose(out[0, :, 0].float(), args[2][0].float().mean(-2), atol=3e-2)
    assert not out.isnan().any() and not eager.isnan().any()


@DTYPES
def test_rows_hidden_entirely(dtype):
    """finfo.min: the rows the mask hides entirely are uniform over every key (the guarded
    pass adds the skipped ones); -inf: NaN rows and no pass over the skipped keys."""
    fn, args = _cases(dtype)["shifted_min"]
    src, out = _run(fn, args)
    torch.testing.assert_close(
        out[:, :, :3].float(), args[2].float().mean(-2, keepdim=True).expand(B, H, 3, D),
        atol=3e-2 if dtype == torch.bfloat16 else 2e-5, rtol=0,
    )  # fmt: skip
    fn, args = _cases(dtype)["shifted_inf"]
    src, out = _run(fn, args)
    assert "hi = tl.minimum(" in src and "no product" not in src
    assert out[:, :, :3].isnan().all() and not out[:, :, 3:].isnan().any()
    _check(fn, args, dtype, out)


def test_whole_tiles_and_greedy_config():
    """One tile of T (the default config) and the greedy plan through ``optimize``."""
    for name in ("causal_add", "causal_and_padding"):
        fn, args = _cases(torch.float32)[name]
        fast = autofuse.optimize(fn, args)
        assert "hi = tl.minimum(" in fast.plan.kernels[0].source
        _check(fn, args, torch.float32, fast(*args))


def test_small_constant_keeps_every_key_tile():
    """C = -1e9: ``s + C`` is not C on a skipped tile, so nothing is skipped (the general
    path)."""
    fn, args = _cases(torch.float32)["small_constant"]
    src, out = _run(fn, args)
    assert "range(0, 37, BLOCK_N)" in src and "hi = tl.minimum(" not in src
    # against eager in float32 (float64 keeps s apart under -1e9: a different softmax)
    torch.testing.assert_close(out, fn(*args), atol=2e-5, rtol=2e-5)


def test_huge_scores_in_the_ordinary_range():
    """Scores ~1e6 (far inside |s| < 2**103, where ``s + finfo.min`` is finfo.min): hidden
    rows stay uniform, the live rows one-hot, as in eager."""
    fn, (q, k, v) = _cases(torch.float32)["shifted_min"]
    args = (q * 1e6, k, v)
    src, out = _run(fn, args)
    assert "keys the mask hides: no product" in src
    torch.testing.assert_close(out, fn(*args), atol=2e-5, rtol=2e-5)
    _check(fn, args, torch.float32, out)
