"""Bad input and data loss, each with a clear outcome: call-time errors naming the argument,
``optimize(42)``, spec files with unknown keys, an unwritable cache naming the folder and the
option, ``cache clear`` removing only what autofuse wrote, key prefixes, ``--version``, options
this machine cannot honour said once, a kernel that cannot launch running in eager."""

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import autofuse
from autofuse import cli
from autofuse.cache.commands import UnknownKey, clear_all, resolve_key
from autofuse.files import FolderNotWritable
from autofuse.frontend import options as frontend_options
from autofuse.settings import reload_settings
from autofuse.tune.runfiles import load_spec

ROOT = Path(__file__).resolve().parents[1]


def f(x, w, b):
    return torch.sigmoid(x * w + b)


@pytest.fixture(scope="module")
def fast():
    args = tuple(torch.randn(4, 8) for _ in range(3))
    return autofuse.optimize(f, args), args


def test_wrong_argument_count_names_the_inputs_before_and_after_a_first_call(fast):
    opt, (x, w, b) = fast
    with pytest.raises(autofuse.InputError, match=r"takes 3 tensors \(.*\), got 2"):
        opt(x, w)
    torch.testing.assert_close(opt(x, w, b), f(x, w, b))  # the C-level guard is built now
    with pytest.raises(autofuse.InputError, match="takes 3 tensors .*got 2"):
        opt(x, w)
    with pytest.raises(autofuse.InputError, match="takes 3 tensors .*got 4"):
        opt(x, w, b, b)


def test_meta_tensor_is_named_not_passed_to_triton(fast):
    opt, (x, w, b) = fast
    with pytest.raises(autofuse.InputError, match="input 1 .* is a meta tensor"):
        opt(x, w.to("meta"), b)


def test_optimize_of_a_non_callable_says_so():
    with pytest.raises(TypeError, match=r"autofuse.optimize: fn must be a function .* got int"):
        autofuse.optimize(42, (torch.randn(2),))


def test_spec_with_an_unknown_key_names_it(tmp_path):
    spec = tmp_path / "spec.py"
    spec.write_text(textwrap.dedent("""
        import torch
        WORKLOADS = [{"name": "a", "fn": torch.sin, "trails": 8,
                      "inputs": lambda d: (torch.randn(4, device=d),)}]
    """))  # fmt: skip
    with pytest.raises(
        ValueError, match=r"WORKLOADS\[0\]: unknown key 'trails'; did you mean 'trials'"
    ):
        load_spec(str(spec))


