"""The KernelBench runner (experiments/kernelbench/): the shape reduction, the GPU path with
injected timers (interleaving, the record ``autofuse report`` reads, fast_1, the geomean over the
better torch.compile mode), and a CPU slice of the benchmark itself where it is present."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

import autofuse
from experiments.kernelbench.check import check_problem, eager_steps, is_library
from experiments.kernelbench.gpu import COMPILE, GpuOptions, time_problem
from experiments.kernelbench.problems import (
    BY_STAGE,
    Problem,
    discover,
    load_module,
    parse_numbers,
)
from experiments.kernelbench.run import default_dir, main
from experiments.kernelbench.summary import level_stats, records, render

TOY = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale

batch_size = 64
dim = 300
scale = 2.0
input_shape = (dim,)

def get_inputs():
    return [torch.randn(batch_size, *input_shape)]

def get_init_inputs():
    return [scale]
"""

PATCHES = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, image_size, patch_size):
        super().__init__()
        assert image_size % patch_size == 0, "image size must be a multiple of the patch"
        self.p = patch_size

    def forward(self, x):
        return x.unfold(2, self.p, self.p).sum(-1)

image_size = 224
patch_size = 16
kernel_size = 3

def get_inputs():
    return [torch.rand(2, 3, image_size, image_size)]

def get_init_inputs():
    return [image_size, patch_size]
"""


def toy_problem(tmp_path, text=TOY, name="1_Toy.py") -> Problem:
    folder = tmp_path / "KernelBench" / "level1"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(textwrap.dedent(text))
    (p,) = discover(tmp_path, 1, {int(name.split("_")[0])})
    return p


def test_reduction_caps_shapes_and_keeps_coupled_ones(tmp_path):
    p = toy_problem(tmp_path)
    module, changed = load_module(p, BY_STAGE["small"])
    assert (module.batch_size, module.dim, module.input_shape) == (2, 16, (16,))
    assert module.scale == 2.0 and changed["dim"] == ["300", "16"]
    module, changed = load_module(p, BY_STAGE["shipped"])
    assert (module.batch_size, module.dim, changed) == (64, 300, {})


def test_a_stage_that_breaks_the_problem_gives_way_to_the_next(tmp_path):
    from experiments.kernelbench.check import choose_stage

    p = toy_problem(tmp_path, PATCHES, "2_Patches.py")
    stage, module, *_, info = choose_stage(p)
    assert stage.name == "medium" and (module.image_size, module.patch_size) == (32, 16)
    assert module.kernel_size == 3 and "small" in info["skipped"]


def test_problem_numbers_parse():
    assert parse_numbers("1-3,7") == {1, 2, 3, 7} and parse_numbers("") is None
    with pytest.raises(ValueError, match="--problems"):
        parse_numbers("3-1")
    with pytest.raises(ValueError, match="--problems"):
        parse_numbers("x")


class FakeTimer:
    """Fixed seconds per variant; records the order of the calls."""

    def __init__(self, times):
        self.times, self.calls = times, []

    def __call__(self, label, fn, args):
        fn(*args)
        self.calls.append(label)
        return self.times[label] * (1 + 0.1 * (len(self.calls) % 2))


TIMES = {"eager": 10e-6, COMPILE[0]: 8e-6, COMPILE[1]: 6e-6, "autofuse greedy": 7e-6,
         "autofuse tuned": 5e-6}  # fmt: skip


def fake_compile(model, mode):
    return lambda *xs: model(*xs)


def greedy_only(model, inputs, **options):
    return autofuse.optimize(model, inputs)  # the search's options ignored: no tuning on CPU


def test_gpu_path_with_injected_timers(tmp_path):
    p = toy_problem(tmp_path)
    timer = FakeTimer(TIMES)
    opts = GpuOptions(rounds=2, stage="small", correct_trials=2)
    ceil = {"copy_bytes_per_s": 1e12, "bf16_mm_flops_per_s": 1e15}
    rec = time_problem(p, opts, ceil, device="cpu", timer=timer, compile_fn=fake_compile,
                       optimize_fn=greedy_only)  # fmt: skip
    order = ["eager", *COMPILE, "autofuse greedy", "autofuse tuned"]
    assert timer.calls == order + order[::-1]  # interleaved, every other round reversed
    assert rec["times_us"]["autofuse tuned"]["us"] == pytest.approx(5.0)  # min of rounds
    assert all(rec["correct"].values()) and rec["tuned_correct"] and rec["fast_1"]
    assert rec["best_compile"] == COMPILE[1]
    assert rec["speedup_vs_best_compile"] == pytest.approx(6 / 5)
    assert rec["floor_us"] == pytest.approx(2 * 4 * 2 * 16 / 1e12 * 1e6)
    assert rec["kernels"] and rec["eager_ops"] == {} and rec["workload"] == "L1_1_Toy"
    json.dumps(rec)  # a JSON record


LAYER = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.bn = nn.BatchNorm1d(dim)

    def forward(self, x):
        return torch.relu(self.bn(self.fc(x)))

batch_size = 8
dim = 16

def get_inputs():
    return [torch.randn(batch_size, dim)]

def get_init_inputs():
    return [dim]
"""


