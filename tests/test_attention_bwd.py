"""The ``attention_bwd`` kernel kind: training through eager-written attention with the
torch.compile backend, the backward plan computes dQ, dK and dV in one kernel from recomputed
tiles (plus the small ``rowsum(dO * O)`` reduction), with no (T, Tk) buffer and no eager
matmul. Gradients equal eager's (interpreter, tiny shapes, T not a multiple of the tiles)."""

import pytest
import torch

from autofuse.frontend import dynamo
from autofuse.ir.graph import Graph
from autofuse.kernels import analyze_group, generate
from autofuse.kernels.attention_bwd import kind as ab
from autofuse.kernels.attention_bwd.emit import AttentionBwdConfig
from autofuse.kernels.attention_bwd.kind import attention_bwd_configs
from autofuse.partition import Partitioner
from autofuse.plan.runtime import build_plan, execute
from experiments.bench.model_functions import eager_attention, eager_attention_gqa
from tests.helpers import assert_close

B, H = 2, 2
MIN = torch.finfo(torch.float32).min


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py


def plain_attention(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) * 0.3, dim=-1) @ v


def additive_attention(q, k, v, amask):
    """An additive (B, 1, T, T) mask broadcast over the heads, softmax in fp32."""
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + amask
    return torch.softmax(s, -1, dtype=torch.float32).to(q.dtype) @ v


def bool_mask_attention(q, k, v, keep):
    """A boolean (B, 1, T, T) mask tensor: masked_fill(~keep, finfo.min)."""
    s = (q @ k.transpose(-1, -2) * 0.25).masked_fill(~keep, torch.finfo(q.dtype).min)
    return torch.softmax(s, -1) @ v


def hidden_row_causal(q, k, v, keep):
    """A boolean mask tensor, then the causal mask (an index expression) over it: a row the
    tensor hides entirely is uniform over *every* key in eager, the causally masked ones too
    (the kernel must not skip them for that row)."""
    s = (q @ k.transpose(-1, -2) * 0.25).masked_fill(~keep, MIN)
    i, j = torch.arange(q.shape[-2])[:, None], torch.arange(k.shape[-2])[None, :]
    return torch.softmax(torch.where(i >= j, s, MIN), -1) @ v


def sliding_window(q, k, v):
    """Causal within a sliding window of 8 keys (both bounds index expressions)."""
    i, j = torch.arange(q.shape[-2])[:, None], torch.arange(k.shape[-2])[None, :]
    live = (j <= i) & ((i - j) < 8)
    s = (q @ k.transpose(-1, -2) * 0.25).masked_fill(~live, torch.finfo(q.dtype).min)
    return torch.softmax(s, -1) @ v


def _leaves(dtype, *shapes):
    return [torch.randn(s, dtype=dtype, requires_grad=True) for s in shapes]


def _qkv(t, d, dtype=torch.float32, hk=H):
    return _leaves(dtype, (B, H, t, d), (B, hk, t, d), (B, hk, t, d))


def _hidden_rows(t):
    """Row 3 of the first sequence sees no key (every score finfo.min), the second sequence's
    last 4 keys are padding."""
    amask = torch.zeros(B, 1, t, t)
    amask[0, :, 3, :] = MIN
    amask[1, ..., -4:] = MIN
    return amask


def _keep(t):
    keep = torch.ones(B, 1, t, t, dtype=torch.bool).tril()
    keep[1, :, :, 5:9] = False
    keep[1, :, 3, :] = False  # a row with no key
    return keep


CASES = {
    "causal_fp32_d16": (eager_attention, lambda: _qkv(37, 16), torch.float32),
    "causal_bf16_d16": (eager_attention, lambda: _qkv(37, 16, torch.bfloat16), torch.bfloat16),
    "causal_fp32_d8": (eager_attention, lambda: _qkv(23, 8), torch.float32),
    "causal_fp32_d64": (eager_attention, lambda: _qkv(11, 64), torch.float32),
    "causal_two_tiles_d8": (eager_attention, lambda: _qkv(70, 8), torch.float32),
    "causal_hidden_row_two_tiles": (
        hidden_row_causal,
        lambda: [*_qkv(70, 8), _keep(70)],
        torch.float32,
    ),
    "sliding_window_two_tiles": (sliding_window, lambda: _qkv(70, 8), torch.float32),
    "sliding_window_bf16": (sliding_window, lambda: _qkv(37, 16, torch.bfloat16), torch.bfloat16),
    "no_mask_fp32_d8": (plain_attention, lambda: _qkv(9, 8), torch.float32),
    "no_mask_bf16_d16": (plain_attention, lambda: _qkv(21, 16, torch.bfloat16), torch.bfloat16),
    "additive_hidden_row": (
        additive_attention,
        lambda: [*_qkv(19, 16), _hidden_rows(19)],
        torch.float32,
    ),
    "bool_mask_tensor": (bool_mask_attention, lambda: [*_qkv(19, 16), _keep(19)], torch.float32),
    "gqa_additive": (
        eager_attention_gqa,
        lambda: [*_qkv(19, 16, hk=1), _hidden_rows(19)],
        torch.float32,
    ),
}


