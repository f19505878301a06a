"""autofuse as a torch.compile backend (autofuse/frontend): forward and backward plans, options,
recompiles, graph breaks, eager fallbacks, and optimize's autograd path. Tiny shapes: every
kernel runs in Triton's interpreter."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import autofuse
from autofuse.frontend import dynamo
from autofuse.frontend.optimized import AutogradUnsupported, BackendFunction
from tests.helpers import assert_close

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py


def _grads(module):
    return {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}


def _mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8)
    )


def test_registered_by_name():
    def f(x, y):
        return torch.sigmoid(x * y + 1.0)

    assert "autofuse" in torch._dynamo.list_backends()
    x, y = torch.randn(4, 8), torch.randn(8)
    fast = torch.compile(f, backend="autofuse")
    assert_close(fast(x, y), f(x, y), torch.float32)


def test_entry_point_is_found_without_importing_autofuse(tmp_path):
    """Dynamo discovers the backend through the torch_dynamo_backends entry point (as an
    installed autofuse declares it in pyproject.toml)."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        eps = tomllib.load(f)["project"]["entry-points"]["torch_dynamo_backends"]
    assert eps == {"autofuse": "autofuse.frontend.dynamo:autofuse_backend"}
    dist = tmp_path / "autofuse_ep_probe-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: autofuse-ep-probe\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        "[torch_dynamo_backends]\nautofuse = autofuse.frontend.dynamo:autofuse_backend\n"
    )
    code = textwrap.dedent(
        """
        import sys, torch
        assert "autofuse" not in sys.modules
        f = torch.compile(lambda x: torch.relu(x) * 2.0, backend="autofuse")
        x = torch.randn(8)
        assert torch.allclose(f(x), torch.relu(x) * 2.0)
        assert "autofuse.frontend.dynamo" in sys.modules
        print("OK")
        """
    )
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       cwd=ROOT, timeout=300)  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip() == "OK", r.stderr[-3000:]


def test_import_autofuse_imports_neither_dynamo_nor_triton():
    code = "import sys, autofuse; print('torch._dynamo' in sys.modules, 'triton' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       cwd=ROOT, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "False False"


def test_unknown_options_raise_type_error():
    f = torch.compile(lambda x: x + 1, backend="autofuse", options={"trails": 8})
    with pytest.raises(TypeError, match="'trails'.*did you mean 'trials'"):
        f(torch.randn(4))
    with pytest.raises(TypeError, match="'trails'"):
        autofuse.optimize(lambda x: x + 1, (torch.randn(4),), trails=8)
    with pytest.raises(TypeError, match="'budget'"):
        dynamo.make_backend(budget=3)


def test_known_options_are_accepted_on_cpu(tmp_path):
    """Tuning needs a GPU: on CPU the greedy plan runs, the options are accepted."""
    fast = torch.compile(
        lambda x: torch.exp(x) * 2.0,
        backend="autofuse",
        options={"trials": 2, "time_budget": 5, "cache_dir": str(tmp_path)},
    )
    x = torch.randn(8)
    assert_close(fast(x), torch.exp(x) * 2.0, torch.float32)


def test_training_matches_eager_gradients():
    ref, mod = _mlp(), _mlp()
    x = torch.randn(4, 16)
    ref(x).pow(2).mean().backward()
    backend = dynamo.make_backend()
    fast = torch.compile(mod, backend=backend)
    out = fast(x)
    assert out.requires_grad
    out.pow(2).mean().backward()
    want, got = _grads(ref), _grads(mod)
    assert set(got) == set(want)
    for n in want:
        assert_close(got[n], want[n], torch.float32, n)
    kinds = [r.kind for r in backend.records]
    assert kinds == ["forward", "backward"], kinds
    fw, bw = backend.records
    assert fw.plan is not bw.plan and bw.plan.kernels  # the backward has a plan of its own
    assert fw.fallback_ops()["mm"] >= 0  # matmuls run as torch.mm or in GEMM kernels


def test_plans_are_built_outside_aot_autograds_fake_mode(monkeypatch):
    """AOTAutograd compiles the forward graph inside its FakeTensorMode: the tuner's timing
    runs there failed every candidate ("Cannot access data pointer of Tensor"). Plans (tuned
    or not) are built with the fake mode unset."""
    seen = []
    plan_for = dynamo.AutofuseBackend.plan_for

    def spy(self, graph, kind, metas, *variants):
        seen.append((kind, type(torch.empty(1)) is torch.Tensor))
        return plan_for(self, graph, kind, metas, *variants)

    monkeypatch.setattr(dynamo.AutofuseBackend, "plan_for", spy)
    mod = _mlp()
    torch.compile(mod, backend=dynamo.make_backend())(torch.randn(4, 16)).sum().backward()
    assert seen == [("forward", True), ("backward", True)], seen


