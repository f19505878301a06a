"""The lean host path of a plan call (one guard check, no routing, no pytree for flat calls)
and ``cuda_graph=True`` (its replay needs CUDA: tests/test_gpu.py territory; here the note)."""

# ruff: noqa: E402

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import warnings

import pytest

import autofuse
from autofuse import routing
from autofuse.plan import runtime
from autofuse.plan.graphs import CudaGraphNote

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


def two(x, w):
    y = torch.sigmoid(x * w + 1.0)
    return y.sum(-1), y


def _args():
    return tuple(torch.randn(4, 8, device=DEVICE) for _ in range(2))


def test_a_plain_call_checks_once_and_skips_routing(monkeypatch):
    args = _args()
    opt = autofuse.optimize(two, args)
    want = two(*args)

    def boom(*a, **k):
        raise AssertionError("the fast path must not get here")

    monkeypatch.setattr(routing, "route", boom)
    monkeypatch.setattr(runtime, "check_inputs", boom)
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            got = opt(*args)
        assert type(got) is tuple and len(got) == 2
        for g, w in zip(got, want):
            assert torch.allclose(g, w, atol=1e-5)
    monkeypatch.undo()
    x = args[0].clone().requires_grad_()
    got = opt(x, args[1])  # requires grad in grad mode: the backend path, as before
    assert got[0].requires_grad
    with pytest.raises(autofuse.InputError, match="input 0"):
        opt(args[0][:2], args[1])  # a mismatch still gets the named error


def test_the_input_check_is_dynamos_c_guard_after_the_first_accepted_call():
    """After one call the Python check accepted, a plan's inputs are checked by Dynamo's
    C-level TensorGuards; what it rejects goes back to the Python check, which still accepts
    a Parameter or another ``requires_grad`` and still rejects other strides."""
    args = _args()
    opt = autofuse.optimize(two, args)
    guard = runtime.input_guard(opt.plan)
    calls = []
    real = runtime._inputs_match

    def counted(plan, inputs):
        calls.append(1)
        return real(plan, inputs)

    opt(*args)
    assert type(guard.fast).__name__ == "TensorGuards", guard.fast  # torch 2.11 and 2.13
    assert guard.grad_free and guard.exact(args)  # the plain call's one check
    assert not guard.exact((args[0].clone().requires_grad_(), args[1]))  # grad: rejected
    runtime._inputs_match = counted
    try:
        for _ in range(3):
            assert guard(args)
        assert not calls  # the C check alone
        assert guard((torch.nn.Parameter(args[0]), args[1])) and len(calls) == 1
        x = args[0].clone().requires_grad_()
        assert guard((x, args[1])) and len(calls) == 2
        t = torch.randn(8, 4, device=DEVICE).t()  # the shape, other strides
        assert not guard((t, args[1])) and len(calls) == 3
    finally:
        runtime._inputs_match = real
    with pytest.raises(autofuse.InputError, match="strides"):
        opt(t, args[1])


def test_cuda_graph_is_off_with_one_note_under_the_interpreter():
    if DEVICE == "cuda":
        pytest.skip("on CUDA the graph is captured (tests/test_gpu.py)")
    args = _args()
    opt = autofuse.optimize(two, args, cuda_graph=True)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        outs = [opt(*args) for _ in range(3)]
    notes = [r for r in rec if issubclass(r.category, CudaGraphNote)]
    assert len(notes) == 1 and "interpreter" in str(notes[0].message)
    for got in outs:
        assert all(torch.allclose(g, w, atol=1e-5) for g, w in zip(got, two(*args)))
    assert opt.graphs.off and opt.graphs.graph is None


