"""How the KernelBench runner judges a training step's gradients (experiments/kernelbench/check.py):
against eager's fp32 gradients, and where that fails, against a float64 eager step, scaled by
eager's own distance from it. BatchNorm over two values per channel (a batch of 2 at 1x1
spatial size) makes the weight gradients before it ill-conditioned: 1 - x_hat^2 cancels, and
any two fp32 summation orders differ by as much as eager differs from float64."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from experiments.kernelbench import check
from experiments.kernelbench.check import (
    REFERENCE_FACTOR,
    float64_grads,
    grad_error_ratio,
    grad_verdict,
    train_step,
)


def test_a_gradient_as_close_to_float64_as_eager_is_passes_and_a_far_one_does_not():
    g = torch.Generator().manual_seed(0)
    ref64 = 10 * torch.randn(64, generator=g, dtype=torch.float64)
    eager = (ref64 + 0.05 * torch.randn(64, generator=g, dtype=torch.float64)).float()
    near = (ref64 + 0.05 * torch.randn(64, generator=g, dtype=torch.float64)).float()
    far = (ref64 + 0.05 * 3 * REFERENCE_FACTOR * torch.randn(64, generator=g)).float()
    assert grad_verdict(eager.clone(), eager, None, 1e-2) == "ok"
    assert grad_verdict(near, eager, None, 1e-2) == "wrong"  # off eager's by more than tol
    assert grad_verdict(near, eager, ref64, 1e-2) == "float64"
    assert grad_verdict(far, eager, ref64, 1e-2) == "wrong"
    assert grad_verdict(ref64.float(), eager, ref64, 1e-2) == "float64"
    assert grad_verdict(None, eager, ref64, 1e-2) == "wrong"
    assert grad_verdict(None, None, None, 1e-2) == "ok"
    nan = near.clone()
    nan[3] = float("nan")
    assert grad_error_ratio(nan, eager, ref64) == float("inf")
    assert grad_verdict(nan, eager, ref64, 1e-2) == "wrong"
    assert grad_error_ratio(eager, eager, ref64) == 1.0


def two_value_batchnorm(seed: int = 0) -> tuple[nn.Module, list]:
    """Linear -> BatchNorm1d over a batch of 2 -> Linear, scaled so the BatchNorm's variance is
    far above its eps and the first weight's gradient is large: eager fp32 is off float64 by
    several times KernelBench's tolerance there."""
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(4, 32), nn.BatchNorm1d(32), nn.Linear(32, 4))
    with torch.no_grad():
        m[0].weight.mul_(3.0)
        m[2].weight.mul_(1e4)
    return m, [100 * torch.randn(2, 4)]


def test_an_ill_conditioned_training_step_through_the_backend_is_judged_against_float64(
    monkeypatch,
):
    torch._dynamo.reset()
    model, inputs = two_value_batchnorm()
    params = list(model.parameters())
    with monkeypatch.context() as mp:  # against eager's fp32 gradients alone: wrong
        mp.setattr(check, "float64_grads", lambda *args: None)
        assert train_step(model, inputs, 1e-2)["wrong_grads"] == ["0.weight"]
    torch._dynamo.reset()
    rec = train_step(model, inputs, 1e-2)
    assert rec["correct"] and rec["float64_reference"], rec
    assert rec["grads_judged_by_float64"] == ["0.weight"]  # off eager's, as close to float64
    assert rec["worst_grad_error_ratio"] <= REFERENCE_FACTOR
    # the module is back in float32, its parameters the same objects
    assert list(model.parameters()) == params and all(p.dtype == torch.float32 for p in params)


