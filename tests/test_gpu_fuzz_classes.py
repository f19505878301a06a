"""Classes of failure that the differential fuzzer found with real kernels on a GPU, one test per
class, reproduced here on the CPU: through both front ends, forward and backward where inputs
require grad, and where the class needs a GPU to show, through the code path it takes there."""

import contextlib
import signal

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

import autofuse
from autofuse.frontend import dynamo as af_dynamo
from autofuse.frontend import graph as af_graph

from .gpu_compile import compile_for_gpu, recording_launches

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
        modes = {x.fake_mode for x in example_inputs if isinstance(x, FakeTensor)}
        with modes.pop() if modes else contextlib.nullcontext():  # as AOTAutograd calls it
            prepared = af_graph.prepare(gm, example_inputs)
        assert prepared.device == torch.device("meta")
        lifted += len(prepared.constants)
        assert all(c.device.type == "meta" for c in prepared.constants if c.dim() == 0)
        # real tensors, not fakes of that mode: a fake constant reached the kernels on a GPU
        # ("Cannot access data pointer of Tensor"; 52 checks of the GPU fuzz run on 661ebf3)
        assert not any(isinstance(c, FakeTensor) for c in prepared.constants)
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
# a bool pad (a cat with a constant block) read through index_select: the cat's one remaining
# branch is the pad's False, a literal cast to bool twice, and "False" is no "0": it became
# True (silently wrong on a GPU and in the interpreter alike)
# ---------------------------------------------------------------------------------------------


def _bool_pad_select(x, i):  # x (1,): the pad drops the element and appends a False
    return torch.index_select(F.pad(x.unsqueeze(1).unsqueeze(0), [-1, 1]), 2, i)


def _bool_pad_select_2d(x, i):  # x (1, 1, 2, 2) float
    return torch.index_select(F.pad((x > 0) | False, [3, -2, -2, 3]), 2, i)


BOOL_PAD = {
    "drop_and_pad": (
        _bool_pad_select,
        lambda: (torch.tensor([True]), torch.tensor([0])),
    ),
    "negative_and_positive_pads": (
        _bool_pad_select_2d,
        lambda: (torch.ones(1, 1, 2, 2), torch.tensor([0])),
    ),
}


@pytest.mark.parametrize("front", FRONT_ENDS)
@pytest.mark.parametrize("name", sorted(BOOL_PAD))
def test_bool_pad_constant_branch(name, front):
    fn, make = BOOL_PAD[name]
    _check(fn, make, front)


# ---------------------------------------------------------------------------------------------
# kernels the interpreter runs but a GPU cannot build, compiled here for sm_90 (gpu_compile.py):
# - a device assert on a condition that folds to a Python bool: ``~True`` is the integer -2,
#   and Triton rejects an assert on an integer ("error encountered during parsing") — indices
#   read from a constant (the aranges of flip / kthvalue on a size-1 dim);
# - a kernel over an empty domain (a (0, 1, 2) tensor reduced): its blocks fold to scalar
#   addresses that a GPU build rejects; no program runs, so it is neither built nor launched
# ---------------------------------------------------------------------------------------------


def _flip_kthvalue(x):  # an int32 (1, 1) tensor through constant-index gathers
    return torch.flip(torch.flip(x, [0, 1]).kthvalue(1, -1, keepdim=True).values, [-1])


def _flip_max(x):
    return torch.flip(torch.flip(x, [0, 1]).max(1, keepdim=False).values, [0])


def _empty_amax(x):  # x (0, 2): a row reduction with no row
    return x - torch.amax(x, dim=1, keepdim=True), x.roll(1, 0)


def _empty_min_copysign(x):  # x (0, 1, 2)
    v = torch.copysign(x, 2)
    return v, v.expand((-1, 2, -1)).min(2, keepdim=False).values


def _empty_matvec(x, w):  # x (1, 0, 1, 8) bf16, w (8,)
    return x @ w


def _empty_triu_count(x):  # x (1, 0, 2)
    v = torch.triu(x, diagonal=0)
    return (v <= v).long().sum(-1).unsqueeze(2), v.squeeze()


def _pad_chunk_expand(x):  # x (1, 1, 1): an empty expand of a padded chunk
    v = F.pad(x, [0, 1, 2, 2, 0, -1])
    v = torch.chunk(v, 3, 1)[-1]
    return v.expand((0, 2, 2)), v


GPU_BUILD = {
    "flip_kthvalue_int32": (_flip_kthvalue, lambda g: (torch.randint(-4, 5, (1, 1)).int(),)),
    "flip_max": (_flip_max, lambda g: (torch.randn(1, 1, requires_grad=g),)),
    "empty_amax": (_empty_amax, lambda g: (torch.randn(0, 2, requires_grad=g),)),
    "empty_min_copysign": (_empty_min_copysign, lambda g: (torch.randn(0, 1, 2, requires_grad=g),)),
    "empty_matvec": (
        _empty_matvec,
        lambda g: (
            torch.randn(1, 0, 1, 8, dtype=torch.bfloat16, requires_grad=g),
            torch.randn(8, dtype=torch.bfloat16, requires_grad=g),
        ),
    ),
    "empty_triu_count": (_empty_triu_count, lambda g: (torch.randn(1, 0, 2, requires_grad=g),)),
    "pad_chunk_expand": (_pad_chunk_expand, lambda g: (torch.randn(1, 1, 1, requires_grad=g),)),
}