def _run(fn, args, dtype):
    ref = [
        a.detach().float().requires_grad_(a.requires_grad) if a.is_floating_point() else a
        for a in args
    ]
    out_ref = fn(*ref)
    grad_out = torch.randn(out_ref.shape)
    out_ref.backward(grad_out)
    backend = dynamo.make_backend()
    out = torch.compile(fn, backend=backend)(*args)
    assert_close(out.detach().float(), out_ref.detach(), dtype, "output")
    out.backward(grad_out.to(dtype))
    for name, a, r in zip("qkv", args, ref):
        assert_close(a.grad.float(), r.grad, dtype, f"d{name}")
    return backend.records[-1]


def _square(graph: Graph, i: int, t: int) -> bool:
    s = graph[i].shape
    return len(s) >= 2 and s[-1] == s[-2] == t


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradients_match_eager_with_one_backward_kernel(case):
    fn, make, dtype = CASES[case]
    torch.manual_seed(0)
    args = make()
    bw = _run(fn, args, dtype)
    assert bw.kind == "backward"
    plan, g = bw.plan, bw.plan.graph
    kinds = [k.info.kind for k in plan.kernels]
    assert kinds.count("attention_bwd") == 1, (kinds, bw.fallback_ops())
    assert not plan.library, bw.fallback_ops()  # no matmul left to cuBLAS
    t = args[0].shape[-2]
    made = [s for k in plan.kernels for s in k.info.stored] + [s.node for s in plan.fallbacks]
    assert not [g[i].shape for i in made if _square(g, i, t)]  # no (T, T) buffer
    (att,) = [k for k in plan.kernels if k.info.kind == "attention_bwd"]
    assert len(att.info.stored) == 3 and att.meta.dots == 7  # dQ, dK, dV; 4 + 3 dots


def _backward_graph(fn, args) -> Graph:
    # a fresh Dynamo: a second call at another length would otherwise recompile ``fn`` with
    # dynamic sizes (automatic dynamic shapes), a symbolic graph with other kernels
    torch._dynamo.reset()
    backend = dynamo.make_backend()
    torch.compile(fn, backend=backend)(*args).sum().backward()
    return backend.records[-1].plan.graph


def _bwd_group(fn, t: int, d: int):
    """The backward graph of ``fn`` at T = ``t``, head dim ``d``: (graph, greedy partition,
    the attention backward group, its info, random inputs, the unfused plan's outputs)."""
    graph = _backward_graph(fn, list(_qkv(t, d)))
    part = Partitioner(graph).greedy()
    (group,) = [grp for grp in part.groups if sum(graph[m].kind == "matmul" for m in grp) > 2]
    info = analyze_group(graph, group)
    ins = [torch.empty_strided(graph[i].shape, graph[i].strides).normal_() for i in graph.inputs]
    return (
        graph,
        part,
        group,
        info,
        ins,
        execute(build_plan(graph, Partitioner(graph).unfused().groups), ins),
    )


def test_every_config_computes_the_same_gradients():
    """Tiles larger and smaller than T, one and several programs per role, the query
    programs' tiles turned over (``swap``); causal, so the live-tile bounds are in use."""
    torch.manual_seed(1)
    graph, part, group, info, ins, ref = _bwd_group(eager_attention, 21, 16)
    configs = (
        AttentionBwdConfig(16, 16),
        AttentionBwdConfig(16, 32),
        AttentionBwdConfig(32, 16),
        AttentionBwdConfig(16, 32, swap=True),  # query programs hold 32 rows, step 16 keys
        AttentionBwdConfig(16, 16, flip=True),  # key programs' tiles keys by rows
        AttentionBwdConfig(16, 32, flip=True),
        AttentionBwdConfig(32, 16, swap=True, flip=True),
    )
    for cfg in configs:
        generate(graph, info, cfg)  # renders
        configs = [cfg if grp == group else None for grp in part.groups]
        out = execute(build_plan(graph, part.groups, configs), ins)
        for o, r in zip(out, ref):
            assert_close(o, r, torch.float32, cfg.label())


