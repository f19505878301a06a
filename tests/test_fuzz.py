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
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from experiments.fuzz import driver, jobs, record, worker
from experiments.fuzz.compare import MODES, Verdict, check_program, compare, lowest_precision
from experiments.fuzz.generate import FORM_NAMES, generate
from experiments.fuzz.program import InputSpec, OpNode, Program, compile_program, value_flags
from experiments.fuzz.record import classes
from experiments.fuzz.repro import Target, write_repro
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


# the op forms of issue 50's programs and of a second generator's table: a fragment of a
# template each, every one drawn in 200 graphs
ISSUE_FORMS = (
    " >= ", "^ True)", ".type_as(", ".to({0}.dtype)", "F.pad((", ".permute(", "F.layer_norm(",
    "index_select(torch.cat(", "index_select(F.pad(", "torch.hypot(", ".long().cumsum(",
    ".fill_(", "torch.logaddexp(", ".masked_fill(", "torch.std(", "torch.addcmul(",
    "lambda v: ", ".kthvalue(", ".min(", ".max(", "torch.flip(", ".roll(", "torch.softmax(",
    "torch.topk(", "torch.sort(", "torch.msort(", "torch.aminmax(", "torch.copysign({0}, -",
    "torch.copysign({0}, {1})", "torch.floor_divide(", "rounding_mode='floor'",
    "rounding_mode='trunc'", "tril(", "triu(", "torch.split(", "torch.tensor_split(",
    "__setitem__", "index_put(", "{0}[{1}", ".unflatten(", ".repeat(", ").long()", "torch.var(",
    ".mT", ".transpose(-1, -2)", "torch.mm(", "torch.bmm(", "torch.addmm(",
)  # fmt: skip


def test_the_issue_forms_are_drawn():
    """Every form of the table above appears in the programs of 200 seeds (several times for
    most: each form's weight is set for that)."""
    text = collections.Counter()
    for seed in range(200):
        p, _ = generate(seed)
        for op in p.ops:
            for frag in ISSUE_FORMS:
                text[frag] += frag in op.template
    missing = [f for f in ISSUE_FORMS if not text[f]]
    assert not missing, missing
    assert sum(text[f] >= 3 for f in ISSUE_FORMS) >= 0.8 * len(ISSUE_FORMS), text


def test_inplace_forms_write_to_intermediates_only():
    """An in-place form never writes to an input or a view of one (the program's caller would
    see it), and its alias form returns the original."""
    seen = 0
    for seed in range(300):
        p, _ = generate(seed)
        names = {s.name for s in p.inputs}
        for op in p.ops:
            if op.form in ("inplace", "alias_inplace"):
                seen += 1
                assert op.args[0] not in names
                if op.form == "alias_inplace":
                    assert op.template.endswith(", {0})[1]")
    assert seen >= 10


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


# graphs of seed 0 that pass today: rounding division, split / tensor_split / unbind, tril,
# unflatten, var / std over few elements, advanced indexing, masked_fill, int scalars compared,
# addcmul, hypot / copysign / logaddexp, index_select of a cat / a padded tensor, casts after
# comparisons, a reduction between flips / rolls, in-place ops through a same-dtype alias, a pad
# of a matmul of a permuted view, layer_norm of constant rows, sort / topk, repeat, setitem; and
# attention, matmuls, norms, gather / scatter, index_select, cumsum, reductions, views, slices
SLICE = (33, 39, 40, 42, 43, 52, 59, 66, 69, 91, 114)


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
            "return autofuse.optimize(program, make_inputs(DEVICE))",
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
        (["--device", "gpu"], "--device 'gpu': cpu, cuda or cuda:i"),
        (["--jobs", "2", "--shard", "0/2"], "give --jobs or --shard, not both"),
    ],
)
def test_driver_names_a_bad_argument(argv, message, capsys):
    base = {"--graphs": "2", "--out": "unused"}
    for i in range(0, len(argv), 2):
        base[argv[i]] = argv[i + 1]
    with pytest.raises(SystemExit):
        driver.parse_args([x for kv in base.items() for x in kv])
    assert message in capsys.readouterr().err