@pytest.mark.parametrize("phase", ["eval", "train"])
def test_gpu_path_phases_eval_and_a_training_step(tmp_path, phase):
    """eval: the module in eval mode (BatchNorm's running statistics); train: every variant's
    callable is a forward and backward that returns the outputs and the parameters'
    gradients, timed and judged with autograd on; autofuse through the backend."""
    p = toy_problem(tmp_path, LAYER, "3_Layer.py")
    seen = []

    def compile_fn(model, mode):
        seen.append((mode, model.training))
        return model if "max" not in mode else (lambda *xs: model(*xs) * 1.5)

    opts = GpuOptions(rounds=1, stage="shipped", correct_trials=1, phase=phase,
                      variants=("eager", *COMPILE, "autofuse greedy"))  # fmt: skip
    ceil = {"copy_bytes_per_s": 1e12, "bf16_mm_flops_per_s": 1e15}
    timer = FakeTimer(TIMES)
    outs = []

    def keeping(label, fn, args):
        outs.append(fn(*args))
        return timer(label, fn, args)

    rec = time_problem(p, opts, ceil, device="cpu", timer=keeping, compile_fn=compile_fn,
                       optimize_fn=greedy_only)  # fmt: skip
    assert rec["phase"] == phase and all(t == (phase == "train") for _, t in seen)
    assert rec["correct"]["autofuse greedy"] and rec["correct"][COMPILE[0]]
    assert rec["correct"][COMPILE[1]] is False  # a wrong output (or gradient) is caught
    n_out = 1 + (4 if phase == "train" else 0)  # the output, then fc and bn's gradients
    assert all(len(o) == n_out if isinstance(o, list) else n_out == 1 for o in outs)


def test_a_wrong_compile_mode_is_not_the_better_one(tmp_path):
    p = toy_problem(tmp_path)

    def wrong_max_autotune(model, mode):
        return (lambda *xs: model(*xs) + 1) if "max" in mode else (lambda *xs: model(*xs))

    rec = time_problem(p, GpuOptions(rounds=2, stage="small", correct_trials=1),
                       {"copy_bytes_per_s": 1e12, "bf16_mm_flops_per_s": 1e15}, device="cpu",
                       timer=FakeTimer(TIMES), compile_fn=wrong_max_autotune,
                       optimize_fn=greedy_only)  # fmt: skip
    assert rec["correct"][COMPILE[1]] is False and rec["best_compile"] == COMPILE[0]
    assert rec["speedup_vs_best_compile"] == pytest.approx(8 / 5)


def fake_record(number, tuned_us, best_compile_us, eager_us=10.0, correct=True):
    times = {"eager": eager_us, COMPILE[0]: best_compile_us, COMPILE[1]: 2 * best_compile_us,
             "autofuse greedy": tuned_us, "autofuse tuned": tuned_us}  # fmt: skip
    from experiments.kernelbench.gpu import verdicts

    rec = {"workload": f"L2_{number}_x", "complete": True, "mode": "gpu", "level": 2,
           "number": number, "dtype": "fp32", "tuned_source": "measured", "floor_us": 1.0,
           "times_us": {k: {"us": v, "source": "measured"} for k, v in times.items()},
           "correct": {k: correct for k in times if k != "eager"}}  # fmt: skip
    rec.update(verdicts(rec))
    rec["status"] = "ok" if rec["tuned_correct"] else "wrong"
    return rec