@pytest.mark.gpu
def test_cuda_graph_replays_the_plan_on_cuda():
    args = tuple(torch.randn(64, 128, device="cuda") for _ in range(2))
    opt = autofuse.optimize(two, args, cuda_graph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CudaGraphNote)
        first = opt(*args)
        kept = [t.clone() for t in first]
        for _ in range(3):
            xs = tuple(torch.randn_like(a) for a in args)
            got = opt(*xs)
            for g, w in zip(got, two(*xs)):
                torch.testing.assert_close(g, w)
    assert opt.graphs.graph is not None and opt.graphs.off is None
    assert opt.graphs.copied is not None  # other tensors: copied into the second graph's inputs
    for a, b in zip(first, kept):  # results are copies: the next replay does not change them
        assert torch.equal(a, b)
    for _ in range(2):  # the first call's own tensors, refilled in place: replay, no copy
        for a in args:
            a.normal_()
        for g, w in zip(opt(*args), two(*args)):
            torch.testing.assert_close(g, w)
    assert opt.graphs.graph.holds(args)


def test_replayed_outputs_are_lent_only_while_unheld():
    """A graph's outputs are lent out as aliases: its storages' use counts say whether the
    caller still holds one (a view of one counts too); outputs on the caller's own inputs and
    on the graph's input buffers are not lent. (CPU tensors: the bookkeeping alone.)"""
    from autofuse.plan.graphs import _Captured, unheld_counts

    cap = object.__new__(_Captured)
    x = torch.randn(4, 4)
    y = torch.empty(4, 4)
    z = torch.empty(3)
    cap.outputs = [y, y.t(), z, z, x[0]]  # z is two of the outputs: one tensor
    cap.lent = (0, 1, 2, 3)  # x[0] is on the caller's input: not lent
    cap.base = unheld_counts(cap.outputs, cap.lent)
    assert cap.base == [3, 3, 2, 2]
    assert cap.free()
    held = cap.outputs[0].detach()
    assert not cap.free()
    del held
    assert cap.free()
    view = cap.outputs[2].detach()[1:]
    assert not cap.free()
    del view
    assert cap.free()


@pytest.mark.gpu
def test_cuda_graph_lends_its_outputs_and_never_overwrites_held_results():
    """No output copy: ``y = f(x)`` in a loop alternates between the graph and its twin (the
    previous y is held during the call); with every graph's results held the call runs
    kernel by kernel; no result ever changes under the caller."""
    x, w = (torch.randn(64, 128, device="cuda") for _ in range(2))
    opt = autofuse.optimize(two, (x, w), cuda_graph=True)
    kept, wants = [], []
    for _ in range(4):
        x.normal_()
        kept.append(opt(x, w))
        wants.append([t.clone() for t in two(x, w)])
    for got, want in zip(kept, wants):
        for g, w_ in zip(got, want):
            torch.testing.assert_close(g, w_)
    g = opt.graphs.graph
    assert g.twin is not None
    lent = {g.outputs[0].data_ptr(), g.twin.outputs[0].data_ptr()}
    assert {kept[0][0].data_ptr(), kept[1][0].data_ptr()} == lent  # replays, no copies
    assert kept[2][0].data_ptr() not in lent  # both held: kernel by kernel
    del kept
    y = None
    for _ in range(3):
        y = opt(x, w)
    assert y[0].data_ptr() in lent


@pytest.mark.gpu
def test_cuda_graph_copies_only_the_inputs_that_moved():
    x, w = (torch.randn(64, 128, device="cuda") for _ in range(2))
    opt = autofuse.optimize(two, (x, w), cuda_graph=True)
    opt(x, w)
    for _ in range(2):  # a new batch, the same weight: the weight is read in place
        xs = torch.randn_like(x)
        for g, want in zip(opt(xs, w), two(xs, w)):
            torch.testing.assert_close(g, want)
    assert opt.graphs.copied.copied == (0,)
    w2 = torch.randn_like(w)  # the weight moves too: a graph copying both
    for g, want in zip(opt(torch.randn_like(x), w2), two(opt.graphs.copied.inputs[0], w2)):
        torch.testing.assert_close(g, want)
    assert opt.graphs.copied.copied == (0, 1)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        return torch.sigmoid(self.lin(x) * 2.0).sum(-1)


