"""The real-model suite (experiments/bench/models.py, tiny configs) through torch.compile(backend=
"autofuse") and through autofuse.optimize: outputs and every parameter's gradient equal eager's.

Gradients are compared relative to the largest gradient of the model (``max(scale of the
tensor, 1e-2 x the largest gradient of any parameter)``): with a final LayerNorm the loss
``mean(out ** 2)`` barely depends on some parameters (BERT's token-type embedding gets grads of
1e-8), and there fp32 eager itself differs from fp64 by a few percent."""

import pytest
import torch

pytest.importorskip("transformers")

from autofuse.frontend import dynamo  # noqa: E402
from experiments.bench.models import MODELS, build, max_rel_err, tolerance  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _check_grads(got: dict, want: dict, dtype) -> None:
    assert set(got) == set(want), set(want) ^ set(got)
    top = max(w.abs().max().item() for w in want.values())
    tol = tolerance(dtype)
    for n, w in want.items():
        scale = max(w.abs().max().item(), 1e-2 * top, 1e-12)
        err = (got[n].double() - w.double()).abs().max().item()
        assert err <= tol * scale, f"grad {n}: max abs err {err:.3g} > {tol * scale:.3g}"


def _eager(case):
    return case.inference(), case.train_step()


def _check_compile(name: str) -> dict:
    case = build(name, "tiny")
    ref, (ref_loss, ref_grads) = _eager(case)
    backend = dynamo.make_backend()
    fast = torch.compile(case.model, backend=backend)
    out = case.inference(fast)
    assert max_rel_err(out, ref) <= tolerance(case.dtype), name
    loss, grads = case.train_step(fast)
    assert max_rel_err(loss, ref_loss) <= tolerance(case.dtype)
    _check_grads(grads, ref_grads, case.dtype)
    kinds = {r.kind for r in backend.records}
    assert {"inference", "forward", "backward"} <= kinds, kinds
    return {r.kind: r.fallback_ops() for r in backend.records}


def _check_optimize(name: str) -> None:
    import autofuse

    case = build(name, "tiny")
    ref, (ref_loss, ref_grads) = _eager(case)
    (key, x), = case.inputs.items()  # fmt: skip
    opt = autofuse.optimize(case.model, (x,))  # in train mode, params require grad: warmed
    with torch.no_grad():
        out = case.forward(lambda **kw: opt(kw[key]))
    assert max_rel_err(out, ref) <= tolerance(case.dtype), name
    loss, grads = case.train_step(lambda **kw: opt(kw[key]))
    assert max_rel_err(loss, ref_loss) <= tolerance(case.dtype)
    _check_grads(grads, ref_grads, case.dtype)


def test_llama_sdpa_compile_forward_backward():
    ops = _check_compile("llama_sdpa")
    assert any("_scaled_dot_product" in op for op in ops["forward"])  # attention: a library call
    assert any("_scaled_dot_product" in op for op in ops["backward"])


def test_gpt2_optimize_forward_backward():
    _check_optimize("gpt2")


# every model runs through one front end by default (each front end gets more than one model:
# SDPA and eager attention, causal and bidirectional, patches); the other under -m exhaustive
COMPILED_BY_DEFAULT = ("llama_sdpa", "llama_eager")


def _models(skip: str, default: bool) -> list:
    """The models but ``skip``, those run by default through the front end in question first."""
    return [
        pytest.param(
            m, marks=() if (m in COMPILED_BY_DEFAULT) == default else pytest.mark.exhaustive
        )
        for m in MODELS
        if m != skip
    ]


@pytest.mark.slow
@pytest.mark.parametrize("name", _models("llama_sdpa", default=True))
def test_compile_forward_backward(name):
    _check_compile(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", _models("gpt2", default=False))
def test_optimize_forward_backward(name):
    _check_optimize(name)


@pytest.mark.slow
def test_batch_size_change_recompiles():
    case = build("bert", "tiny")
    backend = dynamo.make_backend()
    fast = torch.compile(case.model, backend=backend)
    for batch in (2, 3):
        inputs = case.with_batch(batch)
        with torch.no_grad():
            want = case.model(**inputs).last_hidden_state
            got = fast(**inputs).last_hidden_state
        assert max_rel_err(got, want) <= tolerance(case.dtype), batch
    batches = {r.graph[r.graph.inputs[0]].shape for r in backend.records}
    assert len(backend.records) >= 2 and len(batches) >= 2, batches


@pytest.mark.slow
def test_eval_mode_recompiles_and_matches():
    case = build("vit", "tiny")
    backend = dynamo.make_backend()
    fast = torch.compile(case.model, backend=backend)
    with torch.no_grad():
        case.model.train()
        case.forward(fast)
        n = len(backend.records)
        case.model.eval()
        got = case.forward(fast)
        want = case.forward()
    assert len(backend.records) > n  # Dynamo guards on the training flag: a new graph
    assert max_rel_err(got, want) <= tolerance(case.dtype)
