"""What a new user meets (issue 44): every promise of the docs kept, every mistake named.

A spec file tuned by path loads in production with no capture; the ``CacheMiss`` hint followed
literally leads to a hit; ``--resume`` mistakes are refused; one voice about what was tuned and
how; CLI and spec values checked before any work starts; nothing under the cache home removed
that autofuse did not write; no raw traceback (or TreeSpec, or numpy warning) for a user's
mistake; an installed library's model (GPT-2) gets a call key.
"""

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


def test_resume_alone_says_when_it_starts_a_new_run(spec_file, capsys):
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


# ---------------------------------------------------------------------------------------------
# the smaller points: each mistake named where it is made
# ---------------------------------------------------------------------------------------------


def test_meta_tensors_are_refused_by_optimize_naming_them():
    with pytest.raises(autofuse.CaptureError, match="example input leaf 1 is a meta tensor"):
        autofuse.optimize(_pointwise, (torch.randn(2, 2), torch.randn(2, 2, device="meta")))
    m = torch.nn.Linear(4, 4).to("meta")
    with pytest.raises(autofuse.CaptureError, match="module's weight is a meta tensor"):
        autofuse.optimize(m, (torch.randn(2, 4),))


@pytest.mark.parametrize(
    "options, named",
    [({"sampler": "foo"}, "sampler='foo'"), ({"trials": -5}, "trials=-5"),
     ({"time_budget": float("nan")}, "time_budget=nan")],
)  # fmt: skip
def test_search_option_values_are_checked_without_trials_too(options, named):
    with pytest.raises(ValueError, match=f"autofuse.optimize: {re.escape(named)}"):
        autofuse.optimize(_pointwise, (torch.randn(2, 2), torch.randn(2, 2)), **options)


def test_a_list_for_a_tensor_is_named_in_python_words():
    x = torch.randn(4, 4)
    fast = autofuse.optimize(_pointwise, (x, x))
    with pytest.raises(autofuse.InputError) as ei:
        fast(x, [x, x])
    msg = str(ei.value)
    assert "TreeSpec" not in msg
    assert "(Tensor, [Tensor, Tensor])" in msg and "captured for (Tensor, Tensor)" in msg


def test_an_unknown_log_topic_does_not_stop_the_import():
    import os
    import subprocess

    env = dict(os.environ, AUTOFUSE_LOGS="bogus,cache")
    code = "import autofuse; from autofuse.settings import settings; print(sorted(settings().logs))"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stdout.strip() == "['cache']"
    assert "SettingsWarning" in r.stderr and "'bogus'" in r.stderr and "output_code" in r.stderr


def _entry(home_dir, fn=_pointwise):
    from autofuse import cli

    inputs = (torch.randn(8, 32), torch.randn(8, 32))
    autofuse.optimize(fn, inputs, trials=1, polish=0, progress=False)
    (entry,) = [p for p in (home_dir / "plans").iterdir() if (p / "plan.json").is_file()]
    return cli, entry


def test_cache_clear_leaves_a_file_autofuse_did_not_write(home, capsys):
    cli, entry = _entry(home)
    (entry / "my_notes.txt").write_text("mine")
    assert cli.main(["cache", "clear"]) == 0
    assert sorted(p.name for p in entry.iterdir()) == ["my_notes.txt"]
    assert "my_notes.txt" in capsys.readouterr().err
    cli, other = _entry(home, lambda x, w: torch.tanh(x - w))
    (other / "my_notes.txt").write_text("mine too")
    assert cli.main(["cache", "clear", other.name[:8]]) == 0
    assert sorted(p.name for p in other.iterdir()) == ["my_notes.txt"]
    assert (entry / "my_notes.txt").read_text() == "mine"


def test_a_retuned_entry_keeps_a_file_autofuse_did_not_write(home, monkeypatch):
    _, entry = _entry(home)
    (entry / "my_notes.txt").write_text("mine")
    inputs = (torch.randn(8, 32), torch.randn(8, 32))
    autofuse.optimize(_pointwise, inputs, trials=1, polish=0, progress=False, retune=True)
    assert (entry / "my_notes.txt").read_text() == "mine"
    _no_capture(monkeypatch)
    assert autofuse.load(_pointwise, inputs, strict=True).plan is not None  # still a good entry


def test_cache_clear_key_of_a_symlinked_entry_is_no_traceback(home, tmp_path, capsys):
    cli, entry = _entry(home)
    elsewhere = tmp_path / "elsewhere"
    entry.rename(elsewhere)
    entry.symlink_to(elsewhere, target_is_directory=True)
    assert cli.main(["cache", "clear", entry.name]) == 0
    assert "symbolic link" in capsys.readouterr().out
    assert (elsewhere / "plan.json").is_file() and entry.is_symlink()
    assert cli.main(["cache", "clear"]) == 0
    assert (elsewhere / "plan.json").is_file()


def test_large_inputs_under_the_interpreter_get_a_note_about_the_wait(monkeypatch):
    import warnings

    from autofuse import api

    x = torch.randn(64, 64)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        autofuse.optimize(torch.sin, (x,))
    assert not [w for w in seen if "seconds to minutes" in str(w.message)]
    monkeypatch.setattr(api, "INTERPRETER_NUMEL", 1000)
    with pytest.warns(autofuse.InterpreterNote, match="4,096 elements.*small shapes") as rec:
        autofuse.optimize(torch.sin, (x,))
    assert rec[0].filename == __file__


