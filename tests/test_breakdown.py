"""experiments.bench.breakdown: kernel names sorted into classes, busy time as a union of intervals,
and the tool on CPU (ATen ops stand in for kernels) on a tiny model's training step."""

import json

import pytest
import torch

from experiments.bench import breakdown

NAMES = {
    "autofuse_att_fused_amax_div_exp_mm_0": "attention",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma": "attention",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "gemm",
    "autofuse_mm_fused_add_gelu_mm_1": "gemm",
    "aten::addmm": "gemm",
    "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32": "conv",
    "autofuse_per_fused_add_mean_mul_rsqrt_2": "fused",
    "triton_per_fused_native_layer_norm_0": "fused",
    "Memcpy DtoD (Device -> Device)": "copy",
    "void at::native::elementwise_kernel<128, 2, copy_kernel>": "copy",
    "void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>": "eager",
}


@pytest.mark.parametrize("name,cls", sorted(NAMES.items()))
def test_classify(name, cls):
    assert breakdown.classify(name) == cls


def test_busy_time_is_the_union_of_intervals():
    assert breakdown.busy_us([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17
    assert breakdown.busy_us([]) == 0


def test_summarize_per_phase_per_step():
    kernels = [("forward", "aten::addmm", 0, 4), ("forward", "autofuse_poi_x_0", 4, 6),
               ("backward", "aten::mm", 10, 18)]  # fmt: skip
    out = breakdown.summarize({"forward": 20.0, "backward": 20.0}, kernels, runs=2)
    assert out["forward"]["kernel_us"]["gemm"] == 2 and out["forward"]["kernel_us"]["fused"] == 1
    assert out["forward"]["busy_us"] == 3 and out["forward"]["host_gap_us"] == 7
    assert out["backward"]["launches"] == 0.5


def test_a_training_step_on_cpu_by_phase():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    state = {}

    def forward():
        model.zero_grad(set_to_none=True)
        state["loss"] = model(x).pow(2).mean()

    phases = [("forward", forward), ("backward", lambda: state.pop("loss").backward()),
              ("optimizer", opt.step)]  # fmt: skip
    out = breakdown.profile_phases(phases, runs=2, device="cpu")
    assert list(out) == ["forward", "backward", "optimizer"]
    assert out["forward"]["kernel_us"]["gemm"] > 0 and out["forward"]["launches"] >= 3
    assert all(p["wall_us"] >= p["busy_us"] >= 0 for p in out.values())


def test_the_tool_runs_on_cpu_on_a_tiny_model(tmp_path):
    pytest.importorskip("transformers")
    rec = breakdown.main(["--models", "bert", "--size", "tiny", "--device", "cpu",
                          "--backends", "eager,autofuse", "--runs", "1", "--out", str(tmp_path)])  # fmt: skip
    saved = json.loads((tmp_path / "breakdown.json").read_text())
    assert saved == json.loads(json.dumps(rec))
    for backend in ("eager", "autofuse"):
        phases = saved["models"]["bert"][backend]
        assert "error" not in phases, phases
        assert set(phases) == {"forward", "backward", "optimizer"}
    assert saved["models"]["bert"]["eager"]["forward"]["kernel_us"]["gemm"] > 0


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="unknown \\['inductr'\\]"):
        breakdown.backends(torch.nn.Linear(2, 2), ["eager", "inductr"])
