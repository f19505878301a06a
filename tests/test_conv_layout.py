"""experiments.probes.conv_layout on CPU with an injected timer: the first convolution is found, every
variant computes the model's own result, and the record holds both layout ratios."""

import os

import torch

from experiments.kernelbench.problems import Problem
from experiments.probes import conv_layout

PROBLEM = """
import torch
class Model(torch.nn.Module):
    def __init__(self, c_in, c_out):
        super().__init__()
        self.conv = torch.nn.Conv2d(c_in, c_out, 3)
    def forward(self, x):
        return torch.relu(self.conv(x)) * 2
batch_size = 2
c_in, c_out, height, width = 3, 8, 10, 10
def get_inputs():
    return [torch.randn(batch_size, c_in, height, width)]
def get_init_inputs():
    return [c_in, c_out]
"""


def test_conv_layout_record_on_cpu(tmp_path):
    path = tmp_path / "level2" / "1_Conv2d_ReLU.py"
    path.parent.mkdir()
    path.write_text(PROBLEM)
    problem = Problem(2, 1, "Conv2d_ReLU", path)
    calls = []

    def timer(fn):
        calls.append(fn())
        return 1e-3 * len(calls)

    row = conv_layout.time_problem(problem, torch.float32, 2, timer, "cpu", "small", lambda m: m)
    assert row["conv"] == "Conv2d" and row["conv_input_shape"] == [2, 3, 10, 10]
    assert set(row["median_s"]) == {"conv_contiguous", "conv_channels_last", "eager_contiguous",
                                    "eager_channels_last", "compile_default"}  # fmt: skip
    assert len(calls) == 10 and row["conv_cl_speedup"] > 0
    torch.testing.assert_close(calls[2], calls[3])  # the model in both layouts: one result
    torch.testing.assert_close(calls[0], calls[1])
    assert calls[1].is_contiguous(memory_format=torch.channels_last)


def test_conv_profile_arms_set_their_settings_and_restore_them(monkeypatch):
    """conv_profile's autofuse arms build under their own settings (BatchNorm folded, every
    convolution channels-last) and leave the settings as they found them."""
    from autofuse.settings import settings
    from experiments.probes.conv_profile import build

    monkeypatch.delenv("AUTOFUSE_BN_FOLD", raising=False)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, bias=False), torch.nn.BatchNorm2d(4))
    net.eval()
    x = torch.randn(1, 3, 5, 5)
    with torch.no_grad():
        folded = build("autofuse folded", net, [x])
        plain = build("autofuse greedy", net, [x])
        torch.testing.assert_close(folded(x), net(x), rtol=1e-4, atol=1e-4)
    assert any(n.attr("folded") for n in folded.plan.graph.nodes)
    assert not any(n.attr("folded") for n in plain.plan.graph.nodes)
    assert settings().bn_fold == "measure" and "AUTOFUSE_BN_FOLD" not in os.environ


def test_conv_profile_rows_by_stride_arm_restores_the_settings(monkeypatch):
    """The rows-by-stride arm builds a correct plan under its settings and leaves the row
    order, the layout rule and the split as they were."""
    from autofuse.settings import settings
    from experiments.probes.conv_profile import build

    for name in ("AUTOFUSE_REDUCTION_ORDER", "AUTOFUSE_SPLIT_REDUCTIONS", "AUTOFUSE_CONV_LAYOUT"):
        monkeypatch.delenv(name, raising=False)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.GroupNorm(2, 8))
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        fn = build("autofuse rows by stride, channels_last, unsplit", net, [x])
        torch.testing.assert_close(fn(x), net(x), rtol=1e-4, atol=1e-4)
    s = settings()
    assert (s.reduction_order, s.conv_layout, s.split_reductions) == ("domain", "measure", "auto")


def test_conv_profile_totals_every_kernel_by_kind():
    """The record's totals cover every kernel, not only the twelve longest it lists."""
    from experiments.probes.conv_profile import by_kind

    kernels = [("triton_poi_fused_0", 5.0), ("sm90_xmma_fprop", 7.5)]
    kernels += [(f"autofuse_poi_fused_add_{i}", 1.0) for i in range(20)]
    assert by_kind(kernels) == {"generated": 25.0, "other": 7.5}
