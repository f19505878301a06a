"""How a backend's gradients are judged against eager's in ``bench_models``: per parameter,
scaled by the parameter's own and the largest gradient; for 16-bit models, against a float32
copy of the same step (16-bit eager is itself some way off that truth)."""

from __future__ import annotations


def _nan_last(v: float) -> float:
    return float("inf") if v != v else v  # NaN sorts as the worst error


def _worst(vals) -> float:
    vals = list(vals)
    return float("nan") if any(v != v for v in vals) else max(vals, default=0.0)


def grad_errors(got: dict, want: dict, tol: float) -> dict:
    """Per parameter, ``max |got - want|`` relative to ``max(max |want|, 1e-2 x the largest
    gradient of any parameter)`` (as tests/test_models.py: some parameters barely move the loss)
    and the plain ``max_rel_err``; the worst of each, and the parameters over ``tol``."""
    from experiments.bench.models import max_rel_err

    missing = sorted(set(want) ^ set(got))
    scaled = scaled_grad_errors(got, want)
    plain = {n: max_rel_err(got[n], want[n]) for n in scaled}
    worst = sorted(scaled.items(), key=lambda kv: _nan_last(kv[1]), reverse=True)
    return {
        "grads_max_err_scaled": _worst(scaled.values()),
        "grads_max_rel_err": _worst(plain.values()),
        "grads_worst": [[n, v, plain[n]] for n, v in worst[:3]],
        "grads_over_tol": [n for n, v in scaled.items() if not v <= tol],
        "grads_missing": missing,
        "n_grads": len(scaled),
    }


def scaled_grad_errors(got: dict, want: dict) -> dict[str, float]:
    """Per parameter in both, ``max |got - want|`` over ``max(max |want|, 1e-2 x the largest
    gradient of any parameter)``."""
    top = max((w.abs().max().item() for w in want.values()), default=0.0)
    return {
        n: (got[n].double() - w.double()).abs().max().item()
        / max(w.abs().max().item(), 1e-2 * top, 1e-12)
        for n, w in want.items()
        if n in got
    }


def float32_grads(case) -> dict | None:
    """For a 16-bit model: every parameter's gradient of the same training step computed by a
    float32 copy (the same weights and inputs, upcast exactly), the truth that eager's and each
    backend's 16-bit gradients are measured against. None for a float32 model."""
    import copy

    import torch

    if case.dtype not in (torch.bfloat16, torch.float16):
        return None
    m32 = copy.deepcopy(case.model).float()
    inputs = {k: v.float() if v.is_floating_point() else v for k, v in case.inputs.items()}
    out = m32(**inputs)
    out = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    case.loss(out).backward()
    grads = {n: p.grad.detach() for n, p in m32.named_parameters() if p.grad is not None}
    del m32, out
    return grads


def grad_errors_vs_float32(got: dict, eager: dict, truth: dict, tol: float) -> dict:
    """Gradients of a 16-bit run judged by their distance from the float32 truth: a parameter
    is off when its scaled error exceeds twice eager's own (16-bit eager is itself that far
    from the truth) and ``tol``. Both worst errors are recorded."""
    per = scaled_grad_errors(got, truth)
    per_ref = scaled_grad_errors(eager, truth)
    over = [n for n, v in per.items() if not v <= max(2 * per_ref.get(n, 0.0), tol)]
    return {
        "grads_vs_fp32_max_err_scaled": _worst(per.values()),
        "eager_grads_vs_fp32_max_err_scaled": _worst(per_ref.values()),
        "grads_vs_fp32_over_bound": over,
    }
