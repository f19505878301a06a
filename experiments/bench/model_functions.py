"""Model-style functions: the code around the matmuls of real models, written the way HF Llama /
GPT-2 / BERT / UNet / ResNet code writes it (rotate_half RoPE, token + position embeddings,
cross entropy with ignore_index, a causal mask from ``torch.ones(...).tril()``, F.normalize,
group_norm + SiLU, an int8 quantize-dequantize chain, column statistics, global average
pooling, ``any()`` on an attention mask, a fused-QKV split into heads, eager attention with
a causal or additive mask and grouped-query heads).

Each is a :class:`experiments.bench.workloads.Workload`: ``make(device, dtype)`` builds tiny shapes
(not multiples of any block) on ``"cpu"`` and realistic ones elsewhere (bf16 on the GPU).
``NO_EAGER_STEP`` names the functions whose greedy plan runs every op in a generated kernel.

    python -m experiments.bench.model_functions            # CPU (interpreter): plan summary per function
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from experiments.bench.workloads import Workload


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope_apply(q, k, cos, sin):
    """Llama's apply_rotary_pos_emb (cos / sin per position, unsqueezed over the heads)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def gpt2_embeddings(input_ids, wte, wpe, ln_w, ln_b):
    """GPT-2's token + position embeddings, then a layer norm (BERT's embedding block)."""
    position_ids = torch.arange(input_ids.shape[-1], device=input_ids.device).unsqueeze(0)
    h = F.embedding(input_ids, wte) + F.embedding(position_ids, wpe)
    return F.layer_norm(h, (h.shape[-1],), ln_w, ln_b, eps=1e-5)


def lm_cross_entropy(logits, labels):
    """The LM loss: shift, upcast to fp32, cross entropy with ignore_index=-100."""
    shift_logits = logits[:, :-1, :].float()
    shift_labels = labels[:, 1:]
    return F.cross_entropy(
        shift_logits.reshape(-1, shift_logits.shape[-1]),
        shift_labels.reshape(-1),
        ignore_index=-100,
    )


def causal_softmax(scores):
    """Eager attention's causal mask: a tril of ones, masked_fill(~mask, finfo.min), softmax
    in fp32 and back."""
    n = scores.shape[-1]
    mask = torch.ones(n, n, dtype=torch.bool, device=scores.device).tril()
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype)


def eager_attention(q, k, v):
    """GPT-2 / Llama's eager attention: scores over sqrt(d), the causal tril mask, softmax in
    fp32 and back, times V (one ``attention`` kernel: the scores never go to memory)."""
    return causal_softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5) @ v


def eager_attention_gqa(q, k, v, attention_mask):
    """Llama's eager attention with grouped-query heads (repeat_kv: expand + reshape, read by
    index arithmetic) and a 4-D additive causal + padding mask."""
    b, hk, t, d = k.shape
    g = q.shape[1] // hk
    k = k[:, :, None].expand(b, hk, g, t, d).reshape(b, hk * g, t, d)
    v = v[:, :, None].expand(b, hk, g, t, d).reshape(b, hk * g, t, d)
    scores = q @ k.transpose(2, 3) * d**-0.5 + attention_mask
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v


def normalize_embeddings(x):
    """Sentence / CLIP embeddings: L2-normalized rows."""
    return F.normalize(x, p=2, dim=-1)


def group_norm_silu(x, w, b):
    """A UNet ResNet block's norm + activation (32 groups)."""
    return F.silu(F.group_norm(x, 32 if x.shape[1] % 32 == 0 else 2, w, b, eps=1e-6))


def int8_quant_dequant(x):
    """Per-row absmax int8 fake quantization: round, clamp, cast, scale back."""
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 127.0
    q = torch.clamp(torch.round(x / scale), -128, 127).to(torch.int8)
    return q.to(x.dtype) * scale


def column_stats(x):
    """Feature statistics over the batch (BatchNorm's training statistics, whitening)."""
    return x.mean(dim=0), x.var(dim=0, unbiased=False)


def global_avg_pool(x):
    """ResNet / ViT-hybrid head: average over (H, W), flattened."""
    return torch.flatten(x.mean(dim=(2, 3), keepdim=True), 1)


def attention_mask_checks(attention_mask, dtype_probe):
    """HF's padding checks: whether any position is masked, and the additive extended mask."""
    has_padding = (attention_mask == 0).any()
    extended = attention_mask[:, None, None, :].to(dtype_probe.dtype)
    extended = (1.0 - extended) * torch.finfo(dtype_probe.dtype).min
    return has_padding, extended


