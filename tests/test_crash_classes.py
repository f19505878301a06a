"""Programs eager runs that crashed autofuse, one test per class of cause, through both front
ends, forward and backward where inputs require grad. Each kernel runs in strict mode, so a
kernel that cannot be built fails the test instead of quietly running its ops in eager."""

import dataclasses
import warnings

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse import settings as af_settings
from autofuse.plan.runtime import KernelBuildWarning, KernelStep, execute

FRONT_ENDS = ("optimize", "compile")


@pytest.fixture
def strict(monkeypatch):
    monkeypatch.setenv("AUTOFUSE_STRICT", "1")
    af_settings.reload_settings()
    yield
    monkeypatch.undo()
    af_settings.reload_settings()


def _front(fn, args, front: str):
    if front == "optimize":
        return autofuse.optimize(fn, args)
    torch._dynamo.reset()
    return torch.compile(fn, backend="autofuse", dynamic=False)


def _same(out, ref) -> None:
    out = out if isinstance(out, (tuple, list)) else (out,)
    ref = ref if isinstance(ref, (tuple, list)) else (ref,)
    for o, r in zip(out, ref):
        assert o.shape == r.shape and o.dtype == r.dtype, (o.shape, r.shape, o.dtype, r.dtype)
        if r.is_floating_point():
            torch.testing.assert_close(o, r, equal_nan=True, atol=1e-5, rtol=1e-5)
        else:
            assert torch.equal(o, r), (o, r)


