"""The backend on graphs that read scalars out of tensors (``.item()``,
``aten._local_scalar_dense``) or have data-dependent sizes, after a shape change and with
``dynamic=True``: they run (fused where the scalar is an input's value, in eager where it is
computed), and match eager. Tiny shapes: every kernel runs in Triton's interpreter."""

import warnings

import pytest
import torch
import torch.nn.functional as F

from autofuse.frontend import dynamo
from autofuse.frontend.specialize import SpecializedGraph, item_inputs
from tests.helpers import assert_close

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py


class _Scaled(torch.nn.Module):
    """A float attribute Dynamo stops specializing once it changes (read back with .item())."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = 0.5
        self.p = 0.0
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = F.dropout(self.lin(x), self.p, training=True)
        return torch.softmax(y, -1) * self.scale


def test_float_attribute_after_a_recompile_is_a_fused_constant():
    torch.manual_seed(0)
    mod = _Scaled()
    backend = dynamo.make_backend()
    fast = torch.compile(mod, backend=backend)
    with torch.no_grad():
        for rows, scale in ((2, 0.5), (3, 0.5), (5, 0.25), (3, 0.25), (4, -2.0)):
            mod.scale = scale
            x = torch.randn(rows, 8)
            assert_close(fast(x), mod(x), torch.float32, f"rows {rows}, scale {scale}")
    assert backend.records
    assert all(not r.plan.fallbacks or "local_scalar" not in str(r.fallback_ops())
               for r in backend.records)  # fmt: skip


def test_dropout_probability_attribute_changes_after_a_batch_recompile():
    torch.manual_seed(0)
    mod = _Scaled()
    fast = torch.compile(mod, backend=dynamo.make_backend())
    with torch.no_grad():
        for rows in (2, 3):
            x = torch.randn(rows, 8)
            assert_close(fast(x), mod(x), torch.float32, f"p=0, rows {rows}")
        mod.p = 1.0  # every element dropped: the new value must reach the plan
        out = fast(torch.randn(5, 8))
    assert torch.equal(out, torch.full_like(out, 0.5 / 8)), out


def test_item_of_a_computed_tensor_after_a_shape_change():
    def f(x):
        return torch.softmax(x * x.sum().item(), -1)

    fast = torch.compile(f, backend=dynamo.make_backend())
    for rows in (2, 3, 5):
        x = torch.randn(rows, 8) / 8
        assert_close(fast(x), f(x), torch.float32, f"rows {rows}")


@pytest.mark.parametrize("dynamic", [None, True])
def test_captured_scalar_outputs_do_not_abort_capture(dynamic):
    def f(x):
        return torch.softmax(x * x.sum().item(), -1) + x.shape[0]

    fast = torch.compile(f, backend=dynamo.make_backend(), dynamic=dynamic)
    with warnings.catch_warnings(), torch._dynamo.config.patch(capture_scalar_outputs=True):
        warnings.simplefilter("ignore", RuntimeWarning)  # the graph runs in eager
        for rows in (2, 3, 5):
            x = torch.randn(rows, 8) / 8
            assert_close(fast(x), f(x), torch.float32, f"rows {rows}")


def test_data_dependent_output_shape_runs():
    def f(x):
        return x[x > 0].sum() + torch.softmax(x, -1)

    fast = torch.compile(f, backend=dynamo.make_backend(), dynamic=True)
    patch = torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True)
    with warnings.catch_warnings(), patch:
        warnings.simplefilter("ignore", RuntimeWarning)
        for rows in (2, 3):
            x = torch.randn(rows, 8)
            assert_close(fast(x), f(x), torch.float32, f"rows {rows}")


def test_specialized_graph_keys_on_the_values_read():
    def f(x, s):
        return x * s.item()

    gm = torch.fx.symbolic_trace(f)
    assert item_inputs(gm) == (1,)
    made = []

    def compile_(g, fakes):
        made.append(fakes)
        return g

    run = SpecializedGraph(compile_, gm)
    x = torch.ones(3)
    for s in (2.0, 2.0, float("nan"), float("nan"), -0.0, 0.0):
        out = run(x, torch.tensor(s))
        assert torch.equal(torch.isnan(out), torch.isnan(x * s))
    assert len(made) == 4  # 2.0, nan, -0.0, 0.0: each value compiled once
    assert all(len(f) == 2 and f[0].shape == (3,) for f in made)  # fake tensors, sizes static


@pytest.mark.slow
def test_llama_tiny_dynamic_true_runs_at_new_lengths():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=64, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaModel(cfg).eval()
    backend = dynamo.make_backend()
    fast = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for length in (5, 7):
            ids = torch.randint(0, 64, (1, length))
            out = fast(ids).last_hidden_state
            assert_close(out, model(ids).last_hidden_state, torch.float32, f"length {length}")
    assert backend.records  # compiled by autofuse, not skipped
    assert backend.counts["plans"] == 1 and backend.counts["bucket_instances"] == 1  # 5, 7


def _checked_sizes(x, y):
    z = y.item()
    torch._check(z // 2 == 3)
    return x + x.new_ones(z)


def _unbacked_cat(x, y):
    z = y.item()
    return torch.cat([x, x.new_ones(z, x.shape[1])])


@pytest.mark.parametrize(
    "fn,cases",
    [
        (
            _checked_sizes,
            [(torch.randn(6), torch.tensor([6])), (torch.randn(7), torch.tensor([7]))],
        ),
        (
            _unbacked_cat,
            [(torch.randn(2, 3), torch.tensor([0])), (torch.randn(2, 3), torch.tensor([2]))],
        ),
    ],
)
@torch._dynamo.config.patch(capture_scalar_outputs=True)
def test_runtime_assertions_on_item_sizes_are_checked_at_capture(fn, cases):
    """``aten._assert_scalar`` (``torch._check``, an unbacked size's bounds) in a graph bound to
    the values read: a true condition is dropped, the graph still fuses."""
    fast = torch.compile(fn, backend=dynamo.make_backend(), fullgraph=True)
    for x, y in cases:
        assert torch.equal(fast(x, y), fn(x, y))


@torch._dynamo.config.patch(capture_scalar_outputs=True)
def test_a_false_runtime_assertion_raises_as_eager():
    fast = torch.compile(_checked_sizes, backend=dynamo.make_backend(), fullgraph=True)
    with pytest.raises(RuntimeError, match="Runtime assertion failed"):
        fast(torch.randn(8), torch.tensor([8]))