def gpt2_split_heads(qkv, n_head):
    """GPT-2's fused QKV output split into q, k, v and reshaped into heads (q pre-scaled)."""
    b, t, c3 = qkv.shape
    q, k, v = qkv.split(c3 // 3, dim=2)
    q = q.reshape(b, t, n_head, -1).transpose(1, 2)
    k = k.reshape(b, t, n_head, -1).transpose(1, 2)
    v = v.reshape(b, t, n_head, -1).transpose(1, 2)
    return q * (q.shape[-1] ** -0.5), k.contiguous(), v.contiguous()


def _r(device, dtype, *shape):
    return torch.randn(*shape, device=device, dtype=dtype)


def _rope_inputs(d, t):
    b, h, s, hd = (2, 3, 5, 14) if d == "cpu" else (4, 32, 2048, 128)
    return _r(d, t, b, h, s, hd), _r(d, t, b, h, s, hd), _r(d, t, b, s, hd), _r(d, t, b, s, hd)


def _embedding_inputs(d, t):
    b, s, v, c = (2, 7, 11, 12) if d == "cpu" else (8, 1024, 50257, 768)
    ids = torch.randint(0, v, (b, s), device=d)
    return ids, _r(d, t, v, c), _r(d, t, s, c), _r(d, t, c), _r(d, t, c)


def _ce_inputs(d, t):
    b, s, v = (2, 6, 13) if d == "cpu" else (8, 1024, 32000)
    labels = torch.randint(0, v, (b, s), device=d)
    labels[:, :2] = -100  # padding / prompt positions
    return _r(d, t, b, s, v), labels


def _mask_inputs(d, t):
    b, s = (3, 9) if d == "cpu" else (64, 2048)
    mask = torch.ones(b, s, dtype=torch.int64, device=d)
    mask[0, -3:] = 0
    return mask, torch.zeros((), device=d, dtype=t)


def _qkv_inputs(d, t):
    b, s, c, h = (2, 5, 12, 3) if d == "cpu" else (8, 1024, 768, 12)
    return _r(d, t, b, s, 3 * c), h


def _attention_inputs(d, t):
    b, h, s, e = (2, 2, 9, 8) if d == "cpu" else (4, 32, 1024, 128)
    return _r(d, t, b, h, s, e), _r(d, t, b, h, s, e), _r(d, t, b, h, s, e)


def _gqa_inputs(d, t):
    b, h, hk, s, e = (2, 4, 2, 9, 8) if d == "cpu" else (4, 32, 8, 1024, 128)
    keep = torch.ones(s, s, dtype=torch.bool, device=d).tril().expand(b, 1, s, s).clone()
    keep[0, ..., s - 3 :] = False  # padded keys of the first sequence
    mask = torch.zeros(b, 1, s, s, device=d, dtype=t).masked_fill(~keep, torch.finfo(t).min)
    return _r(d, t, b, h, s, e), _r(d, t, b, hk, s, e), _r(d, t, b, hk, s, e), mask


def _sized(cpu_shape, gpu_shape):
    return lambda d, t: (_r(d, t, *(cpu_shape if d == "cpu" else gpu_shape)),)


def _gn_inputs(d, t):
    n, c, hh, ww = (2, 6, 3, 5) if d == "cpu" else (8, 512, 64, 64)
    return _r(d, t, n, c, hh, ww), _r(d, t, c), _r(d, t, c)


MODEL_FUNCTIONS = [
    Workload("rope_apply", rope_apply, _rope_inputs, "memory"),
    Workload("gpt2_embeddings", gpt2_embeddings, _embedding_inputs, "memory"),
    Workload("lm_cross_entropy", lm_cross_entropy, _ce_inputs, "memory"),
    Workload("causal_softmax", causal_softmax, _sized((2, 3, 9, 9), (4, 32, 1024, 1024)), "memory"),
    Workload("normalize_embeddings", normalize_embeddings, _sized((7, 20), (65536, 768)), "memory"),
    Workload("group_norm_silu", group_norm_silu, _gn_inputs, "memory"),
    Workload("int8_quant_dequant", int8_quant_dequant, _sized((5, 33), (8192, 4096)), "memory"),
    Workload("column_stats", column_stats, _sized((9, 13), (65536, 1024)), "memory"),
    Workload("global_avg_pool", global_avg_pool, _sized((3, 5, 6, 7), (64, 2048, 7, 7)), "memory"),
    Workload("attention_mask_checks", attention_mask_checks, _mask_inputs, "memory"),
    Workload("gpt2_split_heads", gpt2_split_heads, _qkv_inputs, "memory"),
    Workload("eager_attention", eager_attention, _attention_inputs, "compute"),
    Workload("eager_attention_gqa", eager_attention_gqa, _gqa_inputs, "compute"),
]  # fmt: skip

# the functions whose greedy plan has no eager step (every op in a generated kernel)
NO_EAGER_STEP = frozenset(w.name for w in MODEL_FUNCTIONS)


def plan_summary(device: str = "cpu", dtype: torch.dtype = torch.float32) -> list[dict]:
    """Per function: its greedy plan's kernels and eager steps, and whether it equals eager."""
    import autofuse

    rows = []
    for w in MODEL_FUNCTIONS:
        args = w.inputs(device, dtype)
        fast = autofuse.optimize(w.fn, args)
        out, ref = fast(*args), w.fn(*args)
        outs, refs = (out, ref) if isinstance(ref, tuple) else ((out,), (ref,))
        ok = all(
            torch.allclose(o.double(), r.double(), rtol=1e-3, atol=1e-3, equal_nan=True)
            for o, r in zip(outs, refs)
        )
        steps = [fast.plan.graph[s.node].attr("target", s.reason) for s in fast.plan.fallbacks]
        rows.append({"name": w.name, "kernels": len(fast.plan.kernels), "eager": steps, "ok": ok})
    return rows


if __name__ == "__main__":
    import os

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    for row in plan_summary("cuda" if torch.cuda.is_available() else "cpu"):
        print(row)
