"""AUTOFUSE_CHECK_BOUNDS: every load and store of a kernel is checked against the buffers of its
launch (the interpreter: autofuse/bounds.py; a GPU: guarded sources,
autofuse/kernels/common/guards.py)."""

import dataclasses
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch

from autofuse import settings as af_settings
from autofuse.bounds import BoundsCheckWarning, OutOfBoundsAccess, bounds_error, install
from autofuse.interpreter import interpreting
from autofuse.kernels.common.guards import guard_source
from autofuse.kernels.common.loader import load_guarded, load_kernel

SHIFTED = """
import triton
import triton.language as tl

@triton.jit
def k_shift(in_ptr, out_ptr, n, LOAD_AT: tl.constexpr, STORE_AT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(in_ptr + offs + LOAD_AT, mask=m)
    tl.store(out_ptr + STORE_AT + offs, x * 2, mask=m)
"""

DESCRIPTOR = """
import triton
import triton.language as tl

@triton.jit
def k_desc(in_ptr, out_ptr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    d = tl.make_tensor_descriptor(in_ptr, shape=[ROWS, 8], strides=[8, 1], block_shape=[BLOCK, 8])
    x = d.load([tl.program_id(0) * BLOCK, 0])
    offs = tl.program_id(0) * BLOCK * 8 + tl.arange(0, BLOCK * 8)
    tl.store(out_ptr + offs, tl.reshape(x, [BLOCK * 8]), mask=offs < 32)
"""

ATOMIC = """
import triton
import triton.language as tl

@triton.jit
def k_atomic(in_ptr, out_ptr, AT: tl.constexpr):
    offs = tl.arange(0, 8)
    tl.atomic_add(out_ptr + AT + offs, tl.load(in_ptr + offs))
"""


# kernels launched on CPU tensors in Triton's interpreter (a GPU host runs the gpu test instead)
interpreted = pytest.mark.skipif(not interpreting(), reason="runs kernels in Triton's interpreter")


def _mode(value: str):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOFUSE_CHECK_BOUNDS", value)
        af_settings.reload_settings()
        yield
    af_settings.reload_settings()


@pytest.fixture
def checking():
    yield from _mode("1")


@pytest.fixture
def unchecked():
    yield from _mode("0")


