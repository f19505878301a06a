"""The public real-model suite: Hugging Face encoders and decoders built from configs with random
weights (nothing is downloaded), each as an inference call and as a training step.

Models: ``llama_eager`` / ``llama_sdpa`` (``LlamaModel`` with that attention implementation),
``gpt2`` (``GPT2Model``), ``bert`` (``BertModel``), ``vit`` (``ViTModel``); on request ``t5``
(``T5EncoderModel``: relative position bias added to the attention scores). Sizes: ``tiny``
for the CPU tests (hidden 32-64, 1-2 layers, sequence 8-16, fp32; the kernels run in Triton's
interpreter) and ``realistic`` for the GPU bench (hidden 2048, sequence 1024, bf16, 2 layers).
Dropout probabilities are 0, so train and eval mode compute the same function and outputs can
be compared with eager in both.

::

    case = build("llama_sdpa", "tiny")
    out = case.forward(case.model)                 # last_hidden_state
    loss = case.loss(out); loss.backward()        # the training step's scalar loss
    fast = torch.compile(case.model, backend="autofuse")
    case.forward(fast)

Needs the ``models`` extra (``pip install -e '.[models]'``: transformers, pinned).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

MODELS = ("llama_eager", "llama_sdpa", "gpt2", "bert", "vit")
EXTRA = ("t5",)  # built on request (``--models t5``), not in the default sets
SIZES = ("tiny", "realistic")


@dataclass
class ModelCase:
    """A model, its inputs (keyword arguments of ``model(...)``) and its loss."""

    name: str
    size: str
    model: torch.nn.Module
    inputs: dict[str, torch.Tensor]
    dtype: torch.dtype
    extra: dict[str, Any] = field(default_factory=dict)

    def forward(self, fn: Callable[..., Any] | None = None, **overrides: Any) -> torch.Tensor:
        """``last_hidden_state`` of ``fn(**inputs)`` (``fn`` defaults to the model)."""
        fn = self.model if fn is None else fn
        out = fn(**{**self.inputs, **overrides})
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    @staticmethod
    def loss(out: torch.Tensor) -> torch.Tensor:
        return out.float().pow(2).mean()

    def inference(self, fn: Callable[..., Any] | None = None) -> torch.Tensor:
        with torch.no_grad():
            return self.forward(fn)

    def train_step(self, fn: Callable[..., Any] | None = None) -> tuple[torch.Tensor, dict]:
        """Forward + backward of the scalar loss; returns (loss, {param name: grad}), leaving
        the model's ``.grad`` fields cleared."""
        self.model.zero_grad(set_to_none=True)
        loss = self.loss(self.forward(fn))
        loss.backward()
        grads = {
            n: p.grad.detach().clone()
            for n, p in self.model.named_parameters()
            if p.grad is not None
        }
        self.model.zero_grad(set_to_none=True)
        return loss.detach(), grads

    def with_batch(self, batch: int, seed: int = 1) -> dict[str, torch.Tensor]:
        """Inputs like ``inputs`` with another batch size."""
        g = torch.Generator().manual_seed(seed)
        out = {}
        for k, v in self.inputs.items():
            shape = (batch, *v.shape[1:])
            if v.is_floating_point():
                out[k] = torch.randn(shape, generator=g).to(v.dtype).to(v.device)
            else:
                hi = int(self.extra.get("vocab", 2))
                out[k] = torch.randint(0, hi, shape, generator=g).to(v.device)
        return out


# sizes: hidden, layers, heads, kv heads, intermediate, sequence, batch, vocab, dtype
_SIZES = {
    "tiny": dict(
        hidden=32,
        layers=1,
        heads=4,
        kv_heads=2,
        ffn=64,
        seq=8,
        batch=2,
        vocab=128,
        dtype=torch.float32,
        image=16,
        patch=4,
    ),  # fmt: skip
    "realistic": dict(
        hidden=2048,
        layers=2,
        heads=16,
        kv_heads=4,
        ffn=5632,
        seq=1024,
        batch=1,
        vocab=32000,
        dtype=torch.bfloat16,
        image=512,
        patch=16,
    ),  # fmt: skip
}


