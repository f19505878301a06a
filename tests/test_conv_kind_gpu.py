"""The convolution kind on CUDA (skipped without a GPU): every config of its space verified
against the float64 reference at realistic shapes (ResNet 3x3, 1x1, depthwise, 1-D strided,
3-D, stride-1 transposed; fp32 as IEEE, bf16), fp32 under TF32 against eager's own TF32
convolution, and a probe of the 8-warp tiles the kind leaves out for kernels of more than one
tap (pytorch #173068): its verdict says whether that cap can go."""

from __future__ import annotations

import pytest
import torch

from autofuse.capture.trace import capture
from autofuse.kernels import GemmConfig, analyze_group, config_space
from autofuse.partition.partitioner import Partitioner
from tests.helpers import assert_close

pytestmark = pytest.mark.gpu

nn = torch.nn
CASES = [
    ("resnet_3x3", lambda: nn.Conv2d(64, 64, 3, padding=1), (8, 64, 56, 56), torch.bfloat16),
    ("one_by_one", lambda: nn.Conv2d(256, 128, 1), (8, 256, 28, 28), torch.bfloat16),
    ("depthwise", lambda: nn.Conv2d(128, 128, 3, padding=1, groups=128), (8, 128, 28, 28),
     torch.float32),
    ("conv1d_strided", lambda: nn.Conv1d(64, 64, 5, stride=2, padding=2), (8, 64, 512),
     torch.bfloat16),
    ("conv3d", lambda: nn.Conv3d(16, 32, 3, padding=1), (2, 16, 8, 16, 16), torch.float32),
    ("transposed_stride1", lambda: nn.ConvTranspose2d(32, 16, 3, padding=1), (4, 32, 16, 16),
     torch.bfloat16),
]  # fmt: skip


def _conv_group(make, shape, dtype):
    torch.manual_seed(0)
    model = nn.Sequential(make(), nn.ReLU()).to("cuda", dtype)
    x = torch.randn(shape, device="cuda", dtype=dtype)
    graph = capture(model, (x,)).graph
    (group,) = [g for g in Partitioner(graph).greedy().groups
                if any(graph[i].kind == "opaque" for i in g)]  # fmt: skip
    return model, x, graph, analyze_group(graph, group)


@pytest.fixture
def ieee_fp32():
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = before


@pytest.mark.parametrize("name,make,shape,dtype", CASES, ids=[c[0] for c in CASES])
def test_every_config_on_gpu(ieee_fp32, name, make, shape, dtype):
    from autofuse.measure import Candidate, verify_candidate

    _, _, graph, info = _conv_group(make, shape, dtype)
    space = config_space(info, graph)
    assert space
    for cfg in space:
        assert verify_candidate(Candidate(graph, info, cfg), "cuda") is None, (name, cfg.label())


def test_tf32_follows_cudnn_on_gpu(monkeypatch):
    """fp32 under torch.backends.cudnn.allow_tf32 (on by default): TF32 dots, within TF32's
    error of eager's own (TF32) cuDNN convolution."""
    import autofuse

    monkeypatch.setenv("AUTOFUSE_CONV_KERNEL", "kernel")
    from autofuse.settings import reload_settings

    reload_settings()
    try:
        before = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = True
        model, x, _, _ = _conv_group(CASES[0][1], CASES[0][2], torch.float32)
        with torch.no_grad():
            fast = autofuse.optimize(model, (x,))
            got, want = fast(x), model(x)
        (kernel,) = [k for k in fast.plan.kernels if k.info.kind == "conv"]
        assert "input_precision='tf32'" in kernel.source
        assert_close(got, want, torch.float16, "tf32")  # fp16's tolerance: TF32's mantissa
    finally:
        torch.backends.cudnn.allow_tf32 = before
        monkeypatch.undo()
        reload_settings()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_eight_warps_probe(ieee_fp32, dtype):
    """Tiles of 8 warps on a 3x3 kernel, which the kind's space leaves out (pytorch #173068
    saw Inductor's convolution template go wrong with 8 warps): a failure here confirms the
    cap, a pass over a GPU's runs says the cap may go."""
    from autofuse.measure import Candidate, verify_candidate

    _, _, graph, info = _conv_group(CASES[0][1], CASES[0][2], dtype)
    for cfg in (GemmConfig(128, 128, 32, 8, 8, 3), GemmConfig(128, 256, 32, 8, 8, 3),
                GemmConfig(256, 64, 32, 8, 8, 4)):  # fmt: skip
        assert verify_candidate(Candidate(graph, info, cfg), "cuda") is None, cfg.label()