def test_level_figures_fast_1_and_geomean_over_the_better_compile_mode(tmp_path):
    recs = [fake_record(2, 4.0, 8.0), fake_record(4, 8.0, 4.0), fake_record(6, 12.0, 6.0),
            fake_record(8, 1.0, 1.0, correct=False)]  # fmt: skip
    s = level_stats(recs)
    assert s["fast_1"] == pytest.approx(2 / 4)  # 4 and 8 µs beat eager's 10; 12 does not
    assert s["faster_than_best_compile"] == pytest.approx(1 / 4)
    assert s["geomean_vs_best_compile"] == pytest.approx((2.0 * 0.5 * 0.5) ** (1 / 3))
    assert s["correct"] == pytest.approx(3 / 4) and s["wrong"] == 1
    for r in recs:
        (tmp_path / f"{r['workload']}.json").write_text(json.dumps(r))
    (tmp_path / "run.json").write_text(json.dumps({"stamp": {"commit": "abc"}}))
    assert len(records([tmp_path])) == 4 and "| 2 | gpu | fp32 | 4 |" in render(recs)
    from autofuse.tune.runreport import write_report

    md, _ = write_report(tmp_path)  # `autofuse report` reads the run folder
    assert "L2_2_x" in md.read_text()


def test_eager_steps_name_the_op_a_getitem_takes_from():
    def f(x):
        return torch.nn.functional.max_pool2d(x, 2, return_indices=True)[1].float() + 1

    opt = autofuse.optimize(f, [torch.randn(1, 2, 4, 4)])
    steps = eager_steps(opt.plan)
    assert all(k.startswith(("getitem(max_pool2d", "max_pool2d")) for k in steps) or not steps
    assert is_library("getitem(convolution)") and not is_library("max_pool2d_with_indices")


KB = default_dir()
SLICE = {1: [19, 28, 32, 42, 44, 47, 51, 96], 2: [10, 12, 18], 3: [1, 4]}


@pytest.mark.slow
@pytest.mark.skipif(KB is None, reason="no KernelBench folder (../shared/kernelbench or "
                    "$KERNELBENCH_DIR)")  # fmt: skip
@pytest.mark.parametrize("level", sorted(SLICE))
def test_kernelbench_slice_is_correct_through_both_front_ends(level):
    for p in discover(KB, level, set(SLICE[level])):
        rec = check_problem(p)
        assert rec["correct"], (p.key, rec)


@pytest.mark.skipif(KB is None, reason="no KernelBench folder")
def test_runner_command_line_writes_records_and_summary(tmp_path):
    main([str(KB), "--level", "1", "--problems", "19", "--out", str(tmp_path), "--timeout", "0"])
    folder = tmp_path / "L1_cpu_fp32"
    rec = json.loads((folder / "L1_19_ReLU.json").read_text())
    assert rec["correct"] and rec["fully_fused"] and rec["commit"]
    assert "L1_19_ReLU" in (folder / "summary.md").read_text()


def test_worker_bounds_each_problem_and_restarts_after_a_time_out():
    import sys

    from experiments.kernelbench.worker import Worker

    child = ("import sys, time\n"
             "from experiments.kernelbench.worker import serve\n"
             "serve(lambda n: time.sleep(60) if n == 2 else print('did', n) or True)\n")  # fmt: skip
    w = Worker([sys.executable, "-c", child])
    try:
        status, log = w.run(1, 60)
        assert status is None and log.strip() == "did 1"
        first = w.proc
        assert w.run(2, 1.5)[0] == "timeout" and w.proc is None
        assert w.run(3, 60)[0] is None and w.proc is not first  # a fresh child
    finally:
        w.stop()


def test_reduction_evaluates_arithmetic_on_literals(tmp_path):
    text = TOY.replace("dim = 300", "dim = 4096 * 4").replace(
        "batch_size = 64", "batch_size = 8 * 2"
    )
    module, changed = load_module(toy_problem(tmp_path, text), BY_STAGE["small"])
    assert (module.batch_size, module.dim, module.input_shape) == (2, 16, (16,))
    assert changed["dim"] == ["16384", "16"]