def test_the_interpreter_s_numpy_warnings_do_not_reach_the_user():
    import warnings

    def f(a):
        return torch.log(a * 0) + a / (a - a)

    x = torch.tensor([[1.0, -2.0, 0.0, 3.0]])
    fast = autofuse.optimize(f, (x,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", autofuse.InterpreterNote)  # the first kernel's note
        fast(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = fast(x)
    torch.testing.assert_close(out, f(x), equal_nan=True)

    def g(a):
        return torch.argmax(a * 2, dim=-1)  # an all-NaN row: numpy's "All-NaN slice" warning

    y = torch.full((2, 16), float("nan"))
    fast = autofuse.optimize(g, (y,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(fast(y), g(y))


def test_the_help_and_the_results_page_speak_to_the_user(capsys):
    from pathlib import Path

    from autofuse import cli

    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    assert "seed article" not in text and ".py" not in text, text
    root = Path(__file__).resolve().parents[1]
    guide = (root / "docs" / "guide.md").read_text()
    results = (root / "results" / "README.md").read_text()
    for figure in re.findall(r"([\d.,]+ \S+) quoted in the guide", results):
        assert figure in guide, f"results/README.md cites {figure} from the guide, which has none"


# ---------------------------------------------------------------------------------------------
# a model of an installed library that reads a global registry object gets a call key
# ---------------------------------------------------------------------------------------------

FAKELIB = textwrap.dedent(
    """
    from collections.abc import Mapping

    import torch


    class Registry(Mapping):  # like transformers' attention / mask function registries
        def __init__(self, **fns):
            self._fns = dict(fns)

        def __getitem__(self, k):
            return self._fns[k]

        def __iter__(self):
            return iter(self._fns)

        def __len__(self):
            return len(self._fns)


    ACTS = Registry(gelu=torch.nn.functional.gelu, relu=torch.relu)


    class Block(torch.nn.Module):
        def __init__(self, act="gelu"):
            super().__init__()
            self.act = act
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            return ACTS[self.act](self.lin(x))
    """
)


@pytest.fixture
def fakelib(tmp_path, monkeypatch):
    """``fakelib`` 1.2.3, installed under a ``site-packages`` folder."""
    site = tmp_path / "site-packages"
    (site / "fakelib").mkdir(parents=True)
    (site / "fakelib" / "__init__.py").write_text(FAKELIB)
    info = site / "fakelib-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakelib\nVersion: 1.2.3\n")
    monkeypatch.syspath_prepend(str(site))
    from autofuse.cache import calls

    forget = getattr(calls, "_installed_version", None)  # the versions found for packages
    forget = forget.cache_clear if forget is not None else lambda: None
    forget()
    yield importlib.import_module("fakelib")
    sys.modules.pop("fakelib", None)
    forget()


def test_an_installed_library_module_reading_a_registry_object_gets_a_call_key(fakelib):
    from autofuse.cache.calls import call_key_why

    x = (torch.randn(2, 8),)
    key, why = call_key_why(fakelib.Block(), x)
    assert why is None and key is not None
    assert call_key(fakelib.Block(), x) == key
    assert call_key(fakelib.Block("relu"), x) != key  # its attributes are keyed, as ever


def test_a_registry_object_of_the_user_s_code_is_keyed_by_its_items():
    import types

    def make(act):
        table = types.MappingProxyType({"act": act})  # a Mapping that is not a dict

        def f(x):
            return table["act"](x) * 2

        return f

    x = (torch.randn(2, 8),)
    assert call_key(make(torch.tanh), x) is not None
    assert call_key(make(torch.tanh), x) != call_key(make(torch.sigmoid), x)


def test_gpt2_gets_a_call_key():
    transformers = pytest.importorskip("transformers")

    def model(heads):
        cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=heads, vocab_size=64,
                                      n_positions=16, bos_token_id=0, eos_token_id=0)  # fmt: skip
        return transformers.GPT2Model(cfg).eval()

    ids = (torch.randint(0, 64, (1, 8)),)
    with torch.no_grad():
        assert call_key(model(2), ids) is not None
        assert call_key(model(2), ids) != call_key(model(4), ids)


class _Scaled(torch.nn.Module):
    """A plain tensor attribute (neither a parameter nor a buffer), as some models hold."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 8)
        self.scale = torch.randn(8)

    def forward(self, x):
        return self.lin(x) * self.scale


def test_a_module_with_a_plain_tensor_attribute_runs_like_torch_compile(fresh_dynamo):
    x = torch.randn(4, 8)
    for m in (_Scaled(), _Scaled().eval()):
        for grad in (True, False):
            with torch.set_grad_enabled(grad):
                fast = autofuse.optimize(m, (x,))
                torch.testing.assert_close(fast(x), m(x))


def test_load_of_code_that_cannot_be_captured_is_a_miss_not_a_traceback(home, fresh_dynamo):
    from autofuse.cache import CacheMissWarning

    x = torch.randn(4, 8)
    m = _Scaled()
    with pytest.raises(autofuse.CacheMiss, match="cannot be captured.*torch.compile"):
        autofuse.load(m, (x,), strict=True)
    with pytest.warns(CacheMissWarning, match="cannot be captured"):
        same = autofuse.load(m, (x,))
    torch.testing.assert_close(same(x), m(x))