def _check(fn, make, front: str) -> None:
    """``fn`` on ``make()``'s inputs equals eager's, and so do the gradients of those inputs
    that require grad."""
    args, ref_args = make(), make()
    out, ref = _front(fn, args, front)(*args), fn(*ref_args)
    _same(out, ref)
    grads = [k for k, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    if not grads:
        return
    gy = torch.randn_like(ref)
    got = torch.autograd.grad(out, [args[k] for k in grads], gy, allow_unused=True)
    want = torch.autograd.grad(ref, [ref_args[k] for k in grads], gy, allow_unused=True)
    _same(got, want)


def _seeded(make):
    def made():
        torch.manual_seed(0)
        return make()

    return made


# ---------------------------------------------------------------------------------------------
# a kernel that fails to build (in the interpreter: any error its body raises, wrapped in an
# InterpreterError) runs its ops in eager with one warning; strict mode raises
# ---------------------------------------------------------------------------------------------


def _broken_softmax(scale: float):
    def fn(t):
        return torch.softmax(t, -1) * scale

    args = (torch.randn(4, 8),)
    plan = autofuse.optimize(fn, args).plan
    k = plan.kernels[0]
    # an invalid kernel body: tl.exp of an integer (a ValueError in the interpreter)
    bad = dataclasses.replace(
        k, source=k.source.replace("tl.load(", "tl.exp(tl.arange(0, 2)).sum() * 0 + tl.load(", 1)
    )
    return fn, args, dataclasses.replace(plan, steps=(KernelStep(bad),))


def test_an_invalid_kernel_body_falls_back_to_eager():
    fn, args, broken = _broken_softmax(2.0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", KernelBuildWarning)
        outs = [execute(broken, list(args))[0] for _ in range(2)]
    assert [w.category for w in seen].count(KernelBuildWarning) == 1
    for o in outs:
        _same(o, fn(*args))


def test_an_invalid_kernel_body_raises_in_strict_mode(strict):
    _, args, broken = _broken_softmax(3.0)  # another kernel: not known broken
    with pytest.raises(Exception, match="Expected dtype"):
        execute(broken, list(args))


# ---------------------------------------------------------------------------------------------
# a literal operand where a rendering or a helper expects a Triton value: copysign's bitcast of
# a Python number, a float literal of another float dtype written with ".0" appended (1e+30.0
# is no Python literal), hypot's `scalar | block` of two bool tests, an integer literal out of
# its operand dtype's range, a non-finite pow exponent
# ---------------------------------------------------------------------------------------------

X = lambda: (torch.randn(4, 3),)  # noqa: E731


def _full(x, v):
    return torch.full_like(x, v)


LITERALS = {
    "copysign_by_a_float": (lambda x: torch.copysign(x, -1.5), X),
    "copysign_by_nan_and_neg_zero": (
        lambda x: torch.copysign(x, float("nan")) + torch.copysign(x, _full(x, -0.0)),
        X,
    ),
    "copysign_of_a_constant": (lambda x: torch.copysign(_full(x, -2.0), x), X),
    "exponent_literal_in_float64": (
        lambda x: torch.maximum(x.double(), _full(x, 1e30)) + torch.where(x > 0, x.double(), 1e-45),
        X,
    ),
    "hypot_by_a_constant": (lambda x: torch.hypot(x, _full(x, 2.0)), X),
    "hypot_with_a_size1_operand": (  # C3
        lambda a, b: torch.hypot(torch.softmax(a, 2).amin(-1), b),
        lambda: (torch.randn(1, 33, 1), torch.randn(1, 1)),
    ),
    "pow_by_inf_and_nan": (  # an eager step: the rendering raised on int(inf)
        lambda x: x.abs() ** float("inf") + x ** float("nan") + x ** float("-inf"),
        X,
    ),
    "int_scalars_out_of_range": (  # wrapped as torch casts them
        lambda n: (n.int() + 2**40, n.to(torch.int16) * 40000, n.to(torch.int16) < 40000),
        lambda: (torch.randint(-5, 5, (4, 3)),),
    ),
    "bool_xor_true": (
        lambda b, x: ((b ^ True).float() * x).sum(1) + (b.any(1) ^ True),
        lambda: (torch.rand(4, 3) > 0.5, torch.randn(4, 3)),
    ),
}


# ---------------------------------------------------------------------------------------------
# an index read once per program (a size-1 index tensor) along a cat's dim: the index has no
# tile variable but is no constant, so the cat must still choose its branch by its value (it
# read the first input at any index: out of bounds past it, and the pad's zeros never chosen)
# ---------------------------------------------------------------------------------------------


def _cat_of_flip(a, i):  # C1
    v = a.unflatten(-1, (1, 7))
    return torch.index_select(torch.cat([v, v.flip(-1)], -1), 1, i)


def _negative_pad(a, i):  # C2
    return torch.index_select(F.pad(a, [2, -1, 0, 1]), 0, i)


CAT_INDEX = {
    "cat_of_flip_last": (_cat_of_flip, lambda: (torch.randn(7), torch.tensor([13]).int())),
    "cat_of_flip_first": (_cat_of_flip, lambda: (torch.randn(7), torch.tensor([2]).int())),
    "cat_of_flip_grad": (
        _cat_of_flip,
        lambda: (torch.randn(7, requires_grad=True), torch.tensor([9]).int()),
    ),
    "negative_pad_bottom_row": (_negative_pad, lambda: (torch.randn(5, 2), torch.tensor([5]))),
    "negative_pad_inner_row": (_negative_pad, lambda: (torch.randn(5, 2), torch.tensor([3]))),
    "negative_pad_grad": (
        _negative_pad,
        lambda: (torch.randn(5, 2, requires_grad=True), torch.tensor([4])),
    ),
    "gather_along_cat": (
        lambda a, i: torch.gather(torch.cat([a, a * 2], 1), 1, i),
        lambda: (torch.randn(1, 3), torch.tensor([[4]])),
    ),
}


# ---------------------------------------------------------------------------------------------
# constants where a typed value is needed: a constant read through an index (assigned, a Python
# int is an int32 tensor in Triton) reduced beside int64's identity -2**63; an empty buffer's placeholder read
# as a float (tl.exp(0) of an int); an empty index tensor's range check (no lane reads)
# ---------------------------------------------------------------------------------------------


def _max_of_a_constant(a, i):  # C4
    v = a.long().cumsum(-1).fill_(-1)
    return torch.index_select(v, 0, i).max(0).values


def _std_of_empty(a):  # C5
    v = torch.logaddexp(a, a)
    return a.masked_fill(v > 0.5, float("nan")).std(correction=1, keepdim=True)


CONSTANTS = {
    "max_of_an_int64_constant": (
        _max_of_a_constant,
        lambda: (torch.rand(2, 1) > 0.5, torch.tensor([1])),
    ),
    "amin_of_a_large_constant": (
        lambda n, i: torch.full_like(n, 2**40).index_select(0, i).amin(1),
        lambda: (torch.randint(0, 5, (4, 3)), torch.tensor([1])),
    ),
    "any_of_a_constant": (
        lambda n, i: torch.full_like(n, 1).index_select(0, i).bool().any(1),
        lambda: (torch.randint(0, 5, (4, 3)), torch.tensor([2])),
    ),
    "std_of_an_empty_row": (_std_of_empty, lambda: (torch.randn(1, 0),)),
    "index_by_a_one_element_arange_grad": (  # a constant index: a typed tensor, not an int
        lambda a: torch.index_select(a, -1, torch.arange(a.shape[-1]).flip(0)) * 3,
        lambda: (torch.randn(3, 1, requires_grad=True),),
    ),
    "exp_of_an_empty_cat": (
        lambda a: torch.exp(torch.cat([a, a], 1)).sum(1),
        lambda: (torch.randn(2, 0),),
    ),
    "softmax_flip_of_empty_grad": (  # C9
        lambda a: torch.flip(torch.softmax(a, 0).flatten(), [0]),
        lambda: (torch.randn(0, requires_grad=True),),
    ),
    "roll_of_empty_grad": (
        lambda a: torch.roll(torch.log_softmax(a, 1), 1, 1) * 2,
        lambda: (torch.randn(2, 0, requires_grad=True),),
    ),
}


# ---------------------------------------------------------------------------------------------
# a scalar address under a block mask: a load whose offset has no tile variable (rows and
# columns of size 1 in a batched matmul's epilogue: only the batch; a scatter's value read
# through a size-1 index) must be a block pointer, and its value is a block
# ---------------------------------------------------------------------------------------------


def _layer_norm_gram(a, w):  # C7
    v = F.layer_norm(a, [1], w)
    return v @ v.transpose(-1, -2)


HALF_GRAD = lambda: (torch.randn(1, 7, 1, dtype=torch.float16, requires_grad=True),)  # noqa: E731

SCALAR_ADDRESSES = {
    "layer_norm_gram_grad": (
        _layer_norm_gram,
        lambda: (torch.randn(16, 1, 1, requires_grad=True), torch.randn(1)),
    ),
    "batched_outer_grad": (
        lambda a, b: torch.bmm(a * 2, b).relu(),
        lambda: (torch.randn(3, 1, 2, requires_grad=True), torch.randn(3, 2, 1)),
    ),
    "flip_min_flip_grad": (  # C8
        lambda a: torch.flip(torch.flip(a, [2, 1, 0]).min(-2).values, [0, 1]),
        HALF_GRAD,
    ),
    "flip_max_grad": (lambda a: torch.flip(torch.flip(a, [1]).max(-2).values, [1]), HALF_GRAD),
    "roll_kthvalue_grad": (
        lambda a: torch.roll(torch.roll(a, 2, 1).kthvalue(3, -2).values, 1, 0),
        HALF_GRAD,
    ),
}


# ---------------------------------------------------------------------------------------------
# a decomposition stricter than its op: the op runs as eager runs it (used or not)
# ---------------------------------------------------------------------------------------------


def _unused_addcmul(a, b):  # C6
    v = a.expand_as(a)
    torch.addcmul(v, v, v, value=0.5)
    return b


INTS = lambda: (torch.randint(0, 5, (3, 1, 1)), torch.randint(0, 5, (3, 1, 1)))  # noqa: E731

STRICT_DECOMPOSITIONS = {
    "unused_integer_addcmul": (_unused_addcmul, INTS),
    "integer_addcmul": (lambda a, b: torch.addcmul(a, a, b, value=0.5) + 1, INTS),
    "integer_addcdiv_of_floats": (
        lambda a, b: torch.addcdiv(a.float(), a.float(), b.float() + 1, value=3) * 2,
        INTS,
    ),
}


# ---------------------------------------------------------------------------------------------
# the backward of a slice of an empty tensor: a slice_scatter into an empty base, which became a
# concatenation of nothing
# ---------------------------------------------------------------------------------------------

EMPTY_SLICE_BACKWARD = {
    "narrow_of_empty_grad": (
        lambda a: torch.div(a, -2.5, rounding_mode="floor").narrow(0, 0, 0),
        lambda: (torch.randn(0, requires_grad=True),),
    ),
    "slice_of_empty_rows_grad": (
        lambda a: (a * 2)[:, 1:3].exp(),
        lambda: (torch.randn(0, 4, requires_grad=True),),
    ),
}


CLASSES = {
    "empty_slice_backward": EMPTY_SLICE_BACKWARD,
    "literal": LITERALS,
    "cat_index": CAT_INDEX,
    "constant": CONSTANTS,
    "scalar_address": SCALAR_ADDRESSES,
    "decomposition": STRICT_DECOMPOSITIONS,
}
CASES = {f"{c}/{k}": v for c, table in CLASSES.items() for k, v in table.items()}


@pytest.mark.parametrize("front", FRONT_ENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_class_agrees_with_eager(case, front, strict):
    """Built (strict mode: no kernel falls back) and equal to eager, forward and backward."""
    fn, make = CASES[case]
    _check(fn, _seeded(make), front)


def test_an_input_eager_rejects_still_raises():
    def fn(a, b):
        return torch.addcmul(a, a, b)

    args = (torch.randn(3, 2), torch.randn(4, 2))
    with pytest.raises(Exception, match="size"):
        autofuse.optimize(fn, args)(*args)


# ---------------------------------------------------------------------------------------------
# an attention mask of -inf: the backward's skip test renders the constant as a literal (it
# wrote -inf, a Python name, and the kernel could not be built)
# ---------------------------------------------------------------------------------------------


def _causal_minus_inf(q, k, v):
    i, j = torch.arange(q.shape[-2])[:, None], torch.arange(k.shape[-2])[None, :]
    s = (q @ k.transpose(-1, -2) * 0.25).masked_fill(j > i, float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_attention_masked_with_minus_inf_builds(front, strict):
    def make():
        torch.manual_seed(0)
        return tuple(torch.randn(1, 2, 20, 8, requires_grad=True) for _ in range(3))

    _check(_causal_minus_inf, make, front)


# ---------------------------------------------------------------------------------------------
# a graph AOTAutograd itself cannot trace (torch's functionalization refuses an in-place fill of
# an expanded bool view, which eager runs): it runs as captured, in eager, with a warning; an
# in-place write into an expand is now refused before AOTAutograd sees it (capture/overlap.py)
# ---------------------------------------------------------------------------------------------


def _fill_expanded_bool(x):
    v = (x > 0) != True  # noqa: E712 - the comparison with a bool is the program
    return v.expand(3, -1, 3, 3).fill_(True)


@pytest.mark.parametrize("front", FRONT_ENDS)
def test_a_graph_aot_cannot_trace_runs_as_captured(front):
    x = torch.randint(-4, 5, (1, 1, 1))
    with pytest.warns(RuntimeWarning, match="fill_ writes into a view whose elements share"):
        out = _front(_fill_expanded_bool, (x.clone(),), front)(x.clone())
    _same(out, _fill_expanded_bool(x.clone()))


def test_a_graph_aot_cannot_trace_raises_in_strict_mode(strict):
    torch._dynamo.reset()
    x = torch.randint(-4, 5, (1, 1, 1))
    with pytest.raises(RuntimeError, match="strict.*share memory"):
        torch.compile(_fill_expanded_bool, backend="autofuse")(x)


def test_a_graph_aot_refuses_for_another_reason_runs_as_captured(monkeypatch):
    """Where AOTAutograd raises before any graph reached autofuse (for a reason the overlap
    check does not see), Dynamo's graph runs as captured, with a warning naming the error."""
    from autofuse.frontend import dynamo

    def refuse(self, gm, example_inputs, compile=None):
        raise RuntimeError("functionalization refused this graph")

    monkeypatch.setattr(dynamo.AutofuseBackend, "aot", refuse)
    torch._dynamo.reset()
    x = torch.randn(3, 4)
    with pytest.warns(RuntimeWarning, match="AOTAutograd could not trace it.*refused this graph"):
        out = torch.compile(lambda t: (t * 2).sin(), backend="autofuse", dynamic=False)(x)
    torch.testing.assert_close(out, (x * 2).sin())