def test_backend_cuda_graph_option_replays_inference_graphs():
    torch._dynamo.reset()
    m = _Block().to(DEVICE)
    x = torch.randn(8, 16, device=DEVICE)
    fast = torch.compile(m, backend="autofuse", options={"cuda_graph": True})
    with warnings.catch_warnings(record=True) as rec, torch.no_grad():
        warnings.simplefilter("always")
        outs = [fast(x + k) for k in range(3)]
        wants = [m(x + k) for k in range(3)]
    for got, want in zip(outs, wants):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    from autofuse.frontend import compiled_graphs

    replay = compiled_graphs()[-1].replay
    assert replay is not None
    notes = [r for r in rec if issubclass(r.category, CudaGraphNote)]
    if DEVICE == "cpu":  # no CUDA graphs under the interpreter: one note, kernel by kernel
        assert len(notes) == 1 and replay.off
    else:
        assert not notes and replay.copied is not None


def test_choose_replay_keeps_the_graph_only_when_it_times_faster():
    from autofuse.plan.graph_choice import choose_replay

    def timer_of(times):
        return lambda call: times[call()]

    plain, replayed = (lambda: "plain"), (lambda: "graph")
    c = choose_replay(plain, replayed, True, timer_of({"plain": 40e-6, "graph": 10e-6}))
    assert c.replay and c.plain_s == 40e-6 and c.graph_s == 10e-6 and "replay" in c.why
    c = choose_replay(plain, replayed, True, timer_of({"plain": 40e-6, "graph": 39.5e-6}))
    assert not c.replay  # within the margin: kernel by kernel (no copies to pay for nothing)

    def broken():
        raise RuntimeError("operation not permitted when stream is capturing")

    c = choose_replay(plain, broken, True, timer_of({"plain": 40e-6}))
    assert not c.replay and "replay failed" in c.why and c.graph_s is None
    c = choose_replay(plain, replayed, False, timer_of({}))
    assert not c.replay and c.plain_s is None  # off CUDA nothing is timed


def test_cuda_graph_auto_and_bad_values():
    args = _args()
    with pytest.raises(ValueError, match="cuda_graph must be True, False or 'auto', got 'yes'"):
        autofuse.optimize(two, args, cuda_graph="yes")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CudaGraphNote)  # auto decides quietly
        opt = autofuse.optimize(two, args, cuda_graph="auto")
        got = opt(*args)
    for g, w in zip(got, two(*args)):
        assert torch.allclose(g, w, atol=1e-5)
    if DEVICE == "cpu":
        assert opt.graph_choice.replay is False and opt.graphs is None
    else:  # both timed on CUDA; whichever won, the result is eager's
        assert opt.graph_choice.plain_s and opt.graph_choice.graph_s


@pytest.mark.parametrize("options", [{"cuda_graph": "auto"}, {}], ids=["auto", "default"])
def test_backend_cuda_graph_auto_times_inference_graphs(options):
    """``"auto"`` is the backend's default for inference graphs: timed both ways on CUDA."""
    torch._dynamo.reset()
    m = _Block().to(DEVICE)
    x = torch.randn(8, 16, device=DEVICE)
    fast = torch.compile(m, backend="autofuse", options=options)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), m(x), atol=1e-5, rtol=1e-5)
    from autofuse.frontend import compiled_graphs

    g = compiled_graphs()[-1]
    assert g.graph_choice is not None
    assert (g.replay is not None) == g.graph_choice.replay
    if DEVICE == "cpu":
        assert not g.graph_choice.replay and g.graph_choice.plain_s is None


def test_backend_cuda_graph_false_times_nothing():
    torch._dynamo.reset()
    m = _Block().to(DEVICE)
    x = torch.randn(8, 16, device=DEVICE)
    fast = torch.compile(m, backend="autofuse", options={"cuda_graph": False})
    with torch.no_grad():
        torch.testing.assert_close(fast(x), m(x), atol=1e-5, rtol=1e-5)
    from autofuse.frontend import compiled_graphs

    g = compiled_graphs()[-1]
    assert g.graph_choice is None and g.replay is None


def _unfused(fn, args):
    from autofuse.partition import Partitioner
    from autofuse.plan.runtime import build_plan

    g = autofuse.capture(fn, args).graph
    return build_plan(g, Partitioner(g).unfused().groups)


