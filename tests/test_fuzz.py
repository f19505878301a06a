"""The differential fuzzer (experiments/fuzz): its generator's programs are valid for eager, a
seed-fixed slice of programs passes through both front ends, the shrinker reduces a planted
failure to the op that is wrong, a written reproduction runs, and the driver records, resumes
and refuses bad arguments by name. The long run is ``-m exhaustive``."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments.fuzz import driver
from experiments.fuzz.compare import Verdict, check_program, compare, lowest_precision
from experiments.fuzz.generate import FORM_NAMES, generate
from experiments.fuzz.program import InputSpec, OpNode, Program, compile_program, value_flags
from experiments.fuzz.record import classes
from experiments.fuzz.repro import write_repro
from experiments.fuzz.shrink import shrink

ROOT = Path(__file__).resolve().parents[1]


def test_generated_programs_are_valid_for_eager():
    """200 draws: every program runs in eager (the generator runs each op as it adds it; a
    draw eager rejects is counted, not kept), every op form is drawn, and size-1 dims are
    the commonest non-trivial size."""
    forms: collections.Counter = collections.Counter()
    sizes: collections.Counter = collections.Counter()
    rejected = 0
    for seed in range(200):
        p, r = generate(seed)
        rejected += r
        fn, make_inputs = compile_program(p)
        outs = fn(*make_inputs())
        assert len(outs) == len(p.outputs) >= 1
        assert all(isinstance(o, torch.Tensor) for o in outs)
        forms.update(op.form for op in p.ops)
        sizes.update(d for s in p.inputs for d in s.shape)
    assert set(forms) == set(FORM_NAMES), set(FORM_NAMES) - set(forms)
    assert sizes[1] == max(sizes.values())
    assert sizes[0] > 0 and rejected < 200


def test_generation_is_deterministic():
    a, _ = generate(12345)
    b, _ = generate(12345)
    assert a == b
    fa, ma = compile_program(a)
    fb, mb = compile_program(b)
    for x, y in zip(fa(*ma()), fb(*mb())):
        assert torch.equal(x, y) or (x.isnan() == y.isnan()).all()


def test_sibling_views_are_drawn_on_request():
    """--siblings: the last op reads a value another op reads, with a size-1 dim inserted, and
    is an output; without it the draws are those of earlier runs."""
    p, _ = generate(3, siblings=1.0)
    last = p.ops[-1]
    assert last.form == "sibling" and ".unsqueeze(" in last.template and last.out in p.outputs
    assert any(last.args[0] in op.args for op in p.ops[:-1])
    assert generate(3)[0] == generate(3, siblings=0.0)[0] != p


# graphs of seed 0 that pass today: attention, matmul, norms, gather / scatter, index_add,
# cumsum, reductions, views, slices, expand, where
SLICE = (5, 12, 13, 25, 28)


@pytest.mark.parametrize("seed", SLICE)
def test_fuzz_slice_passes(seed, fresh_dynamo):
    p, _ = generate(driver.graph_seed(0, seed))
    for backward in (False, True):
        for v in check_program(p, backward, ["optimize", "compile"], timeout_s=60):
            assert v.status == "pass", (seed, v)


def test_compare_judges_floats_per_tensor_against_float64():
    """Eager's rounding noise and autofuse's in other elements pass; an error several times
    eager's largest fails, as does a NaN where eager has none."""
    r = torch.tensor([0.5, 0.25, 0.125], dtype=torch.float64)
    e = (r + torch.tensor([3e-5, 0.0, 0.0], dtype=torch.float64)).float()
    a = (r + torch.tensor([0.0, 0.0, -3e-5], dtype=torch.float64)).float()
    assert compare((a,), (e,), lambda: (r,)) == ""
    assert "value 0" in compare(((r + 3e-4).float(),), (e,), lambda: (r,))
    assert "value 0" in compare((torch.tensor([float("nan"), 0.25, 0.125]),), (e,), lambda: (r,))


def test_compare_excuses_a_tipped_comparison_only_where_eager_is_off():
    e = torch.tensor([True, False, True])
    r = torch.tensor([True, True, True])  # eager's element 1 is tipped by rounding
    assert compare((torch.tensor([True, True, True]),), (e,), lambda: (r,)) == ""
    assert "value 0" in compare((torch.tensor([False, False, True]),), (e,), lambda: (r,))


def test_a_16bit_value_sets_the_float_tolerance():
    p = Program((InputSpec("x0", (2,), "float32"),),
                (OpNode("v0", "unary", "{0}.to(torch.float16)", ("x0",)),), ("v0",))  # fmt: skip
    assert lowest_precision(p) is torch.float16
    e = torch.tensor([3.5, 1.0])
    a = e + torch.tensor([5e-4, 0.0])  # below float16's resolution at 3.5
    assert compare((a,), (e,), lambda: (e.double(),), torch.float16) == ""
    assert "value 0" in compare((a,), (e,), lambda: (e.double(),), None)


