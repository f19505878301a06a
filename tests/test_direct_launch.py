"""The static-launcher binding's decisions, on stand-ins for Triton's CompiledKernel (the launch
itself is checked on CUDA in tests/test_gpu.py)."""

from types import SimpleNamespace

import pytest

from autofuse.plan import direct_launch


def _compiled(signature, constants=None, **md):
    fn = SimpleNamespace(arg_names=list(signature))
    src = SimpleNamespace(fn=fn, signature=signature, constants=constants or {})
    meta = {"num_warps": 4, "shared": 0, "num_ctas": 1, "global_scratch_size": 0}
    meta.update(md)
    return SimpleNamespace(src=src, metadata=SimpleNamespace(**meta), function=1234)


class _Impl:
    def __init__(self):
        self.calls = []

    def _launch_kernel(self, *a):
        self.calls.append(a)


@pytest.fixture
def impl(monkeypatch):
    fake = _Impl()
    monkeypatch.setattr(direct_launch, "_launcher", lambda: fake)
    monkeypatch.setattr(direct_launch, "_hooks_empty", lambda: True)
    monkeypatch.setattr(
        direct_launch.torch._C, "_cuda_getCurrentRawStream", lambda d: 77 + d, raising=False
    )
    return fake


def test_folded_arguments_are_left_out_and_scratch_is_padded(impl):
    sig = {"x": "*fp32", "n": "i32", "one": "i32", "y": "*bf16", "BLOCK": "constexpr"}
    compiled = _compiled(sig, constants={(2,): 1, (4,): 128}, profile_scratch_size=0)
    run = direct_launch.bind(compiled, (3, 2, 1), n_args=4, device=1)
    assert run is not None
    run(["X", 5, 1, "Y"])
    (call,) = impl.calls
    function, gx, gy, gz, warps, shared, codes, args, stream = call
    assert (function, gx, gy, gz, warps, shared, stream) == (1234, 3, 2, 1, 4, 0, 78)
    assert codes == "OiOOO" and args == ("X", 5, "Y", None, None)


@pytest.mark.parametrize(
    "md",
    [{"global_scratch_size": 64}, {"num_ctas": 2}, {"launch_pdl": True}, {"tensordesc_meta": [1]}],
)
def test_what_triton_must_launch_is_left_to_triton(impl, md):
    compiled = _compiled({"x": "*fp32"}, **md)
    assert direct_launch.bind(compiled, (1, 1, 1), n_args=1, device=0) is None


def test_unknown_argument_type_and_missing_launcher(impl, monkeypatch):
    assert direct_launch.bind(_compiled({"x": "*fp32", "t": "nvTmaDesc"}), (1, 1, 1), 2, 0) is None
    monkeypatch.setattr(direct_launch, "_launcher", lambda: None)
    assert direct_launch.bind(_compiled({"x": "*fp32"}), (1, 1, 1), 1, 0) is None


class _Utils:
    """Stands in for Triton's driver utilities: records the binaries loaded."""

    def __init__(self, max_shared=232448, max_threads=1024):
        self.loaded, self.max_shared, self.max_threads = [], max_shared, max_threads

    def get_device_properties(self, device):
        return {"max_shared_mem": self.max_shared}

    def load_binary(self, name, kernel, shared, device):
        self.loaded.append((name, kernel, shared, device))
        return (11, 5678, 32, 0, self.max_threads)


def _restored(**md):
    """A CompiledKernel as a cache entry restores it: not loaded on the device yet."""
    compiled = _compiled({"x": "*fp32", "n": "i32"}, **md)
    compiled.function, compiled.name, compiled.kernel = None, "autofuse_k", b"cubin"
    return compiled


@pytest.mark.parametrize(
    "utils, md, binds",
    [
        (_Utils(), {}, True),
        (_Utils(max_shared=1024), {"shared": 4096}, False),  # does not fit: Triton's error
        (_Utils(max_threads=64), {"num_warps": 4}, False),
    ],
)
def test_a_restored_binary_is_loaded_without_tritons_launcher(impl, monkeypatch, utils, md, binds):
    monkeypatch.setattr(direct_launch, "_driver_utils", lambda: utils)
    monkeypatch.setattr(direct_launch, "_MAX_SHARED", {})
    compiled = _restored(**md)
    run = direct_launch.bind(compiled, (2, 1, 1), n_args=2, device=0)
    assert (run is not None) == binds
    if binds:
        assert utils.loaded == [("autofuse_k", b"cubin", 0, 0)]
        run(["X", 7])
        assert impl.calls[0][0] == 5678  # the function it loaded, not Triton's
