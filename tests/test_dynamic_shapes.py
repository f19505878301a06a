"""Dynamic shapes through the backend: graphs Dynamo makes symbolic get runtime-size loop
kernels (``kernels/common/sizes.py``) and one plan per shape bucket (``plan/buckets.py``): correct at
every size (1, primes, just above a block), at most one plan per bucket, and no kernel built
twice for the sizes of one bucket (counted by the loader). Tiny shapes, Triton's interpreter."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from autofuse.frontend import dynamo
from autofuse.kernels import kind_of
from autofuse.kernels.common.loader import kernels_built
from autofuse.kernels.common.sizes import size_bucket
from tests.helpers import assert_close

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py

LENGTHS = (1, 2, 7, 9, 13, 16, 17, 31, 33, 64)  # 1, primes, just above 8 / 16 / 32
BATCHES = (1, 3)


def softmax_norm(x, w, b):
    return F.layer_norm(torch.softmax(x, -1), (x.shape[-1],), w, b) * 2.0 + 1.0


def _sweep(fast, fn, shapes, make, buckets=None):
    """Runs every shape; returns {bucket: kernels built by calls after the bucket's first}."""
    rebuilt: dict[tuple, int] = {}
    for shape in shapes:
        args = make(shape)
        before = kernels_built()
        assert_close(fast(*args), fn(*args), torch.float32, f"shape {shape}")
        key = tuple(size_bucket(s, buckets) for s in shape)
        if key in rebuilt:
            rebuilt[key] += kernels_built() - before
        else:
            rebuilt[key] = 0
    return rebuilt


def _norm_inputs(shape):
    torch.manual_seed(sum(shape))
    return torch.randn(*shape, 32), torch.randn(32), torch.randn(32)


def test_dynamic_true_one_plan_per_bucket_and_kernels_shared():
    backend = dynamo.make_backend()
    fast = torch.compile(softmax_norm, backend=backend, dynamic=True)
    shapes = [(b, t) for b in BATCHES for t in LENGTHS]
    rebuilt = _sweep(fast, softmax_norm, shapes, _norm_inputs)
    assert all(n == 0 for n in rebuilt.values()), rebuilt  # no kernel built twice in a bucket
    assert 0 < backend.counts["plans"] <= len(rebuilt), (backend.counts, len(rebuilt))
    assert backend.counts["bucket_instances"] >= len(shapes) - len(rebuilt) - 2  # 0/1 graphs
    src = [k.source for r in backend.records for k in r.plan.kernels]
    assert src and not any("xnumel = " in s for s in src)  # the row count is the argument


def test_mark_dynamic_and_a_user_bucket_list():
    backend = dynamo.make_backend(buckets=[8, 64])
    fast = torch.compile(softmax_norm, backend=backend)
    shapes = [(3, t) for t in (5, 2, 8, 9, 33, 64, 17)]

    def make(shape):
        x, w, b = _norm_inputs(shape)
        torch._dynamo.mark_dynamic(x, 1)
        return x, w, b

    rebuilt = _sweep(fast, softmax_norm, shapes, make, buckets=[8, 64])
    assert set(rebuilt) == {(8, 8), (8, 64)}
    assert backend.counts["plans"] <= 2, backend.counts
    # a listed bucket spanning several powers of two may pick a config per power of two
    assert sum(rebuilt.values()) <= 3, rebuilt


def test_static_graphs_keep_their_constant_sizes():
    backend = dynamo.make_backend()
    fast = torch.compile(softmax_norm, backend=backend, dynamic=False)
    x, w, b = _norm_inputs((2, 5))
    assert_close(fast(x, w, b), softmax_norm(x, w, b), torch.float32, "static")
    (record,) = backend.records
    assert all("xnumel = 10" in k.source for k in record.plan.kernels)
    assert backend.counts["bucket_instances"] == 0


def test_runtime_sizes_pointwise_and_reduction_edges():
    def f(x, y):
        return (x.sin() * y).sum(-1), torch.relu(x) + 1.0

    fast = torch.compile(f, backend=dynamo.make_backend(), dynamic=True)
    for rows in (0, 1, 2, 127, 129, 1025):
        x, y = torch.randn(rows, 12), torch.randn(rows, 12)
        for got, want in zip(fast(x, y), f(x, y)):
            assert_close(got, want, torch.float32, f"rows {rows}")


def test_unknown_bucket_option_type_is_named():
    with pytest.raises(TypeError, match="bucket"):
        dynamo.make_backend(bucket=[8])


@pytest.mark.exhaustive
def test_function_50_lengths_4_batches():
    backend = dynamo.make_backend()
    fast = torch.compile(softmax_norm, backend=backend, dynamic=True)
    lengths = sorted({1, 2, 3, 5, 7, 11, 13, 17, 31, 33, 65, 129} | set(range(4, 120, 3)))[:50]
    shapes = [(b, t) for b in (1, 2, 5, 17) for t in lengths]
    rebuilt = _sweep(fast, softmax_norm, shapes, _norm_inputs)
    assert all(n == 0 for n in rebuilt.values()), rebuilt
    assert backend.counts["plans"] <= len(rebuilt), (backend.counts, len(rebuilt))


def test_optimize_dynamic_names_dims_and_shares_bucket_plans():
    import autofuse

    w, b = torch.randn(32), torch.randn(32)
    opt = autofuse.optimize(softmax_norm, (torch.randn(3, 5, 32), w, b), dynamic={"x": [0, 1]})
    shapes = [(3, 6), (3, 7), (4, 8), (2, 9), (3, 1)]
    rebuilt = _sweep(opt, softmax_norm, shapes, lambda s: (torch.randn(*s, 32), w, b))
    assert rebuilt[(4, 8)] == 0  # 3x6, 3x7, 4x8: one bucket, one plan, no kernel rebuilt
    assert opt.counts["plans"] <= len(rebuilt | {(4, 8): 0}), opt.counts


def _builds_by_bucket(fast, fn, shapes, make):
    """Runs every shape; returns {bucket: (kernels built by its calls, kinds of the kernels
    its plans hold)}."""
    out: dict[tuple, tuple[int, set[str]]] = {}
    for shape in shapes:
        args, before, count = make(shape), kernels_built(), dynamo.compiled_count()
        assert_close(fast(*args), fn(*args), torch.float32, f"shape {shape}")
        kinds = {kind_of(k.info).name for r in dynamo.compiled_since(count)
                 for k in r.plan.kernels}  # fmt: skip
        built, seen = out.get(tuple(map(size_bucket, shape)), (0, set()))
        out[tuple(map(size_bucket, shape))] = (built + kernels_built() - before, seen | kinds)
    return out


def test_one_partition_per_structure_shared_by_every_bucket():
    counters.clear()
    backend = dynamo.make_backend()
    fast = torch.compile(softmax_norm, backend=backend, dynamic=True)
    batches, lengths = (1, 3), (2, 5, 6, 9, 17, 33)
    built = _builds_by_bucket(fast, softmax_norm, [(b, t) for b in batches for t in lengths],
                              _norm_inputs)  # fmt: skip
    # Dynamo specializes batch 1: two traced graphs, each traced by AOTAutograd once (not per
    # shape) and partitioned once, whatever the buckets
    assert backend.counts["plans"] <= 2 < len(built), (backend.counts, built)
    assert counters["aot_autograd"]["total"] <= 2, counters["aot_autograd"]
    for bucket, (n, kinds) in built.items():
        assert n <= 2 * len(kinds), (bucket, n, kinds)


def test_optimize_dynamic_traces_and_partitions_once():
    import autofuse

    counters.clear()
    w, b = torch.randn(32), torch.randn(32)
    opt = autofuse.optimize(softmax_norm, (torch.randn(3, 5, 32), w, b), dynamic={"x": [0, 1]})
    built = _builds_by_bucket(opt, softmax_norm, [(3, 6), (2, 9), (4, 17), (3, 33), (2, 3)],
                              lambda s: (torch.randn(*s, 32), w, b))  # fmt: skip
    assert opt.counts["plans"] == 1 and counters["aot_autograd"]["total"] == 1, opt.counts
    assert all(n <= 2 * len(kinds) for n, kinds in built.values()), built


def test_training_at_new_lengths_reuses_the_trace_and_the_partitions():
    def f(x, lin, w):
        return F.layer_norm(torch.softmax(x @ lin, -1), (16,), w).relu().sum(1)

    counters.clear()
    backend = dynamo.make_backend()
    fast = torch.compile(f, backend=backend, dynamic=True)
    for t in (3, 5, 6, 9, 12):
        torch.manual_seed(t)
        args = [torch.randn(2, t, 16), torch.randn(16, 16), torch.randn(16)]
        args = [a.requires_grad_() for a in args]
        got = fast(*args)
        grads = torch.autograd.grad(got.square().sum(), args)
        want = f(*args)
        assert_close(got, want, torch.float32, f"length {t}")
        for g, r in zip(grads, torch.autograd.grad(want.square().sum(), args)):
            assert_close(g, r, torch.float32, f"length {t} grad")
    assert backend.counts["plans"] == 2 and counters["aot_autograd"]["total"] == 1, backend.counts
    assert backend.counts["bucket_instances"] == 8, backend.counts  # forward and backward


def test_a_float_argument_read_per_call_keeps_one_trace():
    def f(x, s):
        return torch.softmax(x * s, -1) + s

    counters.clear()
    backend = dynamo.make_backend()
    fast = torch.compile(f, backend=backend, dynamic=True)
    for t, s in [(3, 0.5), (5, 0.5), (6, 0.25), (9, 0.5), (9, 0.25)]:
        x = torch.randn(2, t, 8)
        assert_close(fast(x, s), f(x, s), torch.float32, f"length {t}, scale {s}")
    assert backend.counts["plans"] == 1 and counters["aot_autograd"]["total"] == 1, counters


def _bn(x, w, b):
    return F.batch_norm(x, None, None, w, b, training=True).tanh()


def _train_sweep(fast, fn, shapes):
    """Forward and backward at each shape, checked against eager."""
    for shape in shapes:
        torch.manual_seed(sum(shape))
        args = [torch.randn(*shape), torch.rand(3).add(0.5), torch.randn(3)]
        args = [a.requires_grad_() for a in args]
        got, want = fast(*args), fn(*args)
        assert_close(got, want, torch.float32, f"shape {shape}")
        grads = torch.autograd.grad(got.square().sum(), args)
        for g, r in zip(grads, torch.autograd.grad(want.square().sum(), args)):
            assert_close(g, r, torch.float32, f"shape {shape} grad")


@pytest.mark.parametrize("front", ["compile", "optimize"])
def test_training_where_the_backward_divides_by_a_size(front):
    """batch_norm's backward scales by 1 / (the count of its rows): a float computed from the
    symbolic sizes, a constant once the traced graph is specialized. Its decomposition scales
    by a power of two chosen by that count's power-of-two range: one trace per range."""
    import autofuse

    counters.clear()
    shapes = [(2, 3, 5), (3, 3, 4), (2, 3, 7), (4, 3, 6)]  # 10, 12, 14 rows; then 24
    if front == "compile":
        fast = torch.compile(_bn, backend=dynamo.make_backend(), dynamic=True)
    else:
        args = (torch.randn(*shapes[0]), torch.rand(3), torch.randn(3))
        fast = autofuse.optimize(_bn, args, dynamic={"x": [0, 2]})
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no graph left to eager
        _train_sweep(fast, _bn, shapes)
    # (optimize's example call, without gradients, is a graph of its own)
    assert counters["aot_autograd"]["total"] == 2 + (front == "optimize"), counters["aot_autograd"]


def test_a_backward_that_cannot_compile_runs_as_traced(monkeypatch):
    compile_graph = dynamo.AutofuseBackend.compile_graph

    def refuse_backward(self, kind, gm, example_inputs):
        if kind == "backward":
            raise RuntimeError("refused")
        return compile_graph(self, kind, gm, example_inputs)

    monkeypatch.setattr(dynamo.AutofuseBackend, "compile_graph", refuse_backward)
    fast = torch.compile(_bn, backend=dynamo.make_backend(), dynamic=True)
    with pytest.warns(RuntimeWarning, match="runs in eager"):
        _train_sweep(fast, _bn, [(2, 3, 5), (4, 3, 7)])


def transposed(x, w):
    return (x.transpose(1, 2) * w[:, None]).sin() + x.mean(2)[:, None, :]


@pytest.mark.parametrize("front", ["compile", "optimize"])
def test_a_length_in_the_index_arithmetic_is_an_argument(front):
    """x read transposed: the length is in the index arithmetic of the kernels reading it, an
    argument from the second length on (forward and backward)."""
    import autofuse

    lengths, w = (5, 6, 7, 9, 11, 13), torch.randn(4)
    if front == "compile":
        fast = torch.compile(transposed, backend=dynamo.make_backend(), dynamic=True)
    else:
        fast = autofuse.optimize(transposed, (torch.randn(2, 3, 4), w), dynamic={"x": [1]})
    built = {}
    for t in lengths:
        torch.manual_seed(t)
        x = torch.randn(2, t, 4, requires_grad=True)
        before = kernels_built()
        got = fast(x, w)
        (grad,) = torch.autograd.grad(got.square().sum(), x)
        built[t] = kernels_built() - before
        want = transposed(x, w)
        assert_close(got, want, torch.float32, f"length {t}")
        assert_close(grad, torch.autograd.grad(want.square().sum(), x)[0], torch.float32, "grad")
    assert built[7] == built[13] == 0, built  # a bucket's third length builds nothing


def _filled(source, values):
    """``source`` with its size arguments ``ks<j>`` dropped from its signature and each use
    replaced by ``values[j]``."""
    import re

    source = re.sub(r"def (\w+)\((ks\d+, )+", r"def \1(", source)
    return re.sub(r"\bks(\d+)\b", lambda m: str(values[int(m.group(1))]), source)


def test_size_arguments_in_place_give_the_text_generated_at_that_shape():
    import re

    from autofuse.kernels import generate
    from autofuse.kernels.common.sizes import runtime_sizes

    backend = dynamo.make_backend()
    fast = torch.compile(transposed, backend=backend, dynamic=True)
    for t in (5, 6, 7):
        fast(torch.randn(2, t, 4), torch.randn(4))
    checked = 0
    for record in backend.records[1:]:
        for k in record.plan.kernels:
            n = len(re.findall(r"\bks\d+\b", k.source.split("):")[0]))
            filled = _filled(k.source, [v for _, v in k.layout[:n]])
            with runtime_sizes(("not a traced graph",)):  # the text as generated, no arguments
                plain = generate(record.plan.graph, k.info, k.config, int(k.name.split("_")[-1]))
            code = [line for line in filled.splitlines() if not line.startswith("#")]
            assert code == [line for line in plain.source.splitlines() if not line.startswith("#")]
            checked += n > 0
    assert checked >= 2


@pytest.mark.parametrize(
    "dynamic, error, words",
    [
        ({"y": [0]}, TypeError, "'y', which is not an argument"),
        ({"x": [3]}, ValueError, "dim 3 is out of range for 'x' with 3 dims"),
        ({"x": 0.5}, TypeError, "dims"),
        ("x", TypeError, "dict"),
    ],
)
def test_optimize_dynamic_errors_name_the_argument(dynamic, error, words):
    import autofuse

    args = (torch.randn(3, 5, 32), torch.randn(32), torch.randn(32))
    with pytest.raises(error, match=words):
        autofuse.optimize(softmax_norm, args, dynamic=dynamic)


def _tiny(which):
    transformers = pytest.importorskip("transformers")
    common = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, vocab_size=64, max_position_embeddings=256)  # fmt: skip
    torch.manual_seed(0)
    if which == "llama":
        return transformers.LlamaModel(transformers.LlamaConfig(**common, num_key_value_heads=2))
    cfg = transformers.BertConfig(**common, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)  # fmt: skip
    return transformers.BertModel(cfg, add_pooling_layer=False)


