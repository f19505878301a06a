"""Classes of failure that the differential fuzzer found with real kernels on a GPU, one test per
class, reproduced here on the CPU: through both front ends, forward and backward where inputs
require grad, and where the class needs a GPU to show, through the code path it takes there."""

import signal

import pytest
import torch

import autofuse
from autofuse.frontend import dynamo as af_dynamo
from autofuse.frontend import graph as af_graph

FRONT_ENDS = ("optimize", "compile")


def _front(fn, args, front: str):
    torch._dynamo.reset()
    if front == "optimize":
        return autofuse.optimize(fn, args)
    return torch.compile(fn, backend="autofuse", dynamic=False)


def _check(fn, make, front: str) -> None:
    """``fn`` on ``make()``'s inputs equals eager's, and so do the gradients of the inputs that
    require grad."""
    torch.manual_seed(0)
    args = make()
    torch.manual_seed(0)
    ref_args = make()
    out, ref = _front(fn, args, front)(*args), fn(*ref_args)
    torch.testing.assert_close(out, ref, equal_nan=True)
    grads = [k for k, a in enumerate(args) if a.requires_grad]
    if grads:
        gy = torch.randn_like(ref)
        got = torch.autograd.grad(out, [args[k] for k in grads], gy)
        want = torch.autograd.grad(ref, [ref_args[k] for k in grads], gy)
        torch.testing.assert_close(got, want)


# ---------------------------------------------------------------------------------------------
# a 0-d CPU tensor beside the tensors of another device: the scalar of ``t[t > 0] = -2.5`` is
# a lifted 0-d CPU constant in the traced graph, and eager takes a 0-d CPU tensor with CUDA
# tensors, so it must reach the computation's device. There is no second device on a CPU-only
# machine: the tests run the programs on the CPU through both front ends, and check the
# placement on the graphs those front ends trace with the computation's device decided as
# "meta" (a device whose tensors hold no data, so only the placement is checked, not a run)
# ---------------------------------------------------------------------------------------------


def _setitem_scalar(x):
    t = x * 2
    t[t > 0] = -2.5
    return t


def _last_column(x):
    t = torch.minimum(x, x.flip(0))
    t[..., -1] = -2.5
    return t


SCALAR_CONSTANTS = {"setitem_mask": _setitem_scalar, "setitem_column": _last_column}


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("front", FRONT_ENDS)
@pytest.mark.parametrize("name", sorted(SCALAR_CONSTANTS))
def test_scalar_constants_run(name, front, grad):
    _check(SCALAR_CONSTANTS[name], lambda: (torch.randn(3, 4, requires_grad=grad),), front)


@pytest.mark.parametrize(
    ("front", "grad"), [("compile", False), ("compile", True), ("optimize", True)]
)
def test_scalar_constants_placed_on_computation_device(front, grad, monkeypatch):
    """Every AOTAutograd graph the front ends trace (forward and backward; ``optimize``
    without grad captures with make_fx, where a constant becomes a node of its value): its 0-d
    constants and the traced values of its 0-d inputs are placed on the computation's device."""
    traced = []
    real = af_dynamo.prepare

    def record(gm, example_inputs):
        traced.append((gm, list(example_inputs)))
        return real(gm, example_inputs)

    monkeypatch.setattr(af_dynamo, "prepare", record)
    x = torch.randn(3, 4, requires_grad=grad)
    out = _front(_setitem_scalar, [x], front)(x)
    if grad:
        out.sum().backward()
    assert len(traced) == (2 if grad else 1)
    monkeypatch.setattr(af_graph, "computation_device", lambda _: torch.device("meta"))
    lifted = 0
    for gm, example_inputs in traced:
        prepared = af_graph.prepare(gm, example_inputs)
        assert prepared.device == torch.device("meta")
        lifted += len(prepared.constants)
        assert all(c.device.type == "meta" for c in prepared.constants if c.dim() == 0)
        vals = [n.meta["val"] for n in prepared.gm.graph.find_nodes(op="placeholder")]
        assert all(v.device.type == "meta" for v in vals if v.dim() == 0)
    assert lifted  # the forward graph holds the scalar as a constant


def test_computation_device_ignores_cpu_scalars():
    """A 0-d CPU tensor decides no device; any other tensor does; a 0-d tensor elsewhere is
    placed on it and a tensor of more dims is left to the input check."""
    scalar, meta = torch.tensor(2.0), torch.empty(3, device="meta")
    assert af_graph.computation_device([scalar, meta]) == torch.device("meta")
    assert af_graph.computation_device([scalar]) == torch.device("cpu")
    assert af_graph.place(scalar, torch.device("meta")).device.type == "meta"
    assert af_graph.place(torch.ones(2), torch.device("meta")).device.type == "cpu"


# ---------------------------------------------------------------------------------------------
# the fuzzer's driver called in-process (as tests do) leaves the caller's SIGTERM handler as it
# found it: a later SIGTERM must not raise SystemExit inside another test
# ---------------------------------------------------------------------------------------------


def test_fuzz_driver_restores_sigterm_handler(tmp_path):
    from experiments.fuzz import driver

    def mine(signum, frame):  # pragma: no cover - never called
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        args = ["--graphs", "1", "--seed", "0", "--out", str(tmp_path / "run")]
        assert driver.main([*args, "--front-ends", "compile"]) == 0
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)
