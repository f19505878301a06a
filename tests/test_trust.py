"""Production trust: only verified kernel text runs. A planted ``.pyc``, a file swapped in while
plans load, a fallback folder another user can write: none of their code ever runs (a marker
file never appears) and the results stay right. Tiny shapes through the interpreter on CPU."""

# ruff: noqa: E402

import os

import torch

if not torch.cuda.is_available():  # before triton is imported: kernels run in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import hashlib
import importlib.util
import py_compile
import threading
from pathlib import Path

import pytest

from autofuse import cache, settings
from autofuse.capture.trace import capture
from autofuse.kernels.common import loader
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import build_plan
from tests.helpers import fresh_runtime

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


def f(x, w):
    return torch.sigmoid(x * w) * 2.0


def _args():
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(9, 7, generator=g).to(DEVICE) for _ in range(2))


def _stored():
    args = _args()
    captured = capture(f, args)
    plan = build_plan(captured.graph, Partitioner(captured.graph).greedy().groups)
    key = cache.key_for(captured, args)
    cache.save_plan(None, key, plan, {"function": "f"})
    return args, key, plan


def _planted(marker: Path, name: str) -> str:
    """Source that leaves ``marker`` behind when it runs and defines ``name``."""
    return f"open({str(marker)!r}, 'w').write('ran')\ndef {name}(*a, **k):\n    pass\n"


def _file_stem(kernel) -> str:
    return f"{kernel.name}_{hashlib.sha256(kernel.source.encode()).hexdigest()[:20]}"


def test_a_planted_pyc_never_runs(home, tmp_path, monkeypatch):
    args, key, plan = _stored()
    marker = tmp_path / "marker"
    kernels = home / "kernels"
    kernels.mkdir(parents=True, exist_ok=True)
    for k in plan.kernels:  # the file an import would read, and its bytecode both ways
        stem = _file_stem(k)
        (kernels / f"{stem}.py").write_text(k.source)
        evil = tmp_path / f"{stem}.py"
        evil.write_text(_planted(marker, k.name))
        for mode in (py_compile.PycInvalidationMode.UNCHECKED_HASH,
                     py_compile.PycInvalidationMode.TIMESTAMP):  # fmt: skip
            pyc = importlib.util.cache_from_source(str(kernels / f"{stem}.py"))
            py_compile.compile(str(evil), cfile=pyc, invalidation_mode=mode, doraise=True)
            os.utime(pyc)
            fresh_runtime(monkeypatch)
            out = cache.load(f, args, strict=True)(*args)
            assert not marker.exists()
            torch.testing.assert_close(out, f(*args))
    assert not list(home.rglob("__pycache__/autofuse_generated*"))


def test_kernel_code_comes_from_the_verified_text(home):
    args, key, plan = _stored()
    fast = cache.load(f, args, strict=True)
    fast(*args)
    k = plan.kernels[0]
    fn = loader.load_kernel(k.source, k.name)
    code = getattr(fn, "fn", fn).__code__
    assert code.co_filename.startswith("<autofuse kernel ") and not Path(code.co_filename).exists()
    assert not list(home.rglob("*.pyc"))


def test_a_file_swapped_in_while_plans_load_never_runs(home, tmp_path, monkeypatch):
    """A watcher thread rewrites every kernel file it can find (the entry's and the kernel
    folder's) the moment it appears, while plans load again and again."""
    args, key, plan = _stored()
    marker = tmp_path / "marker"
    kernels = home / "kernels"
    kernels.mkdir(parents=True, exist_ok=True)
    stems = {_file_stem(k): k.name for k in plan.kernels}
    stop = threading.Event()

    def watcher():
        while not stop.is_set():
            for stem, name in stems.items():
                try:
                    (kernels / f"{stem}.py").write_text(_planted(marker, name))
                except OSError:
                    pass

    t = threading.Thread(target=watcher, daemon=True)
    t.start()
    try:
        for _ in range(10):
            fresh_runtime(monkeypatch)
            out = cache.load(f, args, strict=True)(*args)
            torch.testing.assert_close(out, f(*args))
    finally:
        stop.set()
        t.join()
    assert not marker.exists()


