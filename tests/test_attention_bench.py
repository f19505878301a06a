"""experiments/bench/attention_bench.py compares each eager-written variant with SDPA given "the
same mask": check on CPU that the two compute the same thing, and that autofuse's greedy plan
for each is one fused attention kernel equal to eager (interpreter, tiny shapes)."""

import pytest
import torch

import autofuse
from experiments.bench.attention_bench import VARIANTS, make


@pytest.mark.parametrize("variant", VARIANTS)
def test_sdpa_twin_and_autofuse_match_the_eager_variant(variant):
    fn, args, sdpa, flops = make(variant, 2, 4, 19, 16, dtype=torch.float32, device="cpu")
    want = fn(*args)
    torch.testing.assert_close(sdpa(*args), want, rtol=1e-4, atol=1e-4)
    assert flops > 0
    fast = autofuse.optimize(fn, args)
    assert [k.info.kind for k in fast.plan.kernels][-1] == "attention"
    assert not fast.plan.fallbacks
    torch.testing.assert_close(fast(*args), want, rtol=1e-4, atol=1e-4)


def test_backward_phase_is_the_difference_of_the_passes():
    from experiments.bench.attention_bench import _backward_phase

    rec = {"passes": {
        "forward": {"us": {"eager": 100.0, "autofuse greedy": 40.0, "autofuse tuned": 30.0},
                    "autofuse_best_us": 30.0},
        "forward+backward": {"us": {"eager": 350.0, "autofuse": 130.0}},
    }}  # fmt: skip
    _backward_phase(rec, flops=1e9, peak=1e15)
    b = rec["backward_only"]
    assert b["us"] == {"eager": 250.0, "autofuse": 100.0}
    assert b["tflops"]["autofuse"] == pytest.approx(2.5e9 / 100e-6 / 1e12)
