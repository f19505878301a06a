"""PyTorch's OpInfo samples through the autofuse backend, compared with eager
(``experiments/correctness/opinfo_sweep.py``; expected failures in ``experiments/correctness/opinfo_expected.py``).

The default run takes a fixed slice: common ops, their first sample, forward and backward in
float32 and forward in one other dtype class (rotating over bfloat16, integer and bool). The
whole sweep runs sharded behind ``-m exhaustive``.
"""

from __future__ import annotations

import argparse

import pytest
import torch

from experiments.correctness import opinfo_sweep as sweep
from experiments.correctness.opinfo_check import (
    FAILING,
    compare,
    graph_mark,
    how_it_ran,
    tensor_mismatch,
)
from experiments.correctness.opinfo_expected import EXPECTED, expected_failure

CI_OPS = (
    "abs add addmm amax bmm cat clamp div.no_rounding_mode eq erf exp expand flip gather "
    "index_select lerp log log_softmax logical_not lt masked_fill matmul maximum mean minimum "
    "mm mul neg nn.functional.gelu nn.functional.layer_norm nn.functional.relu "
    "nn.functional.silu permute pow reshape rsqrt sigmoid sin softmax sqrt squeeze stack std "
    "sub sum tanh transpose unsqueeze var view where"
).split()
OTHER_DTYPES = ("lowp", "int", "bool")
EXHAUSTIVE_SHARDS = 16


def _args(dtypes: list[str], samples: int = 1, timeout: float = 120.0) -> argparse.Namespace:
    return sweep.parse_args(
        ["--dtypes", ",".join(dtypes), "--samples", str(samples), "--timeout", str(timeout)]
    )


def _failures(records: list[dict]) -> list[str]:
    return [
        f"{r['op']} {r['dtype']} {r['mode']} #{r['sample']}: {r['status']}: {r['detail']}"
        for r in records
        if r["status"] in FAILING
    ]


@pytest.fixture(scope="module")
def ci_ops() -> dict:
    return {sweep.full_name(o): o for o in sweep.select_ops(CI_OPS)}


@pytest.mark.parametrize("k,name", list(enumerate(CI_OPS)), ids=CI_OPS)
def test_opinfo_slice(ci_ops, k, name, fresh_dynamo):
    """The op's first sample: forward and backward in float32, forward in one more dtype;
    nothing silently wrong, nothing failing that is not listed as expected."""
    op = ci_ops[name]
    records = list(sweep.run_op(op, _args(["float32", OTHER_DTYPES[k % 3]]), set()))
    assert records, f"{name}: no case ran"
    assert not _failures(records), "\n".join(_failures(records))
    assert any(r["status"] == "pass" for r in records), records


@pytest.mark.exhaustive
@pytest.mark.parametrize("shard", range(EXHAUSTIVE_SHARDS))
def test_opinfo_sweep_shard(shard, fresh_dynamo):
    """The whole op database, first two samples per op and dtype, in 16 shards."""
    failures: list[str] = []
    args = _args(list(sweep.DEFAULT_DTYPES), samples=2)
    for op in sweep.select_ops(None, (shard, EXHAUSTIVE_SHARDS)):
        failures += _failures(list(sweep.run_op(op, args, set())))
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------------------------------
# The harness itself
# ---------------------------------------------------------------------------------------------


def test_compare_flags_a_wrong_value_and_passes_a_rounding_difference():
    x = torch.linspace(0, 1, 16)
    assert compare((x,), (x + 1e-7,), None) == ""
    wrong = x.clone()
    wrong[3] += 0.01
    assert "output 0" in compare((wrong,), (x,), None)


def test_compare_is_exact_for_integers_and_bools():
    a = torch.arange(8, dtype=torch.int32)
    b = a.clone()
    b[-1] += 1
    assert compare(a, b, None)
    assert compare(torch.tensor([True]), torch.tensor([False]), None)
    assert compare(a, a.to(torch.int64), None).startswith("output 0: dtype")


def test_compare_wants_nans_where_eager_has_them():
    e = torch.tensor([1.0, float("nan"), 3.0])
    assert compare(e.clone(), e, None) == ""
    assert compare(torch.tensor([1.0, 2.0, 3.0]), e, lambda: e.double())


def test_compare_accepts_a_low_precision_result_nearer_the_float64_reference():
    ref = torch.linspace(1, 2, 64, dtype=torch.float64)
    eager = ref.to(torch.bfloat16)
    closer = eager.clone()
    closer[5] = ref[5].to(torch.bfloat16)  # same value: no difference at all
    assert compare(closer, eager, lambda: ref) == ""
    far = eager.clone()
    far[5] += 0.5
    assert "output 0" in compare(far, eager, lambda: ref)
    assert tensor_mismatch(eager, eager) == ""


def test_how_it_ran_reads_the_plans_eager_steps(fresh_dynamo):
    first = graph_mark()
    torch.compile(lambda x: torch.sin(x) + 1, backend="autofuse")(torch.randn(8))
    assert how_it_ran(first)[0] == "generated"
    first = graph_mark()
    torch.compile(lambda x: torch.sort(x).values * 2, backend="autofuse")(torch.randn(8))
    how, _, eager = how_it_ran(first)
    assert how == "eager_step" and any("sort" in e for e in eager)


