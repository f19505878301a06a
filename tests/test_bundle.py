"""``autofuse cache export / import / list / show / clear``: one-file bundles, checked before
they are installed; a fresh production process runs an imported plan without the tuner."""

# ruff: noqa: E402

import os

import torch

if not torch.cuda.is_available():  # before triton is imported: kernels run in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import json
import subprocess
import sys
import textwrap
import warnings
import zipfile
from pathlib import Path

import pytest

from autofuse import cache, settings
from autofuse.cache import bundle
from autofuse.cache.keys import key_of_parts
from autofuse.capture.trace import capture
from autofuse.cli import main
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import build_plan
from tests.workloads import pointwise_example

ROOT = Path(__file__).resolve().parents[1]
DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
H200 = "NVIDIA H200 sm_90"


def _args():
    g = torch.Generator().manual_seed(1)
    return tuple(torch.randn(s, generator=g).to(DEVICE) for s in ((5, 3), (5, 3), (3,)))


def _entry(root, device=None):
    """An entry like tune_and_cache writes (key parts, tuning times); ``device``: as if it was
    built on another GPU."""
    args = _args()
    captured = capture(pointwise_example, args)
    plan = build_plan(captured.graph, Partitioner(captured.graph).greedy().groups)
    parts = cache.key_parts(captured, cache.DeviceInfo.current(cache.inputs_device(args)))
    if device:
        parts["device"] = device
    meta = {"function": "pointwise_example", "key_parts": parts, "value_s": 2e-6,
            "baselines_s": {"greedy": 3e-6, "unfused": 5e-6}, "source": "modeled"}  # fmt: skip
    key = key_of_parts(parts)
    cache.save_plan(root, key, plan, meta)
    return key, args


@pytest.fixture
def src(tmp_path):
    return tmp_path / "src"


def test_export_import_in_a_fresh_process_runs_without_the_tuner(src, tmp_path, capsys):
    key, args = _entry(src)
    out = tmp_path / "plans.afz"
    assert main(["cache", "export", key, "-o", str(out), "--cache-dir", str(src)]) == 0
    names = set(zipfile.ZipFile(out).namelist())
    assert names == {"manifest.json", f"plans/{key}/plan.json",
                     f"plans/{key}/autofuse_poi_fused_add_mul_sigmoid_0.py"}  # fmt: skip
    torch.save(args, tmp_path / "inputs.pt")
    script = textwrap.dedent(
        f"""
        import sys, warnings
        warnings.simplefilter("error")
        import torch
        from autofuse.cli import main
        assert main(["cache", "import", {str(out)!r}]) == 0
        import autofuse
        from tests.workloads import pointwise_example
        args = torch.load({str(tmp_path / "inputs.pt")!r})
        fast = autofuse.load(pointwise_example, args, strict=True)
        assert fast.cache_key == {key!r}, fast.cache_key
        out = fast(*args)
        assert torch.allclose(out, pointwise_example(*args), atol=1e-6)
        # the CLI's argument parsing for `autofuse tune` is light; the tuner and optuna are not
        tuner = ("autofuse.tune.tuner", "autofuse.tune.study", "autofuse.tune.climb")
        bad = [m for m in sys.modules if m in ("optuna", "search") or m in tuner
               or m.startswith(("optuna.", "search."))]
        assert not bad, bad
        print("OK")
        """
    )
    home = tmp_path / "home"  # the child's cache home: only the bundle fills it
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOFUSE_CACHE_DIR": str(home)}
    env.pop("AUTOFUSE_KERNEL_DIR", None)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=180)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    assert r.stdout.strip().endswith("OK")
    assert (home / "plans" / key / "plan.json").is_file()


def test_export_all_list_show_clear(src, tmp_path, capsys):
    key, _ = _entry(src)
    out = tmp_path / "all.afz"
    assert main(["cache", "export", "--all", "-o", str(out), "--cache-dir", str(src)]) == 0
    dst = tmp_path / "dst"
    assert main(["cache", "import", str(out), "--cache-dir", str(dst)]) == 0
    capsys.readouterr()
    assert main(["cache", "list", "--cache-dir", str(dst)]) == 0
    text = capsys.readouterr().out
    assert key in text and "float32[5, 3], float32[5, 3], float32[3]" in text
    assert "1.50x vs greedy" in text and "2.50x vs unfused" in text and "modeled" in text
    assert main(["cache", "show", key, "--cache-dir", str(dst)]) == 0
    text = capsys.readouterr().out
    assert "kernel autofuse_poi_fused_add_mul_sigmoid_0" in text and "torch " in text
    assert main(["cache", "clear", "--cache-dir", str(dst)]) == 0
    assert cache.list_entries(dst) == []