def test_a_backward_without_recomputed_softmax_is_refused_with_its_reason():
    """When the forward returns P (kept: no recompute, no delta rewrite), the backward reads
    the saved P and its row term is a sum over the keys inside the chain: the kind refuses the
    chain's matmuls, the plan keeps today's path and the gradients stay right."""

    def returns_probs(q, k, v):
        p = torch.softmax(q @ k.transpose(-1, -2) * 0.25, dim=-1)
        return p @ v, p

    torch.manual_seed(0)
    args = _qkv(13, 8)
    ref = [a.detach().clone().requires_grad_() for a in args]
    backend = dynamo.make_backend()
    out, p = torch.compile(returns_probs, backend=backend)(*args)
    (out.pow(2).sum() + p.sum()).backward()
    out_r, p_r = returns_probs(*ref)
    (out_r.pow(2).sum() + p_r.sum()).backward()
    for name, a, r in zip("qkv", args, ref):
        assert_close(a.grad, r.grad, torch.float32, f"d{name}")
    bw = backend.records[-1]
    assert "attention_bwd" not in [k.info.kind for k in bw.plan.kernels]
    reasons = [r.reason for r in Partitioner(bw.plan.graph).greedy().refusals]
    assert any("not an attention backward" in r for r in reasons), reasons


def test_a_row_sum_inside_the_group_is_refused_with_its_reason(monkeypatch):
    """Without the ``rowsum(dO * O)`` rewrite the softmax backward's ``sum(dP * P)`` is a
    reduction over the keys among the tiles' ops: refused with its reason, today's path."""
    import autofuse.frontend.remat_delta as remat_delta

    monkeypatch.setattr(remat_delta, "rewrite_deltas", lambda graph, chains: [])
    torch.manual_seed(0)
    args = _qkv(13, 8)
    bw = _run(eager_attention, args, torch.float32)
    assert "attention_bwd" not in [k.info.kind for k in bw.plan.kernels]
    reasons = [r.reason for r in Partitioner(bw.plan.graph).greedy().refusals]
    assert any("is a reduction inside the attention backward" in r for r in reasons), reasons


def test_sliding_window_bounds_both_loops():
    """Tiles outside the window are skipped: the kernel's visited fraction is well under the
    causal half."""
    torch.manual_seed(2)
    bw = _run(sliding_window, _qkv(200, 8), torch.float32)
    (att,) = [k for k in bw.plan.kernels if k.info.kind == "attention_bwd"]
    causal = _run(eager_attention, _qkv(200, 8), torch.float32)
    (att_c,) = [k for k in causal.plan.kernels if k.info.kind == "attention_bwd"]
    assert att.meta.work < att_c.meta.work < 1.0, (att.meta.work, att_c.meta.work)