def test_input_gradients_and_none_outputs():
    """Gradients w.r.t. inputs; an integer input gets no gradient (None in the backward graph);
    a constant tensor created in forward becomes a lifted constant."""

    def f(x, idx, w):
        scale = torch.tensor([1.0, 2.0, 3.0, 4.0])
        return (F.embedding(idx, w) * scale).sum(-1) + x

    x = torch.randn(2, 3, requires_grad=True)
    w = torch.randn(10, 4, requires_grad=True)
    idx = torch.randint(0, 10, (2, 3))
    fast = torch.compile(f, backend="autofuse")
    gx, gw = torch.autograd.grad(fast(x, idx, w).pow(2).sum(), (x, w))
    rx, rw = torch.autograd.grad(f(x, idx, w).pow(2).sum(), (x, w))
    assert_close(gx, rx, torch.float32, "dx")
    assert_close(gw, rw, torch.float32, "dw")


def test_unsupported_ops_run_as_eager_steps():
    def f(x):
        return torch.logcumsumexp(torch.sin(x), -1) * 2.0 + torch.sort(x, -1).values

    backend = dynamo.make_backend()
    x = torch.randn(4, 8, requires_grad=True)
    fast = torch.compile(f, backend=backend)
    (g,) = torch.autograd.grad(fast(x).sum(), x)
    (r,) = torch.autograd.grad(f(x).sum(), x)
    assert_close(g, r, torch.float32)
    fw = backend.records[0]
    ops = fw.fallback_ops()
    assert ops["aten.logcumsumexp.default"] == 1 and ops["aten.sort.default"] == 1, ops
    assert fw.plan.kernels  # the sin / mul / add still run as generated kernels


def test_sdpa_runs_as_a_library_call():
    def attn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2.0

    q, k, v = (torch.randn(1, 2, 8, 8, requires_grad=True) for _ in range(3))
    backend = dynamo.make_backend()
    fast = torch.compile(attn, backend=backend)
    got = torch.autograd.grad(fast(q, k, v).sum(), (q, k, v))
    want = torch.autograd.grad(attn(q, k, v).sum(), (q, k, v))
    for g, w in zip(got, want):
        assert_close(g, w, torch.float32)
    fw, bw = backend.records
    assert any("_scaled_dot_product" in op for op in fw.fallback_ops()), fw.fallback_ops()
    assert any("_scaled_dot_product" in op for op in bw.fallback_ops()), bw.fallback_ops()


def test_batch_size_change_recompiles_one_plan_per_shape():
    mod = _mlp()
    backend = dynamo.make_backend()
    fast = torch.compile(mod, backend=backend)
    with torch.no_grad():
        for batch in (2, 3, 5):
            x = torch.randn(batch, 16)
            assert_close(fast(x), mod(x), torch.float32, f"batch {batch}")
    inputs = {tuple(r.graph[i].shape for i in r.graph.inputs) for r in backend.records}
    assert len(backend.records) == 3 and len(inputs) == 3, inputs  # static plans, one per shape


def test_dynamic_true_is_specialized_per_shape():
    def f(x):
        return torch.softmax(x * 2.0, -1)

    backend = dynamo.make_backend()
    fast = torch.compile(f, backend=backend, dynamic=True)
    for n in (3, 6, 3):
        x = torch.randn(n, 8)
        assert_close(fast(x), f(x), torch.float32, f"rows {n}")
    assert len(backend.records) == 2  # two shapes, two static plans; the third call hits


def test_train_eval_switch_recompiles_and_dropout_follows_the_mode():
    torch.manual_seed(0)
    mod = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Dropout(0.5))
    backend = dynamo.make_backend()
    fast = torch.compile(mod, backend=backend)
    x = torch.randn(8, 16)
    with torch.no_grad():
        mod.eval()
        ev = fast(x)
        assert_close(ev, mod(x), torch.float32, "eval")
        n_eval = len(backend.records)
        mod.train()
        tr = fast(x)
    assert len(backend.records) > n_eval  # the mode change recompiled
    dropped = tr == 0
    assert 0 < dropped.float().mean() < 1  # dropout in train mode
    assert_close(tr[~dropped], 2.0 * ev[~dropped], torch.float32, "kept * 1/(1-p)")


def test_graph_breaks_still_work(capsys):
    def f(x):
        y = torch.sin(x) * 2.0
        print("between graphs")
        n = int((y > 0).sum().item())  # .item() ends a graph too
        return torch.cos(y) + n

    backend = dynamo.make_backend()
    fast = torch.compile(f, backend=backend)
    x = torch.randn(4, 8)
    assert_close(fast(x), f(x), torch.float32)
    assert "between graphs" in capsys.readouterr().out
    assert len(backend.records) >= 2