def test_sizes_equal_as_shipped_stay_equal(tmp_path):
    text = TOY.replace("dim = 300", "dim = 300\nwidth = 8").replace(
        "batch_size = 64", "batch_size = 300"
    )
    module, _ = load_module(toy_problem(tmp_path, text), BY_STAGE["small"])
    assert (module.batch_size, module.dim, module.input_shape, module.width) == (2, 2, (2,), 8)


def test_unpacked_shapes_are_reduced_each_by_its_name(tmp_path):
    text = TOY.replace("dim = 300", "dim = 300\ndepth, height, width = 16, 32, 32")
    module, changed = load_module(toy_problem(tmp_path, text), BY_STAGE["small"])
    assert (module.depth, module.height, module.width) == (6, 12, 12)
    assert changed["height"] == ["32", "12"]


CONV = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, c_in, c_out):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3)

    def forward(self, x):
        return torch.relu(self.conv(x)) * 2.0

batch_size = 2
c_in, c_out = 3, 4

def get_inputs():
    return [torch.randn(batch_size, c_in, 6, 6)]

def get_init_inputs():
    return [c_in, c_out]
"""


def test_gpu_variants_time_the_library_bias_arm_beside_the_peeled_one(tmp_path):
    """--variants greedy,greedy-library-bias,default: no max-autotune, no tuning; the second
    greedy plan is built, checked and timed with the bias in the library call; the verdicts
    are the greedy plan's; both arms under the same precision flags, which the record holds."""
    from autofuse.settings import settings
    from experiments.kernelbench.gpu import LIBRARY_BIAS, parse_variants

    p = toy_problem(tmp_path, CONV, "2_Conv2d_ReLU.py")
    built, during = [], []

    def optimize_recording(model, inputs, **options):
        assert not options  # no tuning asked
        fast = autofuse.optimize(model, inputs)
        built.append((settings().conv_bias, fast))
        return lambda *xs: (during.append(settings().conv_bias), fast(*xs))[1]

    times = {**TIMES, LIBRARY_BIAS: 9e-6}
    timer = FakeTimer(times)
    opts = GpuOptions(rounds=2, stage="small", correct_trials=1,
                      variants=parse_variants("greedy,greedy-library-bias,default"))  # fmt: skip
    rec = time_problem(p, opts, {"copy_bytes_per_s": 1e12, "bf16_mm_flops_per_s": 1e15},
                       device="cpu", timer=timer, compile_fn=fake_compile,
                       optimize_fn=optimize_recording)  # fmt: skip
    order = ["eager", COMPILE[0], "autofuse greedy", LIBRARY_BIAS]
    assert timer.calls == order + order[::-1] and set(rec["times_us"]) == set(order)
    assert [b for b, _ in built] == ["kernel", "library"] and settings().conv_bias == "kernel"
    assert set(during) == {"kernel", "library"}  # each arm judged and timed in its setting
    conv_inputs = [len(n.inputs) for _, f in built for n in f.plan.graph.nodes
                   if n.attr("target") == "aten.convolution.default"]  # fmt: skip
    assert conv_inputs == [2, 3]  # peeled; in the library call
    assert rec["headline"] == "autofuse greedy" and rec["tuned_correct"] and rec["fast_1"]
    assert rec["speedup_vs_best_compile"] == pytest.approx(8 / 7)
    assert rec["peeled_bias_speedup"] == pytest.approx(9 / 7) and all(rec["correct"].values())
    assert rec["precision"]["cudnn.allow_tf32"] == torch.backends.cudnn.allow_tf32
    assert {"cudnn", "cuda", "torch", "triton"} <= set(rec) and rec["precision_changed"] == {}
    json.dumps(rec)