def test_unwritable_cache_names_the_folder_and_the_option(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    home = blocker / "cache"  # cannot be created, whoever runs the test (root included)
    (tmp_path / "spec.py").write_text(
        "import torch\nWORKLOADS = [{'name': 'a', 'fn': torch.sin, "
        "'inputs': lambda d: (torch.randn(4, device=d),)}]\n"
    )
    args = tuple(torch.randn(4, 8) for _ in range(3))
    with pytest.raises(FolderNotWritable, match=rf"{home}.*cache_dir"):
        autofuse.optimize(f, args, trials=2, cache_dir=home, progress=False)
    out = subprocess.run(
        [sys.executable, "-m", "autofuse", "tune", "spec.py", "--cache-dir", str(home)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    assert out.returncode != 0 and str(home) in out.stderr and "--cache-dir" in out.stderr
    assert "Traceback" not in out.stderr


def _fake_cache(home: Path, kernels: Path) -> list[Path]:
    """An entry, a call record and a generated kernel file as autofuse writes them; returns
    the user's own files placed beside them."""
    entry = home / "plans" / ("ab" * 16)
    entry.mkdir(parents=True)
    (entry / "plan.json").write_text("{}")
    (home / "calls").mkdir()
    (home / "calls" / f"{'cd' * 16}.json").write_text("{}")
    kernels.mkdir(parents=True, exist_ok=True)
    (kernels / f"autofuse_poi_fused_mul_0_{'0' * 20}.py").write_text("# generated")
    (kernels / "__pycache__").mkdir()
    (kernels / "__pycache__" / f"autofuse_poi_fused_mul_0_{'0' * 20}.cpython-312.pyc").write_text(
        ""
    )
    foreign = [home / "plans" / "my-notes.txt", kernels / "my_kernel.py", home / "calls" / "x.txt"]
    (home / "plans" / "not-an-entry").mkdir()  # a folder without plan.json: not autofuse's
    for p in foreign:
        p.write_text("the user's")
    return [*foreign, home / "plans" / "not-an-entry"]


@pytest.mark.parametrize("own_kernel_dir", [False, True])
def test_cache_clear_removes_only_what_autofuse_wrote(tmp_path, monkeypatch, own_kernel_dir):
    home = tmp_path / "home"
    kernels = tmp_path / "my-project" if own_kernel_dir else home / "kernels"
    monkeypatch.setenv("AUTOFUSE_CACHE_DIR", str(home))
    monkeypatch.setenv("AUTOFUSE_KERNEL_DIR", str(kernels))
    reload_settings()
    try:
        kept = _fake_cache(home, kernels)
        assert clear_all(None) == (1, 1, 2)
    finally:
        monkeypatch.undo()
        reload_settings()
    assert all(p.exists() for p in kept), [p for p in kept if not p.exists()]
    assert not (home / "plans" / ("ab" * 16)).exists()
    assert not list(kernels.glob("autofuse_*")) and not (kernels / "__pycache__").exists()
    assert not (home / "calls" / f"{'cd' * 16}.json").exists()


def test_key_prefixes_name_one_entry_or_say_why_not(tmp_path):
    for key in ("abc123" + "0" * 26, "abd456" + "0" * 26):
        (tmp_path / "plans" / key).mkdir(parents=True)
        (tmp_path / "plans" / key / "plan.json").write_text("{}")
    assert resolve_key(tmp_path, "abc") == "abc123" + "0" * 26
    with pytest.raises(UnknownKey, match="names 2 entries"):
        resolve_key(tmp_path, "ab")
    with pytest.raises(UnknownKey, match="no entry 'ff'"):
        resolve_key(tmp_path, "ff")
    assert cli.main(["cache", "clear", "abd", "--cache-dir", str(tmp_path)]) == 0
    assert not (tmp_path / "plans" / ("abd456" + "0" * 26)).exists()


def test_version_names_the_release_and_autofuse_own_commit(capsys, monkeypatch):
    monkeypatch.setenv("AUTOFUSE_COMMIT", "abc1234")
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"autofuse {autofuse.__version__} (commit abc1234)"


def test_backend_trials_on_cpu_are_said_once_not_ignored(fresh_dynamo, monkeypatch):
    monkeypatch.setattr(frontend_options, "_NOTED", set())
    fn = torch.compile(lambda x: torch.sin(x) * 2, backend="autofuse", options={"trials": 8})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fn(torch.randn(8))
        fn(torch.randn(16))  # a second graph: no second note
    notes = [w for w in seen if issubclass(w.category, frontend_options.OptionNote)]
    assert len(notes) == 1 and "trials=8" in str(notes[0].message)


CPU_SCRIPT = textwrap.dedent(
    """
    import os, warnings
    warnings.simplefilter("always")
    import torch, autofuse
    x = torch.randn(8, 8)
    with warnings.catch_warnings(record=True) as seen:
        out = autofuse.optimize(lambda a: torch.sigmoid(a * 2), (x,))(x)
        torch.testing.assert_close(out, torch.sigmoid(x * 2))
        out = autofuse.optimize(lambda a: torch.cos(a) * 2, (x,))(x)  # a second kernel
    torch.testing.assert_close(out, torch.cos(x) * 2)
    notes = [w for w in seen if w.category.__name__ == "InterpreterNote"]
    print("notes", len(notes), "TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET"))
    print("build warnings", [w.category.__name__ for w in seen if w not in notes])
    """
)


def test_import_on_cpu_selects_the_interpreter_once_unless_the_user_chose(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), AUTOFUSE_CACHE_DIR=str(tmp_path))
    (tmp_path / "s.py").write_text(CPU_SCRIPT)
    run = [sys.executable, str(tmp_path / "s.py")]
    out = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "notes 1 TRITON_INTERPRET 1" in out.stdout and "build warnings []" in out.stdout
    # the user's own choice stands: with the interpreter off on a CPU, the kernel cannot
    # launch (no driver), and its ops run in eager with one KernelBuildWarning
    out = subprocess.run(run, env=dict(env, TRITON_INTERPRET="0"), capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "notes 0 TRITON_INTERPRET 0" in out.stdout
    assert "build warnings ['KernelBuildWarning', 'KernelBuildWarning']" in out.stdout
