"""One build per kernel code: sources that differ only in comments (whole-line headers or
after a statement, such as the buffer names each front end gives a module's inputs) share one
built kernel; a ``#`` inside a string is code. Through the interpreter on CPU."""

import warnings

import pytest
import torch

import autofuse
from autofuse.kernels.common import loader

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py

_SOURCE = """import triton
import triton.language as tl


# {header}
@triton.jit
def copy_{n}(in_ptr, out_ptr, XBLOCK: tl.constexpr):
    x = tl.arange(0, XBLOCK)
    v = tl.load(in_ptr + x)  # {inline}
    tl.static_assert(XBLOCK > 0, "{text}")
    tl.store(out_ptr + x, v)
"""


def _built(**parts) -> object:
    return loader.load_kernel(_SOURCE.format(**parts), f"copy_{parts['n']}")


def test_sources_differing_in_comments_share_one_build_strings_do_not():
    before = loader.kernels_built()
    one = _built(n=1, header="reads arg0_1", inline="load arg0_1", text="a")
    two = _built(n=1, header="reads primals_1", inline="load primals_1", text="a")
    assert one is two and loader.kernels_built() == before + 1
    three = _built(n=1, header="reads arg0_1", inline="load arg0_1", text="a # b")
    assert three is not one and loader.kernels_built() == before + 2


def test_a_module_built_by_both_front_ends_builds_its_kernels_once():
    m = torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Softmax(-1))
    x = torch.randn(8, 16)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = autofuse.optimize(m, (x,))
        torch.testing.assert_close(first(x), m(x))
        before = loader.kernels_built()
        torch.testing.assert_close(torch.compile(m, backend="autofuse")(x), m(x))
    assert loader.kernels_built() == before