def test_dead_kernel_buffers_are_written_again_instead_of_allocated():
    """A chain of six kernels needs two buffers, not six: each output after the second is
    written into a buffer no later step reads; results stay right call after call, and a
    buffer the caller gets (or a view of it) is never reused."""
    from autofuse.plan.runtime import execute

    def chain(x, w):
        y = x
        kept = []
        for k in range(6):
            y = y * w
            if k == 1:
                kept.append(y.view(4, 16))  # an output's view: y2 must not be written over
        return y, kept[0]

    x, w = torch.randn(64), torch.randn(64)
    plan = _unfused(chain, (x, w))
    want = chain(x, w)
    for _ in range(2):
        got = execute(plan, [x, w])
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
    prog = plan.__dict__["_program"]
    assert prog.reused == 3  # y3 <- y1, y5 <- y3's, y6 <- y4: y2 is an output's base


def test_a_buffer_an_eager_op_reads_is_not_reused():
    """An eager op's result may alias what it reads (a view returned by a library call), so a
    buffer such an op reads stays as it is; a matmul's result is always new."""
    from autofuse.plan.program import last_reads

    def f(x, w):
        y = torch.sigmoid(x) * 2.0
        z = torch.sort(y, dim=-1).values  # a library call (eager)
        return (y @ w).relu() + 1.0, z * 3.0

    x, w = torch.randn(8, 8), torch.randn(8, 8)
    plan = _unfused(f, (x, w))
    g = plan.graph
    reads = last_reads(plan)
    outputs = {g.base_of(o) for o in g.outputs}
    assert not outputs & set(reads)
    opaque = plan.fallbacks
    assert opaque and any(g[s.out].kind == "matmul" for s in plan.library)
    for step in opaque:
        assert not {g.base_of(i) for i in g[step.node].inputs} & set(reads)
    y = next(s for s in plan.steps if hasattr(s, "kernel") and "mul" in s.kernel.name)
    (y_node,) = y.kernel.info.stored
    assert y_node not in reads  # the sort reads y: y is never written over
    for got, want in zip(_execute_twice(plan, [x, w]), f(x, w)):
        torch.testing.assert_close(got, want)


def _execute_twice(plan, args):
    from autofuse.plan.runtime import execute

    execute(plan, args)
    return execute(plan, args)


def test_an_eager_fallback_never_hands_back_memory_it_read(monkeypatch):
    """A kernel that runs in eager (it could not be built) stores new buffers, as its kernel
    would: a result eager returns as it got it (here every op returns its first operand) is
    copied, so no later kernel output written into a dead buffer can land in an input."""
    from autofuse.plan import runtime

    def f(x):
        return x * 1.0

    x = torch.randn(8, 8)
    plan = _unfused(f, (x,))
    (step,) = [s for s in plan.steps if hasattr(s, "kernel")]
    real = runtime.eval_node
    monkeypatch.setattr(
        runtime,
        "eval_node",
        lambda node, args, device: args[0] if args else real(node, args, device),
    )
    run = runtime._Run(plan, x.device)
    run.env[plan.graph.inputs[0]] = x
    runtime.run_group_eagerly(run, step.kernel.info)
    (s,) = step.kernel.info.stored
    out = run.env[s]
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert torch.equal(out, x) and out.is_contiguous()


def test_graphs_compiled_since_a_count_past_the_kept_512(monkeypatch):
    """compiled_graphs() keeps the last 512: a test marks the count, not the list's length."""
    import collections

    from autofuse.frontend import dynamo

    monkeypatch.setattr(dynamo, "_COMPILED", collections.deque(range(512), maxlen=512))
    monkeypatch.setattr(dynamo, "_COUNT", [700])
    mark = dynamo.compiled_count()
    assert dynamo.compiled_since(mark) == []
    dynamo._COMPILED.append("new")
    dynamo._COUNT[0] += 1
    assert dynamo.compiled_since(mark) == ["new"] and len(dynamo.compiled_graphs()) == 512
