"""An opaque op's recorded arguments are decoded once, when its step is bound: node tensors and
the run's device each call, every constant (dtypes, layouts, memory formats, complex scalars,
int lists) made once and never changed by a call; a convolution runs through torch's bound
function of the same schema. Each result equals the ATen op called directly."""

import torch

from autofuse.ir.eager import eval_node
from autofuse.ir.graph import Node


def _seq(kind: str, *items):
    return ("__seq__", kind, tuple(items))


def _opaque(target: str, args, kwargs=(), shape=(1,), dtype="float32") -> Node:
    attrs = (("args", args), ("kwargs", tuple(kwargs)), ("target", target))
    return Node("opaque", (), tuple(shape), dtype, (1,) * len(shape), attrs)


def test_node_sequences_and_constants_decode_as_recorded_each_call():
    cat = _opaque(
        "aten.cat.default", _seq("tuple", _seq("list", ("__node__", 1), ("__node__", 0)), 1)
    )
    for _ in range(2):  # the second call reads its own tensors, the constants unchanged
        a, b = torch.randn(2, 3), torch.randn(2, 2)
        torch.testing.assert_close(eval_node(cat, [a, b]), torch.cat([b, a], 1))


def test_dtype_device_layout_memory_format_and_complex_arguments():
    kw = (
        ("device", ("__device__",)),
        ("dtype", ("__dtype__", "float64")),
        ("layout", ("__layout__", "torch.strided")),
        ("pin_memory", False),
    )
    full = _opaque("aten.full.default", _seq("tuple", _seq("list", 2, 3), 1.5), kw, (2, 3))
    out = eval_node(full, [])
    assert out.dtype == torch.float64 and out.device.type == "cpu"
    torch.testing.assert_close(out, torch.full((2, 3), 1.5, dtype=torch.float64))
    x = torch.randn(2, 3, 4, 5)
    fmt = (("memory_format", ("__memory_format__", "torch.channels_last")),)
    clone = _opaque("aten.clone.default", _seq("tuple", ("__node__", 0)), fmt, x.shape)
    assert eval_node(clone, [x]).is_contiguous(memory_format=torch.channels_last)
    z = torch.randn(3, dtype=torch.complex64)
    mul = _opaque("aten.mul.Scalar", _seq("tuple", ("__node__", 0), ("__complex__", 0.5, 2.0)))
    torch.testing.assert_close(eval_node(mul, [z]), z * complex(0.5, 2.0))


def test_a_convolution_through_the_bound_function_equals_aten():
    x, w, b = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3), torch.randn(4)
    ints = [_seq("list", 1, 1), _seq("list", 1, 1), _seq("list", 1, 1), False, _seq("list", 0, 0)]
    args = _seq("tuple", ("__node__", 0), ("__node__", 1), ("__node__", 2), *ints, 1)
    conv = _opaque("aten.convolution.default", args, (), (2, 4, 6, 6))
    want = torch.ops.aten.convolution.default(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    torch.testing.assert_close(eval_node(conv, [x, w, b]), want)
