"""Training through eager-written attention with the torch.compile backend: AOTAutograd saves
the softmax's row max and sum instead of the T x T probabilities (autofuse/frontend/remat.py),
the forward plan runs one ``attention`` kernel that also stores those statistics, and the
backward recomputes P from Q, K, the masks and them. Gradients equal eager's (interpreter,
tiny shapes)."""

import pytest
import torch

from autofuse.frontend import dynamo
from autofuse.frontend.remat import find_attention_chains
from experiments.bench.model_functions import eager_attention, eager_attention_gqa
from tests.helpers import assert_close

B, H, T, D = 2, 2, 37, 16
MIN = torch.finfo(torch.float32).min


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py


def gpt2_attention(q, k, v, amask):
    """GPT-2's eager path: a causal where with finfo.min, then an additive padding mask."""
    i, j = torch.arange(q.shape[-2])[:, None], torch.arange(k.shape[-2])[None, :]
    s = torch.where(i >= j, q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, MIN)
    return torch.softmax(s + amask, -1, dtype=torch.float32).to(q.dtype) @ v


def plain_attention(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) * 0.3, dim=-1) @ v


def _padding(shape) -> torch.Tensor:
    amask = torch.zeros(shape)
    amask[0, ..., -5:] = MIN  # the first sequence's last 5 keys are padding
    return amask


def _causal_padding() -> torch.Tensor:  # Llama's 4-D additive mask
    causal = torch.full((T, T), MIN).triu(1)
    return (causal + _padding((B, 1, 1, T))).clamp(min=MIN)


def _leaves(*shapes):
    return [torch.randn(s, requires_grad=True) for s in shapes]


def returns_probs(q, k, v):  # HF's output_attentions: P is a forward output, kept
    p = torch.softmax(q @ k.transpose(-1, -2) * 0.25, dim=-1)
    return p @ v, p


CASES = {
    "causal_tril": (eager_attention, lambda: _leaves((B, H, T, D), (B, H, T, D), (B, H, T, D))),
    "gpt2_where_padding": (
        gpt2_attention,
        lambda: [*_leaves((B, H, T, D), (B, H, T, D), (B, H, T, D)), _padding((B, 1, 1, T))],
    ),
    "gqa_additive": (
        eager_attention_gqa,
        lambda: [*_leaves((B, H, T, D), (B, 1, T, D), (B, 1, T, D)), _causal_padding()],
    ),
    "no_mask": (plain_attention, lambda: _leaves((B, H, T, D), (B, H, T, D), (B, H, T, D))),
}


def _is_square(shape) -> bool:
    return len(shape) >= 2 and shape[-1] == shape[-2] == T


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradients_match_eager_and_nothing_t_by_t_is_saved(case):
    fn, make = CASES[case]
    torch.manual_seed(0)
    args = make()
    ref_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    grad_out = torch.randn(B, H, T, D)
    fn(*ref_args).backward(grad_out)

    backend = dynamo.make_backend()
    out = torch.compile(fn, backend=backend)(*args)
    assert_close(out.detach(), fn(*ref_args).detach(), torch.float32, "output")
    out.backward(grad_out)
    for name, a, r in zip("qkv", args, ref_args):
        assert_close(a.grad, r.grad, torch.float32, f"d{name}")

    fw, bw = backend.records
    assert (fw.kind, bw.kind) == ("forward", "backward")
    assert _bmms(bw) == 5  # the scores recomputed, then dV, dP, dQ, dK
    g = fw.plan.graph
    saved = [g[o].shape for o in g.outputs[1:]]  # after the attention's result
    made = [g[o].shape for o in g.outputs[1:] if g[g.base_of(o)].kind != "input"]
    assert not any(_is_square(s) for s in made), saved  # neither P nor a T x T mask
    assert saved.count((B, H, T, 1)) == 2, saved  # the softmax's row max and sum
    kinds = [k.info.kind for k in fw.plan.kernels]
    assert kinds == ["attention"] and not fw.plan.fallbacks, (kinds, fw.fallback_ops())
    att = fw.plan.kernels[0]
    assert len(att.info.stored) == 3 and "tl.store" in att.source  # output, max, sum


def test_softmax_not_followed_by_a_matmul_is_left_alone():
    def f(x, w):
        return torch.softmax(x @ w, dim=-1).pow(2)

    x, w = torch.randn(8, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True)
    gm = torch.fx.symbolic_trace(lambda a, b: torch.softmax(a @ b, -1))
    assert find_attention_chains(gm.graph) == []  # not decomposed, and no second matmul
    backend = dynamo.make_backend()
    torch.compile(f, backend=backend)(x, w).sum().backward()
    fw = backend.records[0]
    g = fw.plan.graph
    assert (8, 16) in [g[o].shape for o in g.outputs[1:]]  # the softmax is saved as before
    xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    f(xr, wr).sum().backward()
    assert_close(x.grad, xr.grad, torch.float32, "dx")
    assert_close(w.grad, wr.grad, torch.float32, "dw")


def test_bf16_gradients_match_fp32_eager():
    torch.manual_seed(0)
    args = _leaves((B, H, T, D), (B, H, T, D), (B, H, T, D))
    ref = [a.detach().float().requires_grad_() for a in args]
    low = [a.detach().bfloat16().requires_grad_() for a in args]
    grad_out = torch.randn(B, H, T, D)
    eager_attention(*ref).backward(grad_out)
    backend = dynamo.make_backend()
    torch.compile(eager_attention, backend=backend)(*low).backward(grad_out.bfloat16())
    for name, a, r in zip("qkv", low, ref):
        assert_close(a.grad.float(), r.grad, torch.bfloat16, f"d{name}")
    g = backend.records[0].plan.graph
    stats = [g[o] for o in g.outputs if g[o].shape == (B, H, T, 1)]
    assert [n.dtype for n in stats] == ["float32", "float32"]  # softmax in fp32
    assert [k.info.kind for k in backend.records[0].plan.kernels] == ["attention"]


def test_returned_probabilities_are_saved_as_before():
    torch.manual_seed(0)
    args = _leaves((B, H, T, D), (B, H, T, D), (B, H, T, D))
    ref = [a.detach().clone().requires_grad_() for a in args]
    backend = dynamo.make_backend()
    out, p = torch.compile(returns_probs, backend=backend)(*args)
    (out.pow(2).sum() + p.pow(2).sum()).backward()
    out_r, p_r = returns_probs(*ref)
    (out_r.pow(2).sum() + p_r.pow(2).sum()).backward()
    assert_close(p.detach(), p_r.detach(), torch.float32, "P")
    for name, a, r in zip("qkv", args, ref):
        assert_close(a.grad, r.grad, torch.float32, f"d{name}")
    assert _bmms(backend.records[-1]) == 4  # dV, dP, dQ, dK: no recomputed scores


def _bmms(record) -> int:
    return len(
        record.prepared.gm.graph.find_nodes(op="call_function", target=torch.ops.aten.bmm.default)
    )
