"""The ``attention`` kind on the Hugging Face models of the suite (experiments/bench/models.py, tiny
configs, fp32, Triton's interpreter): eager-written attention fuses into one kernel per layer.

What kept it from firing before (and what each test guards):

- Llama and GPT-2 build their causal + padding mask in the graph (``masking_utils``: positions,
  a ``cumsum`` of packed-sequence starts, gathers of it, ``where(mask, 0, finfo.min)`` added to
  the scores). The partitioner's chain seed pulled every pointwise op feeding the scores, also
  those before the ``cumsum`` (a scan, outside the group): "not convex". The seed now takes only
  the feeders read inside the chain; the ``cumsum`` is loaded (gathered) by the kernel.
- Every model has a dropout with p = 0 between softmax and ``P @ V`` (a ``clone``): attention
  now reads the probabilities through identities (clones, ``x * 1``) as through casts.
"""

import pytest
import torch

pytest.importorskip("transformers")

import autofuse  # noqa: E402
from autofuse.frontend import dynamo  # noqa: E402
from autofuse.kernels.attention.analysis import attention_parts  # noqa: E402
from autofuse.kernels.common.base import FusionRefused  # noqa: E402
from autofuse.partition.partitioner import Partitioner  # noqa: E402
from experiments.bench.models import build, max_rel_err, tolerance  # noqa: E402

FUSED = ("llama_eager", "gpt2", "bert", "vit")


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py


def _kinds(plan) -> list[str]:
    return [k.info.kind for k in plan.kernels]


def _padding() -> torch.Tensor:
    """Left padding on the first sequence (its first rows see no key under a causal mask),
    right padding on the second."""
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, :3] = 0
    mask[1, 6:] = 0
    return mask


@pytest.mark.parametrize("name", FUSED)
def test_inference_through_optimize_is_one_attention_kernel(name):
    case = build(name, "tiny")
    case.model.eval()
    ref = case.inference()
    ((key, x),) = case.inputs.items()
    with torch.no_grad():
        opt = autofuse.optimize(case.model, (x,))
        out = case.forward(lambda **kw: opt(kw[key]))
    assert max_rel_err(out, ref) <= tolerance(case.dtype), name
    assert _kinds(opt.plan).count("attention") == 1, _kinds(opt.plan)


@pytest.mark.parametrize("name", ["llama_eager", "gpt2", "bert"])
def test_padding_mask_rows_hidden_entirely_match_eager(name):
    """Padding on both sides (rows that see no key) equals the model's eager output; Llama's
    and GPT-2's mask (causal & same packed sequence & padding, added as
    ``where(mask, 0, finfo.min)``) bounds the key loop by its causal conjunct."""
    case = build(name, "tiny")
    case.model.eval()
    amask = _padding()
    backend = dynamo.make_backend()
    fast = torch.compile(case.model, backend=backend)
    with torch.no_grad():
        ref = case.forward(attention_mask=amask)
        out = case.forward(fast, attention_mask=amask)
    assert max_rel_err(out, ref) <= tolerance(case.dtype), name
    (rec,) = backend.records
    assert _kinds(rec.plan).count("attention") == 1, _kinds(rec.plan)
    if name != "bert":  # BERT's mask is padding alone: nothing to bound
        (kernel,) = [k for k in rec.plan.kernels if k.info.kind == "attention"]
        assert "hi = tl.minimum(" in kernel.source and "range(lo, hi, BLOCK_N)" in kernel.source


def test_two_layers_share_the_mask_and_both_fuse(monkeypatch):
    """The mask is read by both layers: it stays out of both groups (computed once, loaded)."""
    import experiments.bench.models as models

    monkeypatch.setitem(models._SIZES, "tiny", {**models._SIZES["tiny"], "layers": 2})
    case = build("llama_eager", "tiny")
    case.model.eval()
    backend = dynamo.make_backend()
    fast = torch.compile(case.model, backend=backend)
    with torch.no_grad():
        ref = case.forward(attention_mask=_padding())
        out = case.forward(fast, attention_mask=_padding())
    assert max_rel_err(out, ref) <= tolerance(case.dtype)
    assert _kinds(backend.records[0].plan).count("attention") == 2


@pytest.mark.parametrize("name", ["llama_eager", "gpt2", "bert"])
def test_training_forward_fuses_and_gradients_match(name):
    case = build(name, "tiny")
    g = torch.Generator().manual_seed(3)  # 12 tokens: the scores' T x T is no head's T x D
    case.inputs = {"input_ids": torch.randint(0, 128, (2, 12), generator=g)}
    ref_loss, ref_grads = case.train_step()
    backend = dynamo.make_backend()
    fast = torch.compile(case.model, backend=backend)
    loss, grads = case.train_step(fast)
    assert max_rel_err(loss, ref_loss) <= tolerance(case.dtype)
    top = max(g.abs().max().item() for g in ref_grads.values())
    for n, w in ref_grads.items():
        scale = max(w.abs().max().item(), 1e-2 * top)
        assert (grads[n] - w).abs().max().item() <= tolerance(case.dtype) * scale, n
    fw = next(r for r in backend.records if r.kind == "forward")
    assert _kinds(fw.plan).count("attention") == 1, _kinds(fw.plan)
    g = fw.plan.graph
    t = case.inputs["input_ids"].shape[-1]
    saved = [g[o].shape for o in g.outputs if g[g.base_of(o)].kind != "input"]
    assert not any(s[-2:] == (t, t) for s in saved), saved  # no T x T tensor is saved
    # the backward is one attention_bwd kernel per layer, no bmm in eager: a clone of dO that
    # rowsum(dO * O) also reads stays out of the group (GPT-2, BERT), and the tiles' domain
    # comes from the ops on the scores, not from a K/V expand copy (Llama's grouped heads)
    bw = next(r for r in backend.records if r.kind == "backward")
    assert _kinds(bw.plan).count("attention_bwd") == 1, (_kinds(bw.plan), bw.fallback_ops())
    assert "bmm" not in bw.fallback_ops(), bw.fallback_ops()


def test_a_non_identity_op_before_p_at_v_is_still_refused():
    """Only identities are read through: probabilities scaled by 0.5 are not the softmax."""

    def f(q, k, v):
        p = torch.softmax(q @ k.transpose(-1, -2), -1)
        return (p.clone() * 0.5) @ v

    from autofuse.capture.trace import capture
    from autofuse.kernels import proposed_groups

    q, k, v = (torch.randn(2, 8, 16) for _ in range(3))
    g = capture(f, (q, k, v)).graph
    space = Partitioner(g)
    (seed,) = proposed_groups(g, frozenset(space.nodes), space._reach)
    why = space.check(seed)
    assert isinstance(why, str) and "does not read the softmax" in why
    with pytest.raises(FusionRefused, match="reads mul"):
        attention_parts(g, seed)