def test_gpu_variants_time_the_own_convolution_arm_beside_cudnn(tmp_path):
    """--variants greedy,greedy-own-conv: the second greedy plan is built, checked and timed
    with AUTOFUSE_CONV_KERNEL=kernel (the convolution in autofuse's kernel, its epilogue
    fused), the first keeps cuDNN; own_conv_speedup compares them."""
    from autofuse.settings import settings
    from experiments.kernelbench.gpu import OWN_CONV, parse_variants

    p = toy_problem(tmp_path, CONV, "2_Conv2d_ReLU.py")
    built, during = [], []

    def optimize_recording(model, inputs, **options):
        fast = autofuse.optimize(model, inputs)
        built.append((settings().conv_kernel, fast))
        return lambda *xs: (during.append(settings().conv_kernel), fast(*xs))[1]

    timer = FakeTimer({**TIMES, OWN_CONV: 5e-6})
    opts = GpuOptions(rounds=2, stage="small", correct_trials=1,
                      variants=parse_variants("greedy,greedy-own-conv"))  # fmt: skip
    rec = time_problem(p, opts, {"copy_bytes_per_s": 1e12, "bf16_mm_flops_per_s": 1e15},
                       device="cpu", timer=timer, compile_fn=fake_compile,
                       optimize_fn=optimize_recording)  # fmt: skip
    order = ["eager", "autofuse greedy", OWN_CONV]
    assert timer.calls == order + order[::-1]
    assert [b for b, _ in built] == ["rule", "kernel"] and settings().conv_kernel == "rule"
    assert set(during) == {"rule", "kernel"} and all(rec["correct"].values())
    kinds = [{k.info.kind for k in f.plan.kernels} for _, f in built]
    assert "conv" not in kinds[0] and "conv" in kinds[1]  # cuDNN; the kernel
    assert rec["own_conv_speedup"] == pytest.approx(7 / 5)
    json.dumps(rec)


def test_a_variant_that_changes_precision_is_named_and_undone(tmp_path):
    from experiments.kernelbench.gpu import parse_variants

    p = toy_problem(tmp_path)
    before = torch.backends.cudnn.allow_tf32

    def tf32_flipping_compile(model, mode):
        torch.backends.cudnn.allow_tf32 = not before
        return lambda *xs: model(*xs)

    try:
        rec = time_problem(p, GpuOptions(rounds=1, stage="small", correct_trials=1,
                                         variants=parse_variants("default,greedy")),
                           {"copy_bytes_per_s": 1e12, "bf16_mm_flops_per_s": 1e15},
                           device="cpu", timer=FakeTimer(TIMES),
                           compile_fn=tf32_flipping_compile, optimize_fn=greedy_only)  # fmt: skip
    finally:
        after = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = before
    assert after == before and rec["precision"]["cudnn.allow_tf32"] == before
    assert rec["precision_changed"][COMPILE[0]]["cudnn.allow_tf32"] == (not before)


def test_variants_option_parses_short_names():
    from experiments.kernelbench.gpu import DEFAULT_VARIANTS, LIBRARY_BIAS, parse_variants
    from experiments.kernelbench.run import parse_args

    assert parse_variants("") == DEFAULT_VARIANTS and LIBRARY_BIAS not in DEFAULT_VARIANTS
    assert parse_variants("tuned,greedy") == ("eager", "autofuse greedy", "autofuse tuned")
    with pytest.raises(ValueError, match="unknown variant"):
        parse_variants("greedy,fastest")
    from experiments.kernelbench.run import worker_cmd

    a = parse_args([".", "--level", "2", "--mode", "gpu", "--variants", "greedy"])
    cmd = worker_cmd(a, Path("run"))
    assert cmd[cmd.index("--variants") + 1] == "greedy"  # the worker times the same variants
    with pytest.raises(SystemExit):
        parse_args([".", "--level", "2", "--mode", "gpu", "--variants", "nope"])
    with pytest.raises(SystemExit):
        parse_args([".", "--level", "2", "--variants", "greedy"])  # cpu mode


def test_measured_choices_read_from_step_reasons():
    from types import SimpleNamespace as NS

    from experiments.kernelbench.gpu import measured_choices

    why = "measured: convolutions channels-last vs plan -> plan"
    plan = NS(steps=(NS(reason=f"fused; {why}"), NS(reason=why), NS(reason=None),
                     NS(reason="peeled bias")))  # fmt: skip
    assert measured_choices(plan) == [why]


