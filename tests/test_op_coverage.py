"""Every IR op class the compiler core lists, through the interpreter: each pointwise op, each
reduction over single dims, sets of dims and with keepdim, in fp32, bf16 and fp16."""

import pytest
import torch

from autofuse.capture.trace import capture
from autofuse.partition.partitioner import Partitioner

from .helpers import check_partitions


def all_pointwise(x, y, m):
    # floor/ceil/round take x * 4, exact in every float format: a discontinuous op on a value
    # rounded to bf16 first would legitimately differ from the fp32 reference by one
    a = torch.abs(x) + 0.5
    out = [
        -x, torch.abs(x), torch.exp(x), torch.log(a), torch.sqrt(a), torch.rsqrt(a),
        torch.sigmoid(x), torch.tanh(x), torch.erf(x), torch.sin(x), torch.cos(x), torch.relu(x),
        torch.nn.functional.gelu(x), torch.nn.functional.gelu(x, approximate="tanh"),
        torch.nn.functional.silu(x), x.pow(3), a.pow(0.5), a.pow(-1.5), torch.where(m, x, y),
        torch.maximum(x, y), torch.minimum(x, y), x.clamp(-0.5, 0.7), torch.round(x * 4),
        torch.floor(x * 4), torch.ceil(x * 4), torch.sign(x), (x > y).to(x.dtype),
        (x <= 0.25).to(x.dtype), ((x > 0) & m).to(x.dtype), ((x > 0) | ~m).to(x.dtype),
        x.float().to(x.dtype), x.masked_fill(m, -2.0), x / y.abs().add(1.0), x - y * 2.0,
    ]  # fmt: skip
    return tuple(out)


def all_reductions(x):
    return (
        x.sum(-1), x.mean(0), x.amax(1, keepdim=True), x.amin(-1), x.prod(1),
        x.var(0), x.sum((0, 2)), x.mean((1, 2), keepdim=True), x.amax((0, 1)), x.sum(),
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_pointwise_op(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 24, generator=g).to(dtype)
    y = torch.randn(5, 24, generator=g).to(dtype)
    m = torch.rand(5, 24, generator=g) < 0.5
    graph = capture(all_pointwise, (x, y, m)).graph
    assert {"round", "floor", "ceil", "sign", "where", "clamp", "pow_scalar", "cast"} <= {
        n.op for n in graph.nodes
    }
    check_partitions(
        all_pointwise, (x, y, m), dtype, configs_per_group=2, max_enumerate=1, sample=4
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_reduction(dtype):
    x = (torch.rand(4, 6, 10, generator=torch.Generator().manual_seed(1)) + 0.5).to(dtype)
    check_partitions(all_reductions, (x,), dtype, configs_per_group=3, max_enumerate=1, sample=4)


def test_multi_dim_reductions_are_one_kernel_each():
    x = torch.randn(4, 6, 10)
    space = Partitioner(capture(all_reductions, (x,)).graph)
    kinds = [space.check(g).kind for g in space.greedy().groups]
    assert all(k == "reduction" for k in kinds)