def test_gemm_epilogue_with_tanh_builds():
    """GEMM kernels emit the jitted helpers their epilogue calls (GPT-2's tanh gelu)."""

    def f(x, w):
        return torch.tanh(x @ w) * 0.5

    x, w = torch.randn(16, 32), torch.randn(32, 16)
    opt = autofuse.optimize(f, (x, w))
    assert "def _af_tanh" in opt.plan.kernels[0].source
    assert_close(opt(x, w), f(x, w), torch.float32)


# ---------------------------------------------------------------------------------------------
# optimize: the make_fx plan for plain calls, the backend path for autograd / modes / kwargs
# ---------------------------------------------------------------------------------------------


def test_optimize_supports_autograd_and_keeps_its_plan():
    ref, mod = _mlp(), _mlp()
    x = torch.randn(4, 16)
    opt = autofuse.optimize(mod, (x,))
    assert opt.plan.kernels and "greedy" in opt.report()
    assert [r.kind for r in opt.autograd.records] == ["forward", "backward"]  # warmed
    assert all(p.grad is None for p in mod.parameters())  # the warm-up left .grad alone
    with torch.no_grad():
        assert_close(opt(x), ref(x), torch.float32, "no-grad call (make_fx plan)")
    opt(x).pow(2).mean().backward()
    ref(x).pow(2).mean().backward()
    want, got = _grads(ref), _grads(mod)
    assert set(got) == set(want)
    for n in want:
        assert_close(got[n], want[n], torch.float32, n)


def test_optimize_follows_module_mode():
    torch.manual_seed(0)
    mod = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).eval()
    x = torch.randn(16, 8)
    with torch.no_grad():
        opt = autofuse.optimize(mod, (x,))
        assert_close(opt(x), mod(x), torch.float32)
        mod.train()
        tr = opt(x)
    assert (tr == 0).any()  # dropout applied: the call went through the backend path


def test_optimize_kwargs():
    def f(x, *, scale, shift=None):
        return torch.relu(x * scale) + (0.0 if shift is None else shift)

    x, s, b = torch.randn(4, 8), torch.randn(8), torch.randn(4, 8)
    opt = autofuse.optimize(f, (x,), example_kwargs={"scale": s, "shift": b})
    assert isinstance(opt, BackendFunction) and opt.plan is not None
    assert_close(opt(x, scale=s, shift=b), f(x, scale=s, shift=b), torch.float32)


def test_requires_grad_without_autograd_support_raises():
    from autofuse.api import OptimizedFunction

    def f(x, w):
        return torch.sigmoid(x * w)

    x, w = torch.randn(4, 8), torch.randn(8, requires_grad=True)
    opt = autofuse.optimize(f, (x, w.detach()))
    bare = OptimizedFunction(opt.captured, opt.plan)  # no backend path (like a cached plan)
    with torch.no_grad():
        assert_close(bare(x, w), f(x, w), torch.float32)
    with pytest.raises(AutogradUnsupported, match="requires grad"):
        bare(x, w)
    # optimize's own result takes the backend path and records the graph
    out = opt(x, w)
    (g,) = torch.autograd.grad(out.sum(), w)
    (r,) = torch.autograd.grad(f(x, w).sum(), w)
    assert_close(g, r, torch.float32)


@torch.library.custom_op("autofuse_test::scaled_and_count", mutates_args=())
def _scaled_and_count(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    return x * 2.0, 7


@_scaled_and_count.register_fake
def _(x):
    return torch.empty_like(x), 7


def test_multi_output_op_with_numbers_runs_in_eager_and_fuses_around():
    """An op returning numbers beside its tensors (as CUDA's cuDNN SDPA returns its sequence
    lengths): the tensor outputs are its eager step's, the numbers are read as constants."""

    def f(x):
        y, n = torch.ops.autofuse_test.scaled_and_count(x)
        return (y + n).sigmoid()

    x = torch.randn(5, 11)
    captured = autofuse.capture(f, (x,))
    ops = [node.op for node in captured.graph.nodes]
    assert "opaque" in ops and "sigmoid" in ops
    opt = autofuse.optimize(f, (x,))
    torch.testing.assert_close(opt(x), f(x))
    fast = torch.compile(f, backend="autofuse")
    torch.testing.assert_close(fast(x), f(x))


def test_outputs_get_their_traced_strides_back_on_every_call():
    """An output the plan lays out otherwise than the traced graph is copied to the traced
    strides on each call; after a call whose inputs passed the C-level guard, which outputs need
    it is known (the same on every such call) and the others are not checked again."""

    def f(x):
        return (x * 2.0,)

    backend = dynamo.make_backend()
    x = torch.randn(6, 5)
    torch.compile(f, backend=backend)(x)
    (g,) = backend.records
    g._out_strides = ((1, 6),)  # as if the traced output were column-major
    g._restride_when_checked = None
    for _ in range(3):
        (out,) = g([x])
        assert out.stride() == (1, 6)
        assert_close(out, x * 2.0, torch.float32)
    assert g._restride_when_checked == (0,) and g.restrided == 3