def test_failures_are_classed_by_message_and_flagged_by_sizes():
    """Two front ends' crashes with one message (numbers and Dynamo's wrapping aside) are one
    class; the minimal program's empty value flags it size-0."""
    empty = Program((InputSpec("x0", (0, 3), "float32"),),
                    (OpNode("v0", "unary", "torch.exp({0})", ("x0",)),), ("v0",))  # fmt: skip
    ones = Program((InputSpec("x0", (2, 1), "float32"),),
                   (OpNode("v0", "unary", "torch.exp({0})", ("x0",)),), ("v0",))  # fmt: skip
    assert value_flags(empty) == ("size-0",) and value_flags(ones) == ("size-1",)
    base = {"graph": 4, "mode": "forward", "status": "crash", "phase": "", "error": "E"}
    fs = [
        {**base, "front_end": "optimize", "detail": "E: bad 3", "min_program": empty.to_json(),
         "repro": "repros/a.py", "min_size": 1},
        {**base, "front_end": "compile", "detail": "BackendCompilerFailed: backend='autofuse' "
         "raised: E: bad 12 Set TORCHDYNAMO_VERBOSE=1 for more"},
    ]  # fmt: skip
    (c,) = classes(fs)
    assert c["count"] == 2 and c["flags"] == ["size-0"] and c["repro"] == "repros/a.py"
    assert c["front_ends"] == ["compile", "optimize"]


class WrongTanh:
    """A stand-in for ``torch`` whose tanh is off by 0.5 (a planted miscompilation)."""

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def tanh(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) + 0.5


def _fake(p: Program):
    return {"fake": lambda fn, xs: compile_program(p, WrongTanh())[0]}


PLANTED = Program(
    (
        InputSpec("x0", (3, 5), "float32", layout="transposed", seed=1),
        InputSpec("x1", (5,), "float16", seed=2),
    ),
    (
        OpNode("v0", "binary", "({0} * 2.0 + {1})", ("x0", "x1")),
        OpNode("v1", "unsqueeze", "{0}.unsqueeze(0)", ("v0",)),
        OpNode("v2", "unary", "torch.tanh({0})", ("v1",)),
        OpNode("v3", "reduction", "torch.sum({0}, dim=(1,), keepdim=True)", ("v2",)),
        OpNode("v4", "norm", "torch.softmax({0}, dim=-1)", ("x0",)),
        OpNode("v5", "binary", "({0} + {1})", ("v3", "v4")),
    ),
    ("v5", "v4"),
)


def test_shrinker_reduces_a_planted_failure_to_its_op():
    def verdict(c: Program) -> Verdict:
        (v,) = check_program(c, False, ["fake"], compilers=_fake(c))
        return v

    first = verdict(PLANTED)
    assert first.status == "mismatch"
    s = shrink(PLANTED, lambda c: verdict(c).signature() == first.signature())
    assert s.complete and s.accepted > 0
    (op,) = s.program.ops
    assert "tanh" in op.template
    (x,) = s.program.inputs
    assert set(x.shape) == {1} and x.layout == "contiguous" and x.dtype == "float32"


RUN_BOTH = """
import runpy, sys
runpy.run_path(sys.argv[1], run_name="__main__")
try:
    runpy.run_path(sys.argv[2], run_name="__main__")
except AssertionError as e:
    print("FAILED:", e)
"""


def test_repro_file_runs(tmp_path):
    """A written reproduction is a standalone script: it passes where autofuse agrees with
    eager, and raises (naming the value) where the compiled function differs."""
    p = Program(
        (InputSpec("x0", (2, 1, 3), "float32", seed=3),),
        (OpNode("v0", "unary", "torch.tanh({0})", ("x0",)),
         OpNode("v1", "reduction", "torch.sum({0}, dim=(-1,), keepdim=False)", ("v0",))),
        ("v1", "v0"),
    )  # fmt: skip
    v = Verdict("optimize", "backward", "mismatch", "backward", detail="planted")
    good = write_repro(tmp_path / "good.py", p, v, "a test")
    bad = tmp_path / "bad.py"
    bad.write_text(
        good.read_text().replace(
            "return autofuse.optimize(program, make_inputs())",
            "return lambda *xs: tuple(o * 1.5 for o in program(*xs))",
        )
    )
    res = subprocess.run(
        [sys.executable, "-c", RUN_BOTH, str(good), str(bad)], capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("autofuse agrees with eager"), res.stdout
    assert "FAILED: value 0 (output)" in res.stdout, res.stdout


def test_driver_records_and_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--graphs", "1", "--seed", "0", "--out", str(out), "--front-ends", "compile"]
    assert driver.main(args) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["graphs_tried"] == 1 and s["checks"]["forward"]["pass"] == 1
    assert s["torch"] == torch.__version__ and s["op_forms"]
    with pytest.raises(SystemExit, match="--resume"):
        driver.main(args)
    assert driver.main([*args[:1], "2", *args[2:], "--resume"]) == 0
    lines = (out / "graphs.jsonl").read_text().splitlines()
    assert [json.loads(x)["graph"] for x in lines] == [0, 1]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--front-ends", "optimise"], "--front-ends 'optimise': unknown optimise"),
        (["--shard", "3/2"], "--shard '3/2': need 0 <= i < n"),
        (["--graphs", "0"], "--graphs must be positive"),
    ],
)
def test_driver_names_a_bad_argument(argv, message, capsys):
    base = {"--graphs": "2", "--out": "unused"}
    for i in range(0, len(argv), 2):
        base[argv[i]] = argv[i + 1]
    with pytest.raises(SystemExit):
        driver.parse_args([x for kv in base.items() for x in kv])
    assert message in capsys.readouterr().err


@pytest.mark.exhaustive
def test_fuzz_long_run(tmp_path):
    """2,000 graphs, forward and backward, both front ends: no mismatch, crash or time-out."""
    out = tmp_path / "long"
    driver.main(["--graphs", "2000", "--seed", "7", "--out", str(out), "--backward"])
    s = json.loads((out / "summary.json").read_text())
    assert s["graphs_tried"] == 2000
    assert not s["failures"], json.dumps(s["classes"], indent=1)