def _model_sweep(which, shapes):
    model = _tiny(which).eval()
    backend = dynamo.make_backend()
    fast = torch.compile(model, backend=backend, dynamic=True)
    buckets = set()
    with torch.no_grad():
        for batch, length in shapes:
            ids = torch.randint(
                0, 64, (batch, length), generator=torch.Generator().manual_seed(length)
            )
            got, want = fast(ids).last_hidden_state, model(ids).last_hidden_state
            assert_close(got, want, torch.float32, f"{which} {batch}x{length}")
            buckets.add((size_bucket(batch), size_bucket(length)))
    graphs_per_shape = max(1, len({r.graph.key for r in backend.records}) // max(1, len(shapes)))
    assert backend.counts["plans"] <= len(buckets) * graphs_per_shape, (backend.counts, buckets)
    return backend


@pytest.mark.slow
def test_bert_tiny_dynamic_lengths_share_bucket_plans():
    backend = _model_sweep("bert", [(2, 5), (2, 7), (2, 9)])
    assert backend.counts["bucket_instances"] >= 1, backend.counts  # 5 and 7: one bucket


@pytest.mark.slow
def test_llama_lengths_share_one_trace_one_partition_and_the_kernels():
    counters.clear()
    model = _tiny("llama").eval()
    backend = dynamo.make_backend()
    fast = torch.compile(model, backend=backend, dynamic=True)
    rebuilt = []
    with torch.no_grad():
        for length in (5, 6, 7, 9):
            ids = torch.randint(0, 64, (2, length), generator=torch.Generator().manual_seed(length))
            before = kernels_built()
            got, want = fast(ids).last_hidden_state, model(ids).last_hidden_state
            assert_close(got, want, torch.float32, f"llama length {length}")
            rebuilt.append(kernels_built() - before)
    # Dynamo restarts once to specialize the model's float attributes, then traces once
    assert backend.counts["plans"] == 1 and counters["aot_autograd"]["total"] <= 2, counters
    # the length is an argument of every loop kernel; where it is in the index arithmetic (the
    # rotary embedding's, the transposes to attention's layout), from the second length on
    assert rebuilt[2:] == [0, 0], rebuilt
    ks = [k for k in backend.records[-1].plan.kernels if "ks0" in k.source]
    assert ks and all(k.source.startswith("import") for k in ks)


@pytest.mark.exhaustive
@pytest.mark.parametrize("which", ["llama", "bert"])
def test_models_50_lengths_4_batches(which):
    lengths = sorted({1, 2, 3, 5, 7, 11, 13, 17, 31, 33, 65, 129} | set(range(4, 140, 4)))[:50]
    _model_sweep(which, [(b, t) for b in (1, 2, 5, 17) for t in lengths])


def over_the_length(x, w):
    """A row softmax over the dynamic length and a column sum over it (a bias gradient's form)."""
    return torch.softmax(x.transpose(0, 1) * w[:, None], -1).sum(-1) + (x * w[None, :]).sum(0)


@pytest.mark.parametrize("front", ["compile", "optimize"])
def test_a_reduction_over_the_dynamic_length_shares_its_kernel_in_a_bucket(front):
    """The reduced extent is the kernel's ``rnumel`` argument under runtime sizes: the lengths
    of one bucket (33..64) share every kernel from the second on, forward and backward."""
    import autofuse

    w, lengths = torch.randn(6), (33, 40, 47, 61)
    if front == "compile":
        fast = torch.compile(over_the_length, backend=dynamo.make_backend(), dynamic=True)
    else:
        fast = autofuse.optimize(over_the_length, (torch.randn(33, 6), w), dynamic={"x": [0]})
    built = {}
    for t in lengths:
        torch.manual_seed(t)
        x = torch.randn(t, 6, requires_grad=True)
        before = kernels_built()
        got = fast(x, w)
        (grad,) = torch.autograd.grad(got.square().sum(), x)
        built[t] = kernels_built() - before
        want = over_the_length(x, w)
        assert_close(got, want, torch.float32, f"length {t}")
        assert_close(grad, torch.autograd.grad(want.square().sum(), x)[0], torch.float32, "grad")
    assert built[47] == built[61] == 0, built  # a bucket's third length builds nothing


def test_a_mean_over_the_dynamic_length_divides_by_the_argument():
    """A mean over the dynamic dim divides by ``rnumel``, not a literal: a bucket's lengths
    share its kernel from the second on."""
    fast = torch.compile(lambda x: x.mean(0) * 2.0, backend=dynamo.make_backend(), dynamic=True)
    built = []
    for t in (33, 40, 47, 61):
        x = torch.randn(t, 6)
        before = kernels_built()
        assert_close(fast(x), x.mean(0) * 2.0, torch.float32, f"length {t}")
        built.append(kernels_built() - before)
    assert built[1:] == [0, 0, 0], built