def _passing_check(seen: list):
    def check(self, p, backward, front_end, timeout):
        seen.append((self.device, self.tf32, dict(self.env)))
        v = Verdict(front_end, MODES[backward], "pass")
        return {"eager_rejected": None, "verdict": asdict(v)}

    return check


@pytest.mark.parametrize(
    "flags, device, tf32, env",
    [
        ([], "cpu", False, {"TRITON_INTERPRET": "1", "AUTOFUSE_CHECK_BOUNDS": "1"}),
        (["--device", "cuda"], "cuda", False, {"TRITON_INTERPRET": "0", "AUTOFUSE_CHECK_BOUNDS": "0"}),
        (["--device", "cuda:1", "--tf32", "--check-bounds"], "cuda:1", True,
         {"TRITON_INTERPRET": "0", "AUTOFUSE_CHECK_BOUNDS": "1"}),
    ],
)  # fmt: skip
def test_device_flags_reach_the_checking_process(flags, device, tf32, env, tmp_path, monkeypatch):
    """--device / --tf32 / --check-bounds (the GPU mocked): the checking process is asked for
    the device and TF32 setting, runs real kernels (no interpreter) off the CPU, the bounds
    mode on by default on the CPU only; the record names the device, TF32 and the bounds mode,
    and the commit from AUTOFUSE_COMMIT."""
    seen: list = []
    monkeypatch.setattr(driver.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(worker.Worker, "check", _passing_check(seen))
    monkeypatch.setattr(record, "device_name", lambda d: f"mock {d}")
    monkeypatch.setenv("AUTOFUSE_COMMIT", "abc123")
    out = tmp_path / "run"
    args = ["--graphs", "1", "--out", str(out), "--front-ends", "compile", *flags]
    assert driver.main(args) == 0
    assert seen == [(device, tf32, env)]
    s = json.loads((out / "summary.json").read_text())
    assert s["device"] == device and s["device_name"] == f"mock {device}"
    assert s["tf32"] == ("on" if tf32 else "off") and s["commit"] == "abc123"
    assert s["check_bounds"] is (env["AUTOFUSE_CHECK_BOUNDS"] == "1")
    assert {"cudnn", "triton", "torch"} <= set(s)


def test_device_cuda_without_a_gpu_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setattr(driver.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="--device cuda: no CUDA device"):
        driver.main(["--graphs", "1", "--out", str(tmp_path / "x"), "--device", "cuda"])


def test_check_program_moves_the_inputs_to_the_device():
    """The inputs are drawn on the CPU and moved to the device, strides kept (a sliced input
    stays a strided view there)."""
    p = Program((InputSpec("x0", (2, 3), "float32", layout="sliced", seed=5),),
                (OpNode("v0", "unary", "torch.tanh({0})", ("x0",)),), ("v0",))  # fmt: skip
    seen = []

    def spy(fn, xs):
        seen.extend((x.device.type, x.stride()) for x in xs)
        return fn

    (v,) = check_program(p, False, ["spy"], compilers={"spy": spy}, device="cpu")
    assert v.status == "pass" and seen == [("cpu", (6, 2))]
    _, make_inputs = compile_program(p)
    assert torch.equal(make_inputs("cpu")[0], make_inputs()[0])


def test_a_gpu_repro_names_its_device_tf32_and_bounds_mode(tmp_path):
    p = Program((InputSpec("x0", (2,), "float32"),),
                (OpNode("v0", "unary", "torch.exp({0})", ("x0",)),), ("v0",))  # fmt: skip
    v = Verdict("optimize", "forward", "mismatch", "forward", detail="planted")
    text = write_repro(tmp_path / "r.py", p, v, "a test", Target("cuda", False, False)).read_text()
    assert "DEVICE = 'cuda'" in text and "make_inputs(DEVICE)" in text
    assert "allow_tf32 = False" in text and '"AUTOFUSE_CHECK_BOUNDS", "0"' in text


def test_jobs_split_the_command_line_and_the_gpus(monkeypatch):
    argv = ["--graphs", "4", "--jobs", "2", "--out", "x", "--jobs=2"]
    assert jobs.child_argv(argv, 1, 2) == ["--graphs", "4", "--out", "x", "--shard", "1/2"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert jobs.gpu_env("cuda", 3) == {"CUDA_VISIBLE_DEVICES": "5"}
    assert jobs.gpu_env("cuda:0", 3) == {} and jobs.gpu_env("cpu", 1) == {}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert jobs.gpu_env("cuda", 3) == {}  # one GPU: every shard shares it


def _graph_record(i: int, fail: bool) -> dict:
    v = {"front_end": "compile", "mode": "forward", "status": "crash" if fail else "pass",
         "phase": "", "error": "E" if fail else "", "detail": "E: x" if fail else ""}  # fmt: skip
    f = {**v, "graph": i, "seed": i, "repro": f"repros/g{i}.py", "min_size": 1}
    return {"graph": i, "seed": i, "forms": ["unary"], "ops": ["exp"], "rejected_draws": 0,
            "eager_rejected": None, "verdicts": [v], "failures": [f] if fail else [],
            "seconds": 1.0}  # fmt: skip


def test_jobs_merge_the_shards_records(tmp_path):
    """The shards' records are summarized as one run; a reproduction is named by its shard's
    folder."""
    for k in range(2):
        (tmp_path / f"shard{k}of2").mkdir()
        for i in range(k, 5, 2):
            record.append_jsonl(
                tmp_path / f"shard{k}of2" / "graphs.jsonl", _graph_record(i, i == 3)
            )
    s = jobs.merge(tmp_path, 2, {"device": "cpu"})
    assert s["graphs_tried"] == 5 and s["checks"]["forward"] == {
        "pass": 4, "mismatch": 0, "crash": 1, "timeout": 0}  # fmt: skip
    assert s["failures"][0]["repro"] == "shard1of2/repros/g3.py"
    assert json.loads((tmp_path / "summary.json").read_text())["graphs_tried"] == 5


def test_jobs_stopped_by_a_time_limit_still_merge(tmp_path, monkeypatch):
    """SIGTERM (``timeout``) ends the shards; what they recorded is merged before the exit."""
    import argparse

    (tmp_path / "shard0of1").mkdir()
    record.append_jsonl(tmp_path / "shard0of1" / "graphs.jsonl", _graph_record(0, False))

    class Stopped:
        def __init__(self, *a, **k):
            self.ended = False

        def wait(self):
            if not self.ended:
                self.ended = True
                raise SystemExit(143)  # what jobs.stop raises on SIGTERM
            return -15

        def poll(self):
            return None if not self.ended else -15

        def terminate(self):
            pass

    # the merged summary names the commit and the processor, each from a process the first
    # time (git, uname) unless an earlier test asked: asked here, before Popen is a Stopped
    monkeypatch.setenv("AUTOFUSE_COMMIT", "test")
    record.versions("cpu")
    monkeypatch.setattr(jobs.subprocess, "Popen", Stopped)
    args = argparse.Namespace(jobs=1, out=tmp_path, device="cpu")
    with pytest.raises(SystemExit):
        jobs.run_jobs(args, ["--graphs", "1", "--jobs", "1"])
    assert json.loads((tmp_path / "summary.json").read_text())["graphs_tried"] == 1


def test_a_backward_eager_rejects_keeps_the_forward_checks(tmp_path, monkeypatch):
    """An in-place op eager's autograd rejects fails the backward check only: the graph's
    forward verdicts are kept and the rejection recorded."""

    def check(self, p, backward, front_end, timeout):
        if backward:
            return {"eager_rejected": "RuntimeError: modified by an inplace operation",
                    "verdict": None}  # fmt: skip
        return {"eager_rejected": None, "verdict": asdict(Verdict(front_end, "forward", "pass"))}

    monkeypatch.setattr(worker.Worker, "check", check)
    out = tmp_path / "run"
    driver.main(["--graphs", "1", "--out", str(out), "--front-ends", "compile", "--backward"])
    (rec,) = record.read_jsonl(out / "graphs.jsonl")
    assert rec["backward_eager_rejected"] and not rec["eager_rejected"]
    assert [v["mode"] for v in rec["verdicts"]] == ["forward"]
    s = json.loads((out / "summary.json").read_text())
    assert s["graphs_checked"] == 1 and s["backward_eager_rejected_graphs"] == 1


class _FakeChild:
    """A stand-in for the checking process: answers every request with ``answer``."""

    def __init__(self, answer: dict) -> None:
        self.answer = answer
        self.stdin = self
        self.killed = False

    def write(self, _data: bytes) -> None:
        pass

    def flush(self) -> None:
        pass

    def poll(self):
        return -9 if self.killed else None

    def kill(self) -> None:
        self.killed = True

    def wait(self) -> int:
        return -9


@pytest.mark.parametrize(
    "answer, restarted",
    [
        ({"eager_rejected": "AcceleratorError: CUDA error: device-side assert triggered",
          "verdict": None}, True),
        ({"eager_rejected": None, "verdict": {"detail": "RuntimeError: CUDA error: an illegal "
                                              "memory access was encountered"}}, True),
        ({"eager_rejected": "IndexError: index 3 is out of bounds", "verdict": None}, False),
    ],
)  # fmt: skip
def test_the_checking_process_is_restarted_after_a_cuda_fault(answer, restarted, monkeypatch):
    """A device-side assert (eager's index out of range on a GPU, a shrunk candidate's say)
    leaves the child's CUDA context unusable: the next check gets a fresh child."""
    w = worker.Worker(device="cuda")
    child = _FakeChild(answer)
    w.proc = child
    monkeypatch.setattr(w, "_read_line", lambda _deadline: worker.PREFIX + json.dumps(answer))
    p = Program((InputSpec("x0", (1,), "float32"),),
                (OpNode("v0", "unary", "torch.exp({0})", ("x0",)),), ("v0",))  # fmt: skip
    assert w.check(p, False, "compile", 10.0) == answer
    assert (w.proc is None) is restarted and child.killed is restarted


@pytest.mark.gpu
def test_gpu_mode_checks_with_real_kernels(tmp_path):
    """A few graphs on the GPU, both front ends, forward and backward, two shards at once:
    every check has a verdict and the record names the GPU."""
    out = tmp_path / "gpu"
    argv = ["--graphs", "4", "--seed", "0", "--out", str(out), "--device", "cuda",
            "--backward", "--jobs", "2", "--shrinks-per-class", "0"]  # fmt: skip
    driver.main(argv)
    s = json.loads((out / "summary.json").read_text())
    assert s["graphs_tried"] == 4 and s["device"] == "cuda" and s["tf32"] == "off"
    assert "interpreter" not in s["device_name"] and s["cudnn"]
    assert s["check_bounds"] is False


@pytest.mark.exhaustive
def test_fuzz_long_run(tmp_path):
    """2,000 graphs, forward and backward, both front ends: no mismatch, crash or time-out."""
    out = tmp_path / "long"
    driver.main(["--graphs", "2000", "--seed", "7", "--out", str(out), "--backward"])
    s = json.loads((out / "summary.json").read_text())
    assert s["graphs_tried"] == 2000
    assert not s["failures"], json.dumps(s["classes"], indent=1)
