"""What a new user meets (issue 44): every promise of the docs kept, every mistake named.
A spec file tuned by path loads in production with no capture, the ``CacheMiss`` hint followed
literally leads to a hit, ``--resume`` mistakes, the report's one voice, CLI values checked
before any work starts, the cache home's files that autofuse did not write."""

import importlib
import re
import sys
import textwrap

import pytest
import torch

import autofuse
from autofuse.cache.calls import call_key
from autofuse.tune.runfiles import load_spec

SPEC = textwrap.dedent(
    """
    import torch

    def chain(x, y):
        return torch.sigmoid(x * y + 1.0) * 2.0

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin = torch.nn.Linear(16, 16)

        def forward(self, x):
            return torch.relu(self.lin(x)) * 2.0

    WORKLOADS = [
        {"name": "chain", "fn": chain,
         "inputs": lambda d: (torch.randn(8, 64, device=d), torch.randn(8, 64, device=d))},
        {"name": "block", "module": Block, "inputs": lambda d: (torch.randn(4, 16, device=d),)},
    ]
    """
)


@pytest.fixture
def spec_file(tmp_path, monkeypatch):
    """``my_spec.py`` in a folder on ``sys.path``, as production imports it."""
    (tmp_path / "my_spec.py").write_text(SPEC)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / "my_spec.py"
    sys.modules.pop("my_spec", None)


def _no_capture(monkeypatch):
    trace = importlib.import_module("autofuse.capture.trace")

    def refuse(*a, **k):
        raise AssertionError("load captured the function")

    monkeypatch.setattr(trace, "capture", refuse)


def test_a_spec_tuned_by_file_path_has_its_production_call_key(spec_file):
    tuned = load_spec(str(spec_file))  # as `autofuse tune my_spec.py` loads it
    prod = importlib.import_module("my_spec")  # as the serving code imports it
    assert tuned[0].fn.__module__ != prod.chain.__module__
    for w, target in zip(tuned, (prod.chain, prod.Block())):
        inputs = w.inputs("cpu")
        assert call_key(w.target(), inputs) is not None
        assert call_key(w.target(), inputs) == call_key(target, inputs), w.name


def test_load_after_tuning_a_spec_file_does_not_capture(spec_file, home, monkeypatch):
    (w, _) = load_spec(str(spec_file))
    inputs = w.inputs("cpu")
    autofuse.optimize(w.fn, inputs, trials=1, polish=0, progress=False)
    prod = importlib.import_module("my_spec")
    _no_capture(monkeypatch)
    fast = autofuse.load(prod.chain, inputs, strict=True)
    torch.testing.assert_close(fast(*inputs), prod.chain(*inputs))


def _pointwise(x, w):
    return torch.sigmoid(x * w) + 1.0


def test_the_cache_miss_hint_followed_literally_leads_to_a_hit(home, monkeypatch):
    inputs = (torch.randn(8, 32), torch.randn(8, 32))
    with pytest.raises(autofuse.CacheMiss) as ei:
        autofuse.load(_pointwise, inputs, strict=True)
    hint = re.search(r"autofuse\.optimize\(.*?\)(?= with)", str(ei.value)).group(0)
    eval(hint, {"autofuse": autofuse, "_pointwise": _pointwise, "example_inputs": inputs})
    _no_capture(monkeypatch)
    fast = autofuse.load(_pointwise, inputs, strict=True)
    assert fast.plan is not None


# ---------------------------------------------------------------------------------------------
# autofuse tune: --resume mistakes and bad values, named before any work starts
# ---------------------------------------------------------------------------------------------


def _tune_cli(tmp_path, *args: str) -> int:
    from autofuse import cli

    argv = ["tune", str(tmp_path / "my_spec.py"), "--out", str(tmp_path / "runs"), *args]
    return cli.main([*argv, "--cache-dir", str(tmp_path / "home"), "--no-progress"])