def _no_kernel_dir(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("AUTOFUSE_KERNEL_DIR", str(blocker / "kernels"))  # cannot be created
    settings.reload_settings()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    return tmp / f"autofuse-kernels-{os.getuid()}"


@pytest.mark.parametrize("how", ["mode 0777", "another owner", "a link"])
def test_a_foreign_fallback_folder_is_refused(home, tmp_path, monkeypatch, how):
    args, key, plan = _stored()
    marker = tmp_path / "marker"
    fallback = _no_kernel_dir(monkeypatch, tmp_path)
    if how == "a link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        fallback.symlink_to(tmp_path / "elsewhere")
    else:
        fallback.mkdir()
        os.chmod(fallback, 0o777 if how == "mode 0777" else 0o700)
    if how == "another owner":
        uid = os.getuid()
        monkeypatch.setattr(os, "getuid", lambda: uid + 1)
    for k in plan.kernels:
        (fallback / f"{_file_stem(k)}.py").write_text(_planted(marker, k.name))
    with pytest.raises(loader.UnsafeFolder, match="autofuse-kernels"):
        loader.kernel_dir()
    monkeypatch.setenv("AUTOFUSE_LOGS", "output_code")
    settings.reload_settings()
    out = cache.load(f, args, strict=True)(*args)
    torch.testing.assert_close(out, f(*args))
    assert not marker.exists()


def test_a_private_fallback_folder_is_made_owner_only(home, tmp_path, monkeypatch):
    fallback = _no_kernel_dir(monkeypatch, tmp_path)
    assert loader.kernel_dir() == fallback
    st = os.lstat(fallback)
    assert st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o700
    path = loader.kernel_file("x = 1\n", "k")
    assert path.parent == fallback and path.read_text() == "x = 1\n"


# ---------------------------------------------------------------------------------------------
# The code generator's identity in every key
# ---------------------------------------------------------------------------------------------


def test_the_generator_id_hashes_the_package_sources(tmp_path):
    import shutil

    from autofuse.cache import keys

    pkg = Path(keys.__file__).resolve().parents[1]
    assert keys.generator_id() == keys.source_hash(pkg) and keys.generator_id.cache_info().hits >= 0
    copy = tmp_path / "autofuse"
    shutil.copytree(pkg, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert keys.source_hash(copy) == keys.generator_id()
    render = copy / "kernels" / "common" / "render.py"
    render.write_text(render.read_text() + "\n# a rounding fix\n")
    assert keys.source_hash(copy) != keys.generator_id()


def test_an_entry_of_another_generator_is_not_served(home, monkeypatch):
    from autofuse.cache import calls, keys

    args = _args()
    with monkeypatch.context() as m:  # cached by other code: another generator id
        m.setattr(keys, "generator_id", lambda: "0ther0generat0r")
        m.setattr(calls, "generator_id", lambda: "0ther0generat0r")
        _, key, _ = _stored()
        assert cache.load(f, args, strict=True).plan is not None  # served to its own code
    assert key != cache.key_for(capture(f, args), args)
    fresh_runtime(monkeypatch)
    with pytest.raises(cache.CacheMiss):
        cache.load(f, args, strict=True)
    with pytest.raises(cache.CacheMiss):
        cache.load(f, args, strict=True, retrace=True)


def test_a_bundle_of_another_generator_is_refused_even_loose(home, tmp_path, monkeypatch):
    from autofuse.cache import bundle

    _stored()
    out = tmp_path / "b.afz"
    bundle.export_bundle(out, None, None)
    here = bundle.here()
    monkeypatch.setattr(bundle, "here", lambda: {**here, "generator": "0ther0generat0r"})
    for loose in (False, True):
        with pytest.raises(bundle.BundleError, match="generator: bundle '[0-9a-f]+'"):
            bundle.import_bundle(out, tmp_path / "dst", loose=loose)
    assert not (tmp_path / "dst" / "plans").exists() or not any((tmp_path / "dst/plans").iterdir())
