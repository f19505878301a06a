"""experiments/bench/bench_models.py end to end on CPU (Triton's interpreter): one tiny model, inference
and a training step, eager and autofuse, one round; the JSON has both records, correct."""

import json

import pytest
import torch

pytest.importorskip("transformers")

from experiments.bench import bench_models  # noqa: E402
from experiments.correctness import model_grads  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py


def test_bench_models_tiny_cpu(tmp_path):
    doc = bench_models.main([
        "--out", str(tmp_path), "--size", "tiny", "--device", "cpu", "--models", "llama_sdpa",
        "--modes", "inference,train", "--backends", "eager,autofuse", "--rounds", "1",
        "--tag", "t",
    ])  # fmt: skip
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["stamp"]["commit"] and saved["not_run"] == []
    cases = {(c["model"], c["mode"]): c for c in saved["cases"]}
    assert set(cases) == {("llama_sdpa", "inference"), ("llama_sdpa", "train")}
    assert len(doc["cases"]) == 2
    for (_, mode), c in cases.items():
        assert "error" not in c, c.get("error")
        assert set(c["backends"]) == {"eager", "autofuse"}
        af = c["backends"]["autofuse"]
        assert c["autofuse_correct"] is True and af["correct"] is True, af
        assert af["max_rel_err_out"] <= c["tolerance"]
        for b in ("eager", "autofuse"):
            t = c["backends"][b]["times_us"]
            assert 0 < t["min"] <= t["median"] and len(t["rounds"]) == 1
            assert c["backends"][b]["compile_s"] > 0
        assert c["speedup_autofuse_vs_eager"] > 0
        assert af["kernels"] > 0 and af["kernels"] == sum(g["kernels"] for g in af["graphs"])
        kinds = {g["kind"] for g in af["graphs"]}
        assert kinds == ({"inference"} if mode == "inference" else {"forward", "backward"})
        assert any("scaled_dot_product" in op for op in af["eager_ops"])  # SDPA: an eager step
        if mode == "train":
            assert af["n_grads"] > 0 and af["grads_over_tol"] == [] and af["grads_missing"] == []


def test_16bit_gradients_are_judged_against_float32_truth():
    truth = {"w": torch.tensor([1.0, -2.0, 4.0]), "b": torch.tensor([0.5, 0.25])}
    eager = {"w": truth["w"] * 1.04, "b": truth["b"] * 1.01}  # eager bf16: 4% off on w
    close = {"w": truth["w"] * 0.94, "b": truth["b"]}  # 6% off: within twice eager's error
    far = {"w": truth["w"], "b": truth["b"] * 1.2}  # 20% off where eager is 1% off
    ok = model_grads.grad_errors_vs_float32(close, eager, truth, tol=0.03)
    assert ok["grads_vs_fp32_over_bound"] == []
    assert ok["eager_grads_vs_fp32_max_err_scaled"] == pytest.approx(0.04, rel=1e-3)
    bad = model_grads.grad_errors_vs_float32(far, eager, truth, tol=0.03)
    assert bad["grads_vs_fp32_over_bound"] == ["b"]
    assert bad["grads_vs_fp32_max_err_scaled"] == pytest.approx(0.2, rel=1e-3)  # |0.1| / max|b|


def test_kernel_profile_ranks_what_a_step_launches():
    from experiments.probes.kernel_profile import kernel_times

    a, b = torch.randn(256, 256), torch.randn(256)

    def step():
        for _ in range(4):
            torch.mm(a, a)
        b.exp()

    prof = kernel_times(step, runs=2, device="cpu")
    names = {row[0]: row for row in prof["kernels"]}
    assert names["aten::mm"][2] == 4 and names["aten::exp"][2] == 1  # launches per step
    assert prof["kernels"][0][0] == "aten::mm" and prof["total_us"] > 0