def shift(load_at=0, store_at=0, n=16, block=8):
    fn = load_kernel(SHIFTED, "k_shift")
    x, y = torch.arange(16.0), torch.full((16,), -1.0)
    fn[(-(-n // block),)](x, y, n, LOAD_AT=load_at, STORE_AT=store_at, BLOCK=block)
    return y


def test_setting_is_read_from_the_environment(checking):
    assert af_settings.settings().check_bounds


@interpreted
def test_correct_kernel_passes(checking):
    assert torch.equal(shift(), torch.arange(16.0) * 2)


@interpreted
def test_masked_off_lanes_out_of_range_are_not_flagged(checking):
    """n = 12 in blocks of 8: lanes 12..15 of the second program would pass the end of a
    12-element range but are masked off; 16 elements exist, 12 are written."""
    y = shift(n=12)
    assert torch.equal(y[:12], torch.arange(12.0) * 2) and torch.equal(y[12:], -torch.ones(4))


@interpreted
def test_load_past_the_end_raises_naming_kernel_argument_and_offsets(checking):
    with pytest.raises(OutOfBoundsAccess) as err:
        shift(load_at=3)
    msg = str(err.value)
    assert "kernel k_shift loads from" in msg
    assert "argument 'in_ptr'" in msg and "element offsets [16, 18]" in msg
    assert "3 of 8 active lanes" in msg and "program (1, 0, 0)" in msg
    assert "tl.load(in_ptr + offs + LOAD_AT" in msg


@interpreted
def test_an_overrun_into_a_neighbouring_argument_is_flagged(checking):
    """Two arguments side by side in one storage: the lanes that run past the first land in
    the second, inside a buffer of the launch but not the one their pointer started from."""
    fn = load_kernel(SHIFTED, "k_shift")
    both = torch.arange(32.0)
    x, y = both[:16], both[16:]
    with pytest.raises(OutOfBoundsAccess) as err:
        fn[(2,)](x, y, 16, LOAD_AT=3, STORE_AT=0, BLOCK=8)
    msg = str(err.value)
    assert "3 of 8 active lanes leave argument 'in_ptr'" in msg
    assert "element offsets [16, 18] of it, into argument(s) out_ptr" in msg


@interpreted
def test_store_before_the_start_raises_before_writing(checking):
    with pytest.raises(OutOfBoundsAccess, match=r"k_shift stores to .*'out_ptr'.*\[-2, -1\]"):
        shift(store_at=-2)


@interpreted
def test_off_mode_does_not_check(unchecked):
    shift(store_at=0, load_at=1, n=15)  # reads element 15 of 16 (in bounds); nothing raised


@interpreted
def test_descriptor_within_its_shape_is_padded_not_flagged(checking):
    fn = load_kernel(DESCRIPTOR, "k_desc")
    x, y = torch.arange(32.0), torch.zeros(32)
    fn[(2,)](x, y, ROWS=4, BLOCK=4)  # the second block's rows 4..7 lie past the shape: padded
    assert torch.equal(y, torch.cat([torch.arange(32.0)]))


@interpreted
def test_descriptor_larger_than_its_buffer_raises(checking):
    fn = load_kernel(DESCRIPTOR, "k_desc")
    x, y = torch.arange(32.0), torch.zeros(32)
    with pytest.raises(OutOfBoundsAccess, match=r"k_desc loads .*'in_ptr'.*\[32, 63\]"):
        fn[(2,)](x, y, ROWS=8, BLOCK=4)


@interpreted
def test_atomics_are_checked(checking):
    fn = load_kernel(ATOMIC, "k_atomic")
    x, y = torch.ones(8), torch.zeros(12)
    fn[(1,)](x, y, AT=4)
    assert torch.equal(y[4:], torch.ones(8))
    with pytest.raises(OutOfBoundsAccess, match=r"k_atomic updates .*'out_ptr'.*\[12, 13\]"):
        fn[(1,)](x, y, AT=6)


@interpreted
def test_generated_kernel_with_a_wrong_index_is_named(checking):
    from autofuse.capture.trace import capture
    from autofuse.partition.partitioner import Partitioner
    from autofuse.plan.runtime import build_plan, launch

    x = torch.randn(4, 8)
    graph = capture(lambda t: (t * 2 + 1,), (x,)).graph
    kernel = build_plan(graph, Partitioner(graph).greedy().groups).kernels[0]
    launch(kernel, [x, torch.empty(4, 8)])  # as generated: in bounds
    assert "tl.store(out_ptr0 + (" in kernel.source
    bad = dataclasses.replace(
        kernel, source=kernel.source.replace("tl.store(out_ptr0 + (", "tl.store(out_ptr0 + 5 + (")
    )
    with pytest.raises(OutOfBoundsAccess, match=rf"kernel {kernel.name} stores to.*'out_ptr0'"):
        launch(bad, [x, torch.empty(4, 8)])


def test_bounds_error_is_found_through_the_interpreters_wrapping():
    inner = OutOfBoundsAccess("kernel k")
    try:
        try:
            raise inner
        except OutOfBoundsAccess as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as outer:
        assert bounds_error(outer) is inner
    assert bounds_error(ValueError("x")) is None


def test_an_interpreter_without_the_entry_points_warns_once_and_runs_unchecked(checking):
    from autofuse import bounds

    fake = types.SimpleNamespace(InterpreterBuilder=object, GridExecutor=object)
    bounds._WARNED.clear()
    with pytest.warns(BoundsCheckWarning, match="create_masked_load"):
        install(fake)
    install(fake)  # no second warning (pytest's filter would turn it into an error)
    bounds._WARNED.clear()


def test_guarded_source_asserts_each_access_against_its_extent():
    g = guard_source(textwrap.dedent(SHIFTED), "k_shift")
    assert dict(g.extents) == {"in_ptr": "in_ptr_af_extent", "out_ptr": "out_ptr_af_extent"}
    assert g.source.count("tl.device_assert(") == 2
    assert "def k_shift(in_ptr, out_ptr, n, in_ptr_af_extent, out_ptr_af_extent, LOAD_AT" in (
        g.source
    )
    assert "(offs + LOAD_AT < in_ptr_af_extent) | (m == 0)" in g.source


@interpreted
def test_guarded_kernel_traps_past_the_end_and_passes_in_bounds(unchecked):
    """The GPU variant, run here in the interpreter (which runs device asserts): the guard
    fires on the shifted store, not on masked-off lanes nor on a correct launch."""
    fn = load_guarded(SHIFTED, "k_shift")
    x, y = torch.arange(16.0), torch.zeros(16)
    fn[(2,)](x, y, 12, LOAD_AT=0, STORE_AT=0, BLOCK=8)
    assert torch.equal(y[:12], torch.arange(12.0) * 2)
    with pytest.raises(Exception, match="autofuse bounds: kernel k_shift line .*outside argument"):
        fn[(2,)](x, y, 16, LOAD_AT=0, STORE_AT=1, BLOCK=8)


@interpreted
def test_guarded_variants_of_generated_kernels_run_and_agree(checking, monkeypatch, home):
    """The loader's GPU branch (guarded sources, extents passed at launch) on generated
    kernels of several kinds, run here in the interpreter with its asserts: no guard fires on
    correct kernels and the results are eager's."""
    import torch.nn.functional as F

    import autofuse
    from autofuse.kernels.common import loader

    monkeypatch.setattr(loader, "interpreting", lambda: False)
    guarded = []

    def counted(source, name):
        guarded.append(guard_source(source, name))
        return guarded[-1]

    monkeypatch.setattr(loader, "guard_source", counted)
    x, i = torch.randn(4, 8), torch.randint(0, 8, (4, 5))
    for fn, args in [
        (lambda t: torch.softmax(t * 2, -1), (x,)),
        (lambda t, j: torch.gather(t, 1, j) + 1, (x, i)),
        (lambda t, j, s: t.scatter_add(1, j, s) * 2, (x, i, torch.randn(4, 5))),
        (lambda t: F.group_norm(t, 2), (torch.randn(2, 8, 1, 1),)),
    ]:
        torch.testing.assert_close(autofuse.optimize(fn, args)(*args), fn(*args))
    assert sum(len(g.extents) for g in guarded) >= 8  # loads and stores of 4+ kernels


@pytest.mark.gpu
def test_gpu_guarded_kernel_traps_on_a_store_past_the_end():
    """On a GPU the failed guard is a device-side assert, which leaves the CUDA context
    unusable: the bad launch runs in a child process; a correct one runs here."""
    os.environ["AUTOFUSE_CHECK_BOUNDS"] = "1"
    try:
        af_settings.reload_settings()
        fn = load_kernel(SHIFTED, "k_shift")
        x, y = torch.arange(16.0, device="cuda"), torch.zeros(16, device="cuda")
        fn[(2,)](x, y, 16, LOAD_AT=0, STORE_AT=0, BLOCK=8)
        assert torch.equal(y.cpu(), torch.arange(16.0) * 2)
    finally:
        os.environ.pop("AUTOFUSE_CHECK_BOUNDS")
        af_settings.reload_settings()
    code = (
        "import torch\nfrom autofuse.kernels.common.loader import load_kernel\n"
        f"fn = load_kernel({SHIFTED!r}, 'k_shift')\n"
        "x, y = torch.arange(16.0, device='cuda'), torch.zeros(16, device='cuda')\n"
        "fn[(2,)](x, y, 16, LOAD_AT=0, STORE_AT=3, BLOCK=8)\ntorch.cuda.synchronize()\n"
    )
    env = dict(os.environ, AUTOFUSE_CHECK_BOUNDS="1")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode != 0
    assert "autofuse bounds: kernel k_shift" in r.stdout + r.stderr