def _same_all(out, ref) -> None:
    out = out if isinstance(out, (tuple, list)) else (out,)
    ref = ref if isinstance(ref, (tuple, list)) else (ref,)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, equal_nan=True)


@pytest.mark.parametrize("name", sorted(GPU_BUILD))
def test_kernels_build_for_gpu(name, monkeypatch):
    """Every kernel the program launches, through both front ends, forward and backward,
    compiles for sm_90 (plain and bounds-guarded), and the values agree with eager."""
    fn, make = GPU_BUILD[name]
    with recording_launches() as jobs:
        for front in FRONT_ENDS:
            for grad in (False, True):
                args = make(grad)
                if grad and not any(a.requires_grad for a in args):
                    continue
                ref_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
                out, ref = _front(fn, args, front)(*args), fn(*ref_args)
                _same_all(out, ref)
                if grad:
                    outs = [o for o in (out if isinstance(out, tuple) else (out,))]
                    refs = [r for r in (ref if isinstance(ref, tuple) else (ref,))]
                    leaves = [a for a in args if a.requires_grad]
                    ref_leaves = [a for a in ref_args if a.requires_grad]
                    loss = sum(o.float().sum() for o in outs if o.requires_grad)
                    ref_loss = sum(r.float().sum() for r in refs if r.requires_grad)
                    got = torch.autograd.grad(loss, leaves, allow_unused=True)
                    want = torch.autograd.grad(ref_loss, ref_leaves, allow_unused=True)
                    _same_all(got, want)
    assert compile_for_gpu(jobs) == []


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


# ---------------------------------------------------------------------------------------------
# a scatter kernel's default config on a GPU: the pointwise kind's strided-lanes rule rendered
# the group with a plain emitter, which cannot render a scatter (FusionRefused while the plan
# was built: GPU fuzz graph 309 of seed 13, on 661ebf3); the kinds' GPU rules run here with
# their interpreter guards off, the kernels still in the interpreter
# ---------------------------------------------------------------------------------------------


def _repeat_cat_select(x, i):
    v = x.repeat((2, 3, 1, 3))
    return torch.index_select(torch.cat([v, v * 2], -2), -2, i)


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_a_scatter_backward_plans_with_the_gpu_rules(front, monkeypatch):
    from autofuse.kernels.pointwise import kind as pointwise

    monkeypatch.setattr(pointwise, "interpreting", lambda: False)
    _check(
        _repeat_cat_select,
        lambda: (torch.randn(2, 4, 1, 2, requires_grad=True), torch.tensor([0, 1, 1, 0, 0, 1])),
        front,
    )


# ---------------------------------------------------------------------------------------------
# var / std with no degree of freedom left (correction >= the count): eager's 0 / 0 is NaN on a
# constant row, whatever the compiler does with a product feeding the centring subtraction (a
# fused multiply-add there gives the product's rounding error, not 0). Graphs 360 and 551 of
# the GPU run on 661ebf3, shrunk.
# ---------------------------------------------------------------------------------------------


def _var_of_square(x):
    return torch.var(x.pow(2), dim=(-1,), correction=1)


def _std_of_product(x):
    return torch.std(x * x, dim=(-2,), correction=1)


def _var_of_constant_product_rows(x):
    y = x.expand(4, 64) * 1.7  # every row constant
    return torch.var(y * y, dim=1, correction=0)


def _one_element_moments(device: str):
    return {
        "var_of_square": (_var_of_square, lambda: (torch.randn(1, 1, 1, 1, device=device),)),
        "std_of_product": (_std_of_product, lambda: (torch.randn(1, 1, 1, device=device),)),
        "constant_rows": (  # with the gradient: 0, finite
            _var_of_constant_product_rows,
            lambda: (torch.randn(4, 1, device=device, requires_grad=True),),
        ),
    }


@pytest.mark.parametrize("front", FRONT_ENDS)
@pytest.mark.parametrize("name", ["var_of_square", "std_of_product", "constant_rows"])
def test_moments_of_a_product_with_no_spread(name, front):
    fn, make = _one_element_moments("cpu")[name]
    _check(fn, make, front)


@pytest.mark.gpu
@pytest.mark.parametrize("front", FRONT_ENDS)
@pytest.mark.parametrize("name", ["var_of_square", "std_of_product", "constant_rows"])
def test_moments_of_a_product_with_no_spread_gpu(name, front):
    fn, make = _one_element_moments("cuda")[name]
    _check(fn, make, front)
