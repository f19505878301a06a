"""experiments/attention_bench.py compares each eager-written variant with SDPA given "the
same mask": check on CPU that the two compute the same thing, and that autofuse's greedy plan
for each is one fused attention kernel equal to eager (interpreter, tiny shapes)."""

import pytest
import torch

import autofuse
from experiments.attention_bench import VARIANTS, make


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