def test_expected_failures_are_reasoned_and_looked_up_most_specific_first(monkeypatch):
    assert all(isinstance(r, str) and r.strip() for r in EXPECTED.values())
    monkeypatch.setitem(EXPECTED, "opx", "any dtype")
    monkeypatch.setitem(EXPECTED, "opx:bool:fwd", "bool forward")
    assert expected_failure("opx", "bool", "fwd") == "bool forward"
    assert expected_failure("opx", "float32", "bwd") == "any dtype"
    assert expected_failure("opy", "bool", "fwd") == ""


def test_sweep_cli_rejects_unknown_names():
    with pytest.raises(SystemExit, match="unknown op"):
        sweep.select_ops(["no_such_op"])
    with pytest.raises(SystemExit):
        sweep.parse_args(["--shard", "3/2"])
    with pytest.raises(SystemExit):
        sweep.parse_args(["--modes", "sideways"])


def test_op_class_orders_outcomes():
    def rec(status, how=""):
        return {"status": status, "how": how}

    assert sweep.op_class([rec("pass", "generated")]) == "generated"
    assert sweep.op_class([rec("pass", "generated"), rec("pass", "no_graph")]) == "eager_step"
    assert sweep.op_class([rec("xfail"), rec("pass", "generated")]) == "xfail"
    assert sweep.op_class([rec("error"), rec("wrong")]) == "wrong"


def test_sweep_takes_every_sample_and_backward_in_every_dtype_when_asked(ci_ops):
    op = ci_ops["unsqueeze"]
    args = sweep.parse_args(["--samples", "all", "--grad-dtypes", "all"])
    assert args.samples is None
    every = list(op.sample_inputs("cpu", torch.float32))
    assert len(sweep.samples(op, torch.float32, "fwd", None)) == len(every) > 2
    pairs = set(sweep.cases(op, ["float32", "lowp"], ["fwd", "bwd"], ["all"]))
    assert (torch.bfloat16, "bwd") in pairs and (torch.float32, "bwd") in pairs
    assert (torch.bfloat16, "bwd") not in set(
        sweep.cases(op, ["float32", "lowp"], ["fwd", "bwd"], ["float32"])
    )
    for bad in ("0", "some"):
        with pytest.raises(SystemExit):
            sweep.parse_args(["--samples", bad])


def test_an_out_of_bounds_access_is_a_status_of_its_own(monkeypatch):
    """A case whose compiled run raises OutOfBoundsAccess (wrapped, as Triton's interpreter
    does) is ``oob``, named in the summary's failing cases; an expected one is an xfail."""
    from autofuse.bounds import OutOfBoundsAccess
    from experiments.correctness import opinfo_check

    def compiled(*a, **k):
        try:
            raise OutOfBoundsAccess("autofuse: kernel k stores to memory outside ...")
        except OutOfBoundsAccess as e:
            raise RuntimeError("interpreter error") from e

    monkeypatch.setattr(opinfo_check.torch, "compile", lambda fn, **kw: compiled)
    out = opinfo_check.check_case(torch.neg, (torch.ones(2),), {}, False, False, 60.0)
    assert out.status == "oob" and "kernel k stores" in out.detail
    rec = sweep.case_record("opx", "float32", "fwd", 0, out)
    summary = sweep.summarize([rec])
    assert summary["cases"]["oob"] == 1 and summary["op_classes"]["opx"] == "oob"
    assert summary["failing"][0]["status"] == "oob"
    monkeypatch.setitem(EXPECTED, "opx", "a known overrun")
    assert sweep.case_record("opx", "float32", "fwd", 0, out)["status"] == "xfail"
    assert "every sample" in sweep.markdown(summary, {"samples": None, "check_bounds": True})


def test_float64_reference_gradients_use_the_cotangents_eager_had():
    """A bfloat16 backward is judged against a float64 run with eager's (bfloat16-rounded)
    cotangents, not unrounded ones (which made cross's gradient look 7 ulps off)."""
    from experiments.correctness.opinfo_check import run_case

    x = torch.linspace(-1, 1, 64, dtype=torch.bfloat16).requires_grad_()
    _, (g16,) = run_case(lambda t: t * 1, (x,), {}, True)
    x64 = x.detach().double().requires_grad_()
    _, (g64,) = run_case(lambda t: t * 1, (x64,), {}, True, like=[torch.bfloat16])
    assert torch.equal(g16.double(), g64)
    _, (unrounded,) = run_case(lambda t: t * 1, (x64,), {}, True)
    assert not torch.equal(g16.double(), unrounded)


def test_how_it_ran_sees_a_new_graph_once_the_record_of_graphs_is_full(monkeypatch):
    """compiled_graphs() keeps the last 512: a count of them stops moving, so a long sweep
    took every later case for one without a graph ("no_graph")."""
    import collections
    import types

    from experiments.correctness import opinfo_check

    def graph(kernels):
        plan = types.SimpleNamespace(kernels=[object()] * kernels, graph={}, fallbacks=[])
        return types.SimpleNamespace(plan=plan)

    kept = collections.deque((graph(1) for _ in range(3)), maxlen=3)
    monkeypatch.setattr(opinfo_check, "compiled_graphs", lambda: list(kept))
    mark = graph_mark()
    assert how_it_ran(mark) == ("no_graph", 0, ())
    kept.append(graph(2))
    assert how_it_ran(mark) == ("generated", 2, ())