def test_another_device_is_refused_naming_it_or_accepted_loose(src, tmp_path, capsys, monkeypatch):
    foreign, args = _entry(src, device=H200)
    out = tmp_path / "h200.afz"
    bundle.export_bundle(out, [foreign], src)
    dst = tmp_path / "dst"
    assert main(["cache", "import", str(out), "--cache-dir", str(dst)]) == 2
    err = capsys.readouterr().err
    assert f"device: bundle '{H200}', here '{bundle.here()['device']}'" in err and "--loose" in err
    assert not (dst / "plans").exists() or not any((dst / "plans").iterdir())
    here = bundle.here()
    with monkeypatch.context() as m:  # same device, other torch: the message names torch
        m.setattr(bundle, "here", lambda: {**here, "device": H200, "torch": "0.0"})
        with pytest.raises(bundle.BundleError, match=r"torch: bundle '[^']+', here '0.0'"):
            bundle.import_bundle(out, dst)
    ((old, new),) = bundle.import_bundle(out, dst, loose=True)
    assert old == foreign and new == cache.key_for(capture(pointwise_example, args), args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fast = cache.load(pointwise_example, args, cache_dir=dst, strict=True)
    assert torch.allclose(fast(*args), pointwise_example(*args), atol=1e-6)
    assert fast.cache_metadata["imported_from"]["key"] == foreign


def _rewrite(path: Path, change) -> None:
    with zipfile.ZipFile(path) as z:
        files = {n: z.read(n) for n in z.namelist()}
    change(files)
    with zipfile.ZipFile(path, "w") as z:
        for n, d in files.items():
            z.writestr(n, d)


def _kernel_name(files):
    return next(n for n in files if n.endswith(".py"))


def _flip_middle(p: Path) -> None:
    d = bytearray(p.read_bytes())
    d[len(d) // 3] ^= 0xFF
    p.write_bytes(bytes(d))


DAMAGE = {
    "byte_flipped": _flip_middle,
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),
    "emptied": lambda p: p.write_bytes(b""),
    "kernel_edited": lambda p: _rewrite(p, lambda f: f.update(
        {_kernel_name(f): f[_kernel_name(f)].replace(b"tl.sigmoid", b"tl.exp")})),
    "file_added": lambda p: _rewrite(p, lambda f: f.update({"plans/x/evil.py": b"import os"})),
    "file_removed": lambda p: _rewrite(p, lambda f: f.pop(_kernel_name(f))),
    "manifest_edited": lambda p: _rewrite(p, lambda f: f.update(
        {"manifest.json": f["manifest.json"].replace(b"pointwise_example", b"other")})),
    "manifest_resigned_with_a_bad_file": lambda p: _rewrite(p, _resign),
}  # fmt: skip


def _resign(files):
    """A consistent-looking manifest over a damaged plan.json: the entry check catches it."""
    name = next(n for n in files if n.endswith("plan.json"))
    files[name] = files[name].replace(b'"float32"', b'"float64"', 1)
    m = json.loads(files["manifest.json"])
    key = name.split("/")[1]
    m["entries"][key]["files"]["plan.json"] = bundle.sha256_hex(files[name])
    m.pop("manifest_sha256")
    m["manifest_sha256"] = bundle.sha256_hex(bundle.canonical_json(m))
    files["manifest.json"] = json.dumps(m).encode()


@pytest.mark.parametrize("how", list(DAMAGE))
def test_a_corrupted_bundle_is_detected_and_installs_nothing(src, tmp_path, how):
    key, _ = _entry(src)
    out = tmp_path / "b.afz"
    bundle.export_bundle(out, None, src)
    DAMAGE[how](out)
    dst = tmp_path / "dst"
    with pytest.raises(bundle.BundleError, match="corrupted"):
        bundle.import_bundle(out, dst, loose=True)
    assert cache.list_entries(dst) == []
    assert not (dst / "plans").exists() or not list((dst / "plans").iterdir())


def test_export_refuses_a_corrupt_entry(src, tmp_path):
    key, _ = _entry(src)
    (src / "plans" / key / "plan.json").write_text("{")
    with pytest.raises(bundle.BundleError, match="JSON"):
        bundle.export_bundle(tmp_path / "b.afz", [key], src)


def test_cli_defaults_to_the_cache_home(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AUTOFUSE_CACHE_DIR", str(tmp_path / "home"))
    settings.reload_settings()
    try:
        key, _ = _entry(None)
        assert main(["cache", "list"]) == 0
        assert key in capsys.readouterr().out
    finally:
        monkeypatch.undo()
        settings.reload_settings()