def test_swap_configs_are_in_the_space_and_labelled():
    torch.manual_seed(3)
    graph = _backward_graph(eager_attention, list(_qkv(200, 8)))
    part = Partitioner(graph).greedy()
    (group,) = [grp for grp in part.groups if sum(graph[m].kind == "matmul" for m in grp) > 2]
    info = analyze_group(graph, group)
    from autofuse.kernels import config_space

    space = config_space(info, graph)
    swapped = [c for c in space if c.swap]
    assert swapped and all(c.BLOCK_M < c.BLOCK_N for c in swapped)
    assert swapped[0].label().endswith(" swap")
    k = generate(graph, info, AttentionBwdConfig(32, 64, swap=True))
    assert k.grid[0] == 2 * -(-200 // 64)  # both kinds of programs hold 64


def _loop_bodies(source: str, marker: str) -> list[list[str]]:
    """The lines of each ``for`` loop whose header comment holds ``marker``."""
    lines, out = source.splitlines(), []
    for n, line in enumerate(lines):
        if line.lstrip().startswith("for ") and marker in line:
            depth, body = len(line) - len(line.lstrip()), []
            for inner in lines[n + 1 :]:
                if inner.strip() and len(inner) - len(inner.lstrip()) <= depth:
                    break
                body.append(inner)
            out.append(body)
    return out


@pytest.mark.parametrize("fn", [eager_attention, sliding_window])
def test_whole_tiles_are_computed_without_the_mask(fn):
    """With ``whole``, the row blocks the mask leaves live for all of a key program's keys
    (below the diagonal, inside the window) run in a loop of their own with neither the mask
    nor its backward (the select on the same condition); the configs with and without it are
    in the space, and the gradients equal eager's for each."""
    torch.manual_seed(4)
    graph, part, group, info, ins, ref = _bwd_group(fn, 45, 8)
    space = attention_bwd_configs(graph, info)
    assert any(c.whole for c in space) and any(not c.whole for c in space)
    for cfg in (
        AttentionBwdConfig(16, 16, whole=True),
        AttentionBwdConfig(16, 32, swap=True, flip=True, whole=True),
        AttentionBwdConfig(16, 16),
    ):
        src = generate(graph, info, cfg).source
        whole, masked = _loop_bodies(src, "no mask"), _loop_bodies(src, ": masked")
        assert (len(whole), len(masked)) == ((1, 2) if cfg.whole else (0, 0)), src
        assert all("tl.where(tmp" in "\n".join(b) for b in masked)
        assert not any("tl.where(tmp" in "\n".join(b) or "# bitwise_not" in "\n".join(b)
                       for b in whole), src  # fmt: skip
        configs = [cfg if grp == group else None for grp in part.groups]
        out = execute(build_plan(graph, part.groups, configs), ins)
        for o, r in zip(out, ref):
            assert_close(o, r, torch.float32, cfg.label())


def test_without_an_index_expression_mask_no_config_is_whole():
    """``whole`` needs an exact index-expression mask (here there is none: every tile is
    visited and none is split)."""
    graph, _, _, info, _, _ = _bwd_group(plain_attention, 21, 8)
    assert not any(c.whole for c in attention_bwd_configs(graph, info))


TMA_CASES = {
    "causal": (eager_attention, lambda: _qkv(32, 16), torch.float32),
    "causal_bf16": (eager_attention, lambda: _qkv(32, 16, torch.bfloat16), torch.bfloat16),
    "sliding_window": (sliding_window, lambda: _qkv(32, 16), torch.float32),
    "bool_mask_tensor": (bool_mask_attention, lambda: [*_qkv(32, 16), _keep(32)], torch.float32),
    "gqa_additive": (
        eager_attention_gqa,
        lambda: [*_qkv(32, 16, hk=1), _hidden_rows(32)],
        torch.float32,
    ),
}


@pytest.mark.parametrize("cfg", [AttentionBwdConfig(16, 16, TMA=True),
                                 AttentionBwdConfig(16, 32, swap=True, flip=True, TMA=True)],
                         ids=lambda c: c.label())  # fmt: skip
@pytest.mark.parametrize("case", sorted(TMA_CASES))
def test_tma_configs_read_tiles_through_descriptors_and_match_eager(case, cfg, monkeypatch):
    """With ``TMA``, the tiles of Q, dO, K and V (held or read a step at a time, transposed
    where the kernel reads them head dim first; grouped-query K and V through their expand
    views) come through tensor descriptors, the kernel asks for the scratch allocator, and a
    training step's gradients equal eager's; configs whose tiles would run past the sequence
    are not offered."""
    fn, make, dtype = TMA_CASES[case]
    monkeypatch.setattr(ab, "attention_bwd_default", lambda graph, info: cfg)
    monkeypatch.setattr(dynamo, "_PLANS", {})  # plans are cached by graph: this one's config
    torch.manual_seed(5)
    bw = _run(fn, make(), dtype)
    (k,) = [k for k in bw.plan.kernels if k.info.kind == "attention_bwd"]
    assert k.config == cfg and k.meta.needs_allocator
    assert k.source.count("make_tensor_descriptor") >= 4 and "tl.load(in_ptr0 + " not in k.source
    space = attention_bwd_configs(bw.plan.graph, k.info)
    assert any(c.TMA for c in space)
    assert all(32 % max(c.BLOCK_M, c.BLOCK_N) == 0 for c in space if c.TMA)


def test_the_search_times_tma_flip_and_whole_beside_the_default():
    """The tuner's fixed first trials switch one option of the default config at a time: the
    backward's TMA reads, its flipped key programs and its whole-tile loop are each timed
    against it (their worth is the machine's register allocation)."""
    from autofuse.kernels.attention_bwd.kind import attention_bwd_default
    from autofuse.tune.climb import option_switches

    graph, _, _, info, _, _ = _bwd_group(eager_attention, 64, 16)
    space = attention_bwd_configs(graph, info)
    default = attention_bwd_default(graph, info)
    switched = {f for c in option_switches(default, space) for f in ("TMA", "flip", "whole")
                if getattr(c, f) != getattr(default, f)}  # fmt: skip
    assert switched == {"TMA", "flip", "whole"}
