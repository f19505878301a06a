"""A GroupNorm row of a channels-last convolution's result, split (``ir/split.py``): the row is
(C/G, HxW) as two dims (``capture/decompositions.py``), a view of the channels-last buffer; its
chunks cut the pixels, a group's channels whole in every chunk, read in memory's order
(``[N, G, C/G, k, L]`` as ``[N, k, L, G, C/G]``), where a chunk of the flattened row held one
channel of some pixels, one element per pixel's channels read (L2_92's statistics: 973 us on
the H100 against 305 for the contiguous plan). Eager's values through both front ends, forward
and backward; the contiguous layout's split is the flattened row's as before."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse.ir.conv_layout import channels_last_strides
from autofuse.ir.graph import Graph, Node, contiguous_strides, make_attrs
from autofuse.ir.split import SplitPolicy, decide
from autofuse.ir.split_layout import nested, outermost

from .helpers import assert_close, backend_training_matches

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py


def _group_rows(shape, groups: int, kept: bool) -> Graph:
    """x -> relu (kept channels-last with ``kept``) -> viewed (N, G, C/G, HxW) -> sum over the
    group's channels and pixels."""
    n, c = shape[:2]
    plain = contiguous_strides(shape)
    attrs = make_attrs(eager_strides=plain) if kept else ()
    strides = channels_last_strides(shape) if kept else plain
    rows = (n, groups, c // groups, (shape[2] * shape[3]))
    nodes = (
        Node("input", (), shape, "float32", plain, make_attrs(index=0), "x"),
        Node("relu", (0,), shape, "float32", strides, attrs, "relu"),
        Node("reshape", (1,), rows, "float32", contiguous_strides(rows), make_attrs(shape=rows),
             "rows"),
        Node("sum", (2,), (n, groups), "float32", (groups, 1),
             make_attrs(dims=(2, 3), keepdim=False), "stats"),
    )  # fmt: skip
    return Graph(nodes, (0,), (3,))


def test_the_channels_last_row_is_cut_along_its_pixels():
    # L2_92's shape: 128 x 16 groups of 4 channels x 126^2 pixels, an outer reduction read so
    dec = decide(_group_rows((128, 64, 126, 126), 16, True), 3, SplitPolicy())
    assert dec.k > 1 and "outer" in dec.reason, dec
    assert (dec.dim, max(dec.last, dec.dim)) == (3, 3)  # the pixels cut, the channels whole
    assert 15876 % dec.k == 0
    assert dec.order == (0, 3, 4, 1, 2)  # [N, G, C/G, k, L] read as [N, k, L, G, C/G]


def test_the_contiguous_row_is_cut_as_one_run():
    # 8 rows of 4 x 16384: too few to fill the SMs, an inner reduction: the merged run cut
    dec = decide(_group_rows((2, 16, 128, 128), 4, False), 3, SplitPolicy())
    assert dec.k > 1 and "inner" in dec.reason and (dec.dim, dec.last) == (2, 3), dec
    assert dec.order == ()


def test_nested_and_outermost():
    shape, cl = (2, 4, 4, 100), (1600, 4, 1, 16)  # (N, G, C/G, HW) of a channels-last (2,16,..)
    assert not nested(shape, cl, 2, 3) and nested(shape, None, 2, 3)
    assert nested(shape, contiguous_strides(shape), 1, 3)
    assert outermost(shape, cl, (2, 3)) == 3 and outermost((2, 1, 1), (1, 1, 1), (1, 2)) == 1


class _ConvGroupNorm(torch.nn.Module):
    """L2_92's shape of graph: Conv2d -> GroupNorm -> tanh -> + conv -> logsumexp over C."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 32, 3)
        self.norm = torch.nn.GroupNorm(8, 32)

    def forward(self, x):
        y = self.conv(x)
        return torch.logsumexp(torch.tanh(self.norm(y)) + y, dim=1, keepdim=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_split_channels_last_group_norm_gives_eagers_values(dtype, cl_split):
    net = _ConvGroupNorm().to(dtype)
    x = torch.randn(2, 3, 18, 18, dtype=dtype)
    with torch.no_grad():
        opt = autofuse.optimize(net, (x,))
        assert_close(opt(x), net(x), dtype, "optimize")
    g = opt.plan.graph
    (view,) = [n for n in g.nodes if n.name.endswith(".chunks_t")]
    assert view.op == "permute" and view.shape[-2:] == (8, 4)  # the groups, their channels
    backend_training_matches(net, x, dtype, "group norm")


def test_group_norm_of_a_single_pixel_and_of_3d_inputs():
    """(N, C) and (N, C, D, H, W) rows through the two-dim view: eager's values and stats."""
    torch.manual_seed(0)
    for shape in [(4, 6), (2, 6, 3, 4, 5), (3, 6, 7)]:
        x = torch.randn(shape)
        w, b = torch.randn(6), torch.randn(6)

        def f(x, w, b):
            return F.group_norm(x, 3, w, b) * 2

        with torch.no_grad():
            assert_close(autofuse.optimize(f, (x, w, b))(x, w, b), f(x, w, b), torch.float32,
                         str(shape))  # fmt: skip
