"""The workflow from overnight tuning to production, as a user runs it on a CPU machine:
``autofuse tune`` (cost model) stores its winners in the cache home, a resumed run with more
trials continues, ``autofuse cache export --run`` bundles them, ``autofuse cache import`` puts
them into an empty cache home and a fresh process ``load``s every workload with
``strict=True``, with no capture and no optuna."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autofuse import cli

SPEC = textwrap.dedent(
    """
    import torch

    def chain(x, y):
        return torch.sigmoid(x * y + 1.0) * 2.0

    def mlp():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                   torch.nn.Linear(32, 16))

    WORKLOADS = [
        {"name": "chain", "fn": chain,
         "inputs": lambda d: (torch.randn(8, 64, device=d), torch.randn(8, 64, device=d))},
        {"name": "mlp", "module": mlp, "inputs": lambda d: (torch.randn(4, 16, device=d),)},
    ]
    """
)

LOAD = textwrap.dedent(
    """
    import sys

    import torch

    import autofuse
    import spec  # as the serving code imports it (autofuse tune loaded the file by path)

    for w in spec.WORKLOADS:
        inputs, target = w["inputs"]("cpu"), w["fn"] if "fn" in w else w["module"]()
        fast = autofuse.load(target, inputs, strict=True)
        with torch.no_grad():
            torch.testing.assert_close(fast(*inputs), target(*inputs))
        assert fast.plan is not None and fast.plan.kernels, w["name"]
        print("loaded", w["name"])
    assert "optuna" not in sys.modules, "load imported optuna"
    assert "torch._dynamo" not in sys.modules, "load captured (imported Dynamo)"
    print("optuna imported:", "optuna" in sys.modules)
    """
)


ROOT = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOFUSE_", "TRITON_"))}
    return dict(env, PYTHONPATH=str(ROOT), AUTOFUSE_COMMIT="test", **extra)


def _run(cwd: Path, *args: str, env: dict | None = None, code: int = 0) -> str:
    p = subprocess.run([sys.executable, *args], cwd=cwd, env=env or _env(), text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)  # fmt: skip
    assert p.returncode == code, p.stdout
    return p.stdout


@pytest.mark.slow  # four fresh processes, two tuning runs: ~60 s on a small CPU
def test_tune_export_import_load_in_a_fresh_process(tmp_path, capsys, monkeypatch):
    (tmp_path / "spec.py").write_text(SPEC)
    tune = ("-m", "autofuse", "tune", "spec.py", "--polish", "0", "--out", "runs",
            "--no-progress", "--cache-dir", "home")  # fmt: skip
    out = _run(tmp_path, *tune, "--trials", "3")
    assert "no GPU: kernels run in Triton's interpreter" in out and "InterpreterNote" not in out
    folder = next((tmp_path / "runs").glob("*_cpu-model"))
    chain = json.loads((folder / "chain.json").read_text())
    assert chain["trials"] == 3 and (tmp_path / "home" / "plans" / chain["cache_key"]).is_dir()
    # more trials on resume: the study continues up to the new count, and says so
    out = _run(tmp_path, *tune, "--trials", "5", "--resume", "--workloads", "chain")
    assert "chain: tuned with 3 trials; continuing its study up to 5" in out
    chain = json.loads((folder / "chain.json").read_text())
    assert chain["trials"] == 5 and chain["trials_asked"] == 5
    meta = json.loads((tmp_path / "home" / "plans" / chain["cache_key"] / "plan.json").read_text())
    assert meta["payload"]["metadata"]["trials"] == 5  # the cache entry is the new winner
    # a key prefix names the entry in `cache show`
    monkeypatch.chdir(tmp_path)  # the CLI in this process, relative paths as a user types them
    assert cli.main(["cache", "show", chain["cache_key"][:6], "--cache-dir", "home"]) == 0
    assert chain["cache_key"] in capsys.readouterr().out
    assert cli.main(["cache", "export", chain["cache_key"][:6], "-o", "one.afz",
                     "--cache-dir", "home"]) == 0  # fmt: skip
    assert "wrote one.afz: 1 entries" in capsys.readouterr().out
    out = _run(tmp_path, "-m", "autofuse", "cache", "export", "--run", str(folder), "-o",
               "plans.afz", "--cache-dir", "home")  # fmt: skip
    assert "2 entries, 2 call records" in out
    out = _run(tmp_path, "-m", "autofuse", "cache", "import", "plans.afz", "--cache-dir", "prod")
    assert out.count("installed ") == 2
    (tmp_path / "load.py").write_text(LOAD)
    out = _run(tmp_path, "load.py", env=_env(AUTOFUSE_CACHE_DIR=str(tmp_path / "prod")))
    assert "loaded chain" in out and "loaded mlp" in out and "optuna imported: False" in out


def test_export_run_names_a_winner_missing_from_the_cache(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    rec = {"workload": "chain", "complete": True, "cache_key": "ab" * 16}
    (run / "chain.json").write_text(json.dumps(rec))
    code = cli.main(["cache", "export", "--run", str(run), "-o", str(tmp_path / "x.afz"),
                     "--cache-dir", str(tmp_path / "home")])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "chain" in err and "abab" in err and "not in" in err