def test_resume_refuses_a_misspelt_folder_a_file_and_another_specs_run(spec_file, capsys):
    tmp = spec_file.parent
    other = tmp / "runs" / "2026-01-01_cpu-model"
    other.mkdir(parents=True)
    (other / "run.json").write_text('{"runs": [], "workloads": ["attention"]}')
    (other / "attention.json").write_text('{"workload": "attention", "complete": true}')
    (other / "summary.csv").write_text("workload\nattention\n")
    cases = {
        str(tmp / "runs" / "2026-01-01_cpu-modle"): "no such folder",
        str(spec_file): "a file, not a run folder",
        str(other): "a run of another spec",
    }
    for folder, why in cases.items():
        assert _tune_cli(tmp, "--resume", folder) == 2
        err = capsys.readouterr().err
        assert f"--resume {folder}: {why}" in err and "AUTOFUSE_CACHE_DIR" not in err, err
    assert sorted(p.name for p in (tmp / "runs").iterdir()) == [other.name]  # nothing started
    assert (other / "summary.csv").read_text() == "workload\nattention\n"


def test_resume_alone_says_when_it_starts_a_new_run(spec_file, capsys, monkeypatch):
    from autofuse.tune.runfiles import run_dir

    tmp = spec_file.parent
    other = tmp / "runs" / "2026-01-01_cpu-model"
    other.mkdir(parents=True)
    (other / "run.json").write_text('{"runs": [], "workloads": ["attention"]}')
    path = run_dir(tmp / "runs", True, "cpu-model", ["chain", "block"])
    assert path != other and not path.exists()
    assert "no earlier run of this spec" in capsys.readouterr().err
    (other / "run.json").write_text('{"runs": [], "workloads": ["chain"]}')
    assert run_dir(tmp / "runs", True, "cpu-model", ["chain", "block"]) == other


@pytest.mark.parametrize(
    "args, named",
    [
        (("--trials", "-5"), "--trials"),
        (("--trials", "0"), "--trials"),
        (("--time-budget", "-1"), "--time-budget"),
        (("--time-budget", "nan"), "--time-budget"),
        (("--workers", "0"), "--workers"),
        (("--polish", "-1"), "--polish"),
    ],
)
def test_bad_cli_values_are_refused_before_any_work(spec_file, capsys, args, named):
    with pytest.raises(SystemExit) as ei:
        _tune_cli(spec_file.parent, *args)
    assert ei.value.code == 2
    assert f"argument {named}:" in capsys.readouterr().err
    assert not (spec_file.parent / "runs").exists()


def test_bad_spec_values_and_an_unimportable_module_are_named(spec_file, capsys, monkeypatch):
    from autofuse import cli

    monkeypatch.chdir(spec_file.parent)
    assert cli.main(["tune", "no_such_spec_module", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "cannot import the spec" in err and "no_such_spec_module" in err
    for field, value in (("trials", "-5"), ("time_budget", "-1.0"), ("trials", "2.5")):
        bad = SPEC.replace('"fn": chain,', f'"fn": chain, "{field}": {value},')
        (spec_file.parent / "bad_spec.py").write_text(bad)
        assert cli.main(["tune", "bad_spec.py", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert f"(chain): '{field}' must be" in err and value in err, err
    assert not (spec_file.parent / "autofuse-runs").exists()


# ---------------------------------------------------------------------------------------------
# one voice about what was tuned and how
# ---------------------------------------------------------------------------------------------


def test_optimize_a_module_with_trials_on_cpu_does_not_say_trials_were_not_used(
    home, fresh_dynamo, monkeypatch
):
    import warnings

    from autofuse.frontend import options as frontend_options

    monkeypatch.setattr(frontend_options, "_NOTED", set())
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU())  # train mode, grad
    x = torch.randn(4, 16)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        opt = autofuse.optimize(m, (x,), trials=3, polish=0, progress=False)
    notes = [str(w.message) for w in seen if issubclass(w.category, frontend_options.OptionNote)]
    assert notes and all("not used" not in n for n in notes), notes
    assert "trials=3 tuned the captured plan" in notes[0]
    assert "3 trials" in opt.report()


def test_the_report_of_a_cache_hit_keeps_the_times_and_baselines(home):
    inputs = (torch.randn(8, 32), torch.randn(8, 32))
    first = autofuse.optimize(_pointwise, inputs, trials=3, polish=0, progress=False)
    hit = autofuse.optimize(_pointwise, inputs, trials=3, polish=0, progress=False)
    want = first.report().splitlines()
    got = hit.report().splitlines()
    assert "(modeled)" in got[3], got  # the kernel's modeled time
    assert got[:4] == want[:4]  # the table, times included
    vs = [line for line in want if line.startswith("  vs ")]
    assert vs and [line for line in got if line.startswith("  vs ")] == vs
    assert "from the cache: tuned earlier with 3 trials" in got[-len(vs) - 1]