def _config(name: str, s: dict) -> Any:
    import transformers as tf

    if name.startswith("llama"):
        cfg = tf.LlamaConfig(
            hidden_size=s["hidden"],
            intermediate_size=s["ffn"],
            num_hidden_layers=s["layers"],
            num_attention_heads=s["heads"],
            num_key_value_heads=s["kv_heads"],
            vocab_size=s["vocab"],
            max_position_embeddings=max(s["seq"], 64),
            attention_dropout=0.0,
            use_cache=False,
        )
        cfg._attn_implementation = name.split("_")[1]
        return tf.LlamaModel, cfg
    if name == "gpt2":
        cfg = tf.GPT2Config(
            n_embd=s["hidden"],
            n_layer=s["layers"],
            n_head=s["heads"],
            n_inner=s["ffn"],
            n_positions=max(s["seq"], 64),
            vocab_size=s["vocab"],
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            use_cache=False,
            bos_token_id=0,  # GPT-2's 50256 is outside the smaller vocabularies
            eos_token_id=0,
        )
        cfg._attn_implementation = "eager"
        return tf.GPT2Model, cfg
    if name == "bert":
        cfg = tf.BertConfig(
            hidden_size=s["hidden"],
            num_hidden_layers=s["layers"],
            num_attention_heads=s["heads"],
            intermediate_size=s["ffn"],
            vocab_size=s["vocab"],
            max_position_embeddings=max(s["seq"], 64),
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        cfg._attn_implementation = "eager"
        return tf.BertModel, cfg
    if name == "vit":
        cfg = tf.ViTConfig(
            hidden_size=s["hidden"],
            num_hidden_layers=s["layers"],
            num_attention_heads=s["heads"],
            intermediate_size=s["ffn"],
            image_size=s["image"],
            patch_size=s["patch"],
            num_channels=3,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        cfg._attn_implementation = "eager"
        return tf.ViTModel, cfg
    if name == "t5":
        cfg = tf.T5Config(
            d_model=s["hidden"],
            d_kv=s["hidden"] // s["heads"],
            d_ff=s["ffn"],
            num_layers=s["layers"],
            num_heads=s["heads"],
            vocab_size=s["vocab"],
            dropout_rate=0.0,
            use_cache=False,
        )
        return tf.T5EncoderModel, cfg
    raise KeyError(f"unknown model {name!r}: expected one of {', '.join(MODELS + EXTRA)}")


def build(
    name: str, size: str = "tiny", device: str | torch.device = "cpu", seed: int = 0,
    batch: int | None = None,
) -> ModelCase:  # fmt: skip
    """The model ``name`` of ``size`` with random weights (seeded) and its example inputs."""
    if size not in _SIZES:
        raise KeyError(f"unknown size {size!r}: expected one of {', '.join(SIZES)}")
    s = dict(_SIZES[size])
    if batch is not None:
        s["batch"] = batch
    cls, cfg = _config(name, s)
    torch.manual_seed(seed)
    kw = {"add_pooling_layer": False} if name in ("bert", "vit") else {}
    model = cls(cfg, **kw).to(device=device, dtype=s["dtype"])
    model.train()  # dropout probabilities are 0: train and eval compute the same function
    g = torch.Generator().manual_seed(seed + 1)
    if name == "vit":
        pixels = torch.randn(s["batch"], 3, s["image"], s["image"], generator=g)
        inputs = {"pixel_values": pixels.to(device=device, dtype=s["dtype"])}
    else:
        ids = torch.randint(0, s["vocab"], (s["batch"], s["seq"]), generator=g)
        inputs = {"input_ids": ids.to(device)}
    return ModelCase(name, size, model, inputs, s["dtype"], {"vocab": s["vocab"]})


def tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance (to the reference's largest magnitude) of outputs and gradients."""
    return {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}.get(dtype, 1e-4)


def max_rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max(max |want|, 1e-6), in float64."""
    g, w = got.detach().double(), want.detach().double()
    return (g - w).abs().max().item() / max(w.abs().max().item(), 1e-6)


def fallback_table(size: str = "tiny", device: str = "cpu", names=MODELS) -> str:
    """Per model: the ATen ops that ran as eager steps in each compiled graph's plan (inference,
    forward, backward), with counts, after a no-grad call and a training step through
    ``torch.compile(backend="autofuse")``."""
    from autofuse.frontend import make_backend

    lines = []
    for name in names:
        torch._dynamo.reset()
        case = build(name, size, device)
        backend = make_backend()
        fast = torch.compile(case.model, backend=backend)
        case.inference(fast)
        case.train_step(fast)
        for r in backend.records:
            ops = ", ".join(f"{op.removeprefix('aten.')} x{n}" for op, n in
                            sorted(r.fallback_ops().items()))  # fmt: skip
            lines.append(f"{name:12} {r.kind:9} {len(r.plan.kernels):3d} kernels  eager: {ops}")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m experiments.bench.models [tiny|realistic] [cpu|cuda]
    import sys

    print(fallback_table(*(sys.argv[1:3] or ["tiny"])))