def test_gpu_judge_falls_back_to_a_float64_step_for_a_training_step():
    """A training step that fails KernelBench's rule against eager's is judged against the same
    step in float64 (``gpu.float64_step``): it passes where it is no further from float64 than
    eager is (a 0.5 offset either side of the true step), and a step far from both fails."""
    from experiments.kernelbench.gpu import float64_step, judge, train_call

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    inputs, weights = [torch.randn(2, 8)], [torch.randn(2, 4)]
    step = train_call(model, model, weights)

    def shifted(by):
        return lambda *xs: [o + by for o in step(*xs)]

    order = [("eager", shifted(0.5)), ("near", shifted(-0.5)), ("far", shifted(-8.0))]
    opts = GpuOptions(phase="train", correct_trials=1)
    got = judge(order, None, inputs, opts, torch.float32, "cpu", None, float64_step(model, weights))
    assert got["near"]["correct"] and got["near"]["judged_by_float64"], got
    assert got["near"]["max_abs_err"] == pytest.approx(1.0)  # against eager, as recorded
    assert not got["far"]["correct"], got
    assert all(p.dtype == torch.float32 for p in model.parameters())
    no_fallback = judge(order, None, inputs, opts, torch.float32, "cpu")
    assert not no_fallback["near"]["correct"]


def test_gpu_judge_falls_back_to_float64_outputs_for_a_bf16_forward():
    """A bf16 forward variant that fails the rule against eager's bf16 outputs is judged against
    the forward in float64 (``gpu.float64_forward``): one no further from it than eager passes,
    one far from both fails, and the module comes back in bfloat16 (the cast round-trips)."""
    from experiments.kernelbench.gpu import float64_forward, judge

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()).to(torch.bfloat16)
    before = [p.detach().clone() for p in model.parameters()]
    inputs = [torch.randn(2, 8, dtype=torch.bfloat16)]

    def shifted(by):
        return lambda *xs: model(*xs) + by

    order = [("eager", shifted(0.25)), ("near", shifted(-0.25)), ("far", shifted(-4.0))]
    opts = GpuOptions(phase="eval", correct_trials=1, dtype="bf16")
    with torch.no_grad():
        got = judge(order, None, inputs, opts, torch.bfloat16, "cpu", None, float64_forward(model))
    assert got["near"]["correct"] and got["near"]["judged_by_float64"], got
    assert not got["far"]["correct"], got
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


GROUPED = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, cin, cout, groups):
        super().__init__()
        mid = cout // 4
        self.a = nn.Conv2d(cin, mid, 1, groups=groups)
        self.b = nn.Conv2d(mid, cout, 1, groups=groups)
        self.skip = nn.Identity() if cin == cout else nn.Conv2d(cin, cout, 1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))) + self.skip(x)

batch_size = 10
cin = 240
cout = 480
groups = 3
height = 224
width = 224

def get_inputs():
    return [torch.rand(batch_size, cin, height, width)]

def get_init_inputs():
    return [cin, cout, groups]
"""


def test_divided_stage_keeps_channel_ratios_and_group_divisibility(tmp_path):
    """Capping 240 and 480 channels to 64 breaks three groups (64 % 3) and makes cin == cout;
    the divided stage takes them by one common factor (8: 30 and 60)."""
    from experiments.kernelbench.check import choose_stage
    from experiments.kernelbench.problems import common_factor

    stage, module, model, inputs, info = choose_stage(toy_problem(tmp_path, GROUPED, "3_G.py"))
    assert stage.name == "divided" and {"small", "medium"} <= set(info["skipped"])
    assert (module.cin, module.cout, module.groups, module.height) == (30, 60, 3, 32)
    assert isinstance(model.skip, torch.nn.Conv2d) and inputs[0].shape == (2, 30, 32, 32)
    assert common_factor([240, 480], 64) == 8 and common_factor([97, 193], 64) is None


def test_divided_stage_gives_way_where_no_factor_divides(tmp_path):
    with pytest.raises(ValueError, match="no common factor"):
        load_module(toy_problem(tmp_path, TOY.replace("dim = 300", "dim = 300\nother = 301")),
                    BY_STAGE["divided"])  # fmt: skip