def scaled_backward(by: float):
    """A backend whose forward is eager's and whose gradients are ``by`` times eager's."""

    def backend(gm: torch.fx.GraphModule, example_inputs: list):
        class Scale(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.clone()

            @staticmethod
            def backward(ctx, g):
                return by * g

        def run(*args):
            return [Scale.apply(o) if isinstance(o, torch.Tensor) else o for o in gm(*args)]

        return run

    return backend


wrong_backward = scaled_backward(1.5)  # eager's forward, gradients 1.5 times too large


def test_a_wrong_gradient_stays_wrong_with_a_float64_reference():
    torch._dynamo.reset()
    model, inputs = two_value_batchnorm()
    rec = train_step(model, inputs, 1e-2, backend=wrong_backward)
    assert rec["max_abs_err"] == 0.0 and rec["float64_reference"]
    assert not rec["correct"] and {"2.weight", "2.bias"} <= set(rec["wrong_grads"]), rec


class MakesFloat32(nn.Module):
    """A forward that makes a float32 tensor of its own: it cannot run in float64."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) @ torch.ones(4, 4)


def test_a_model_that_cannot_run_in_float64_has_no_reference_and_stays_float32():
    model = MakesFloat32()
    x = torch.randn(2, 4)
    assert float64_grads(model, [x], [torch.randn(2, 4)]) is None
    assert all(p.dtype == torch.float32 and p.grad is None for p in model.parameters())


class _Cancels(nn.Module):
    """Sums of exp of sums (Mamba2's segment sums in small): values near 1e15 whose fp32
    rounding differs by summation order far beyond KernelBench's 1e-2 rule near zero."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(4, 16, generator=torch.Generator().manual_seed(1)))

    def forward(self, x):
        e = torch.exp(self.a.cumsum(-1) * 3) * x
        return e.sum(-1) - e.flip(-1).sum(-1)  # 0 exactly; fp32 rounds by summation order


def test_forward_outputs_failing_against_eager_are_judged_against_float64():
    """An output as close to the float64 one as eager's fp32 output is passes (recorded as
    judged by float64); one further off than REFERENCE_FACTOR times eager's distance fails; a
    model that cannot run in float64 keeps the fp32 verdict."""
    model = _Cancels()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = model(x)
    ref64 = check.float64_outputs(model, [x])
    assert ref64 is not None and model.a.dtype == torch.float32
    exact = ref64[0].float()
    eager_err = (ref.double() - ref64[0]).abs().max().item()
    assert not check.compare(exact, ref, 1e-2)["correct"]  # eager fp32 is itself off
    far = exact + 4 * REFERENCE_FACTOR * max(eager_err, 1.0)
    assert check.judged_by_float64(exact, ref, ref64, 1e-2)["correct"]
    assert check.judged_by_float64(far, ref, ref64, 1e-2) is None
    assert check.judged_by_float64(exact, ref, None, 1e-2) is None

    rec = check.front_end("t", lambda: (lambda _: exact, []), [x], ref, 1e-2, 1e-4, lambda: ref64)
    wrong = check.front_end("t", lambda: (lambda _: far, []), [x], ref, 1e-2, 1e-4, lambda: ref64)
    assert rec["correct"] and rec.get("judged_by_float64")
    assert not wrong["correct"] and "judged_by_float64" not in wrong


def test_eager_noise_on_nearby_inputs_is_the_yardstick_where_eager_lands_close():
    """Eager's fp32 gradient exact by chance on the judged inputs: ``got``'s error is measured
    against eager's error on nearby inputs (``noise``), not against zero."""
    ref64 = torch.arange(-8, 8, dtype=torch.float64) / 8
    eager = ref64.float()  # exact (these values are representable)
    got = eager + 1e-3 * torch.linspace(-1, 1, 16)
    assert grad_error_ratio(got, eager, ref64) == float("inf")
    assert grad_error_ratio(got, eager, ref64, noise=1e-3) == pytest.approx(1.0, rel=1e-3)
    assert grad_verdict(got, eager, ref64, 1e-5) == "wrong"
    assert grad_verdict(got, eager, ref64, 1e-5, noise=1e-3) == "float64"


def test_eager_grad_noise_measures_the_ill_conditioned_gradient_and_restores_the_module():
    model, inputs = two_value_batchnorm()
    params = list(model.parameters())
    weights = [torch.randn(2, 4, generator=torch.Generator().manual_seed(3))]
    noise = check.eager_grad_noise(model, inputs, weights)
    assert len(noise) == len(params) and all(n >= 0 for n in noise)
    assert noise[0] > 0  # 0.weight: fp32 off float64 on nearby inputs
    assert list(model.parameters()) == params and all(p.dtype == torch.float32 for p in params)


def test_train_step_consults_eager_noise_only_for_gradients_still_wrong(monkeypatch):
    """5 % too large gradients stay wrong against eager's real noise, and pass where the noise
    said eager itself is that far off (the plumbing, both ways)."""
    torch._dynamo.reset()
    model, inputs = two_value_batchnorm()
    rec = train_step(model, inputs, 1e-2, backend=scaled_backward(1.05))
    assert not rec["correct"] and rec["eager_noise_draws"] == check.NEARBY_STEPS, rec
    torch._dynamo.reset()
    monkeypatch.setattr(
        check, "eager_grad_noise", lambda m, xs, w: [1e9] * len(list(m.parameters()))
    )
    rec = train_step(model, inputs, 1e-2, backend=scaled_backward(1.05))
    assert rec["correct"] and not rec["wrong_grads"], rec


class InPlaceOnSaved(nn.Module):
    """sigmoid saves its output for the backward; ``relu_`` then writes it in place: eager's
    backward raises, the functionalized program (AOTAutograd) runs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = torch.sigmoid(self.lin(x))
        y.relu_()
        return y * 2


def test_a_step_eager_refuses_is_judged_against_aot_eager():
    torch.manual_seed(0)
    model, x = InPlaceOnSaved(), torch.randn(3, 4)
    rec = train_step(model, [x], 1e-2)
    assert "modified by an inplace operation" in rec["eager_error"]
    assert rec["judged_against"] == "aot_eager" and rec["correct"], rec
    assert rec["aot_eager_error"] and rec["backend_error"]  # both raise: eager's own error
    torch._dynamo.reset()
    quiet = train_step(model, [x], 1e-2, backend=detached)
    assert not quiet["correct"] and quiet["backend_error"] is None, quiet


def detached(gm: torch.fx.GraphModule, example_inputs: list):
    """A backend that runs the forward without autograd and hands back fresh leaves: its
    step never raises (and computes no gradient)."""

    def run(*args):
        with torch.no_grad():
            outs = gm(*args)
        return [o.detach().requires_grad_() if isinstance(o, torch.Tensor) else o for o in outs]

    return run


def test_a_gradient_zero_in_float64_is_judged_at_the_rounding_of_the_step():
    """A float64-zero gradient (eager's fp32 one 0 too, by symmetry) off by rounding of the
    step's scale passes; one off by a visible fraction of it stays wrong."""
    refs64 = [torch.zeros(4, dtype=torch.float64), 1e6 * torch.ones(3, dtype=torch.float64)]
    floors = check.zero_grad_floors(refs64)
    assert floors == [check.ZERO_GRAD_FLOOR * 1e6, 0.0]
    eager = torch.zeros(4)
    assert grad_verdict(torch.full((4,), 3.0), eager, refs64[0], 1e-2, floors[0]) == "float64"
    assert grad_verdict(torch.full((4,), 3e3), eager, refs64[0], 1e-2, floors[0]) == "wrong"


def test_the_float64_reference_leaves_the_module_as_it_was():
    """The float64 judge runs a float64 copy: the module's parameters keep their data and its
    BatchNorm its running statistics (cast in place and back, a plan of the module then saw a
    changed module and ran in eager: L2_52 in bf16 timed at eager's time with eager's bits)."""
    from experiments.kernelbench.check import float64_outputs

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    x = torch.randn(2, 3, 6, 6)
    ptrs = [t.data_ptr() for t in (*model.parameters(), *model.buffers())]
    stats = [b.clone() for b in model.buffers()]
    ref64 = float64_outputs(model, [x])
    assert ref64 is not None and ref64[0].dtype == torch.float64
    assert ptrs == [t.data_ptr() for t in (*model.parameters(), *model.buffers())]
    assert all(torch.equal(a, b) for a, b in zip(stats, model.buffers()))
