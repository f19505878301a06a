"""experiments.probes.conv_layout on CPU with an injected timer: the first convolution is found, every
variant computes the model's own result, and the record holds both layout ratios."""

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
