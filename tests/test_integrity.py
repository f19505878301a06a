"""Production: one cache home, and nothing runs unchecked (fault injection on every file of an
entry and of the runtime kernel folder: detected before it runs, one warning, right results,
no exception from the call). Tiny shapes through the interpreter on CPU."""

# ruff: noqa: E402

import os

import torch

if not torch.cuda.is_available():  # before triton is imported: kernels run in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import json
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from autofuse import cache, settings
from autofuse.cache import binaries
from autofuse.capture.trace import capture
from autofuse.kernels.common import loader
from autofuse.kernels.common.loader import KernelFileWarning
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import KernelBuildWarning, KernelStep, Plan, build_plan, execute
from tests.helpers import fresh_runtime, plain_build

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


def f(x, w, b):
    return torch.sigmoid(x * w + b) * 2.0


def _args():
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(s, generator=g).to(DEVICE) for s in ((9, 7), (9, 7), (7,)))


def _plan(fn, args):
    captured = capture(fn, args)
    return captured, build_plan(captured.graph, Partitioner(captured.graph).greedy().groups)


def _stored(home):
    args = _args()
    captured, plan = _plan(f, args)
    key = cache.key_for(captured, args)
    cache.save_plan(None, key, plan, {"function": "f"})  # None: the cache home
    return args, key, plan


# ---------------------------------------------------------------------------------------------
# One cache home
# ---------------------------------------------------------------------------------------------


def test_the_cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv("AUTOFUSE_CACHE_DIR", raising=False)
    monkeypatch.delenv("AUTOFUSE_KERNEL_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    s = settings.reload_settings()
    assert s.cache_dir == tmp_path / "xdg" / "autofuse"
    assert s.kernel_dir == s.cache_dir / "kernels"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert settings.reload_settings().cache_dir == Path.home() / ".cache" / "autofuse"
    monkeypatch.setenv("AUTOFUSE_CACHE_DIR", str(tmp_path / "mine"))
    assert settings.reload_settings().cache_dir == tmp_path / "mine"
    assert settings.cache_home() == tmp_path / "mine"
    assert settings.cache_home(tmp_path / "x") == tmp_path / "x"  # cache_dir= overrides
    assert cache.plans_dir() == tmp_path / "mine" / "plans"
    monkeypatch.undo()
    settings.reload_settings()


def test_store_list_and_load_default_to_the_home(home):
    from autofuse.runner import OptimizedFunction

    args = _args()
    captured, plan = _plan(f, args)
    path = cache.store(OptimizedFunction(captured, plan, f), args)
    assert path.parent == home / "plans"
    assert [e.key for e in cache.list_entries()] == [path.name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt = cache.load(f, args, strict=True)
    assert torch.equal(opt(*args), execute(plan, list(args))[0])
    assert not list((home / "kernels").glob("*.py"))  # kernels run from the verified text


def test_no_default_is_a_relative_folder():
    import inspect

    from autofuse.cache import disk, load
    from autofuse.tune import entry, tuner

    for mod in (disk, load, entry, tuner):
        assert ".autofuse_cache" not in inspect.getsource(mod), mod.__name__


# ---------------------------------------------------------------------------------------------
# Fault injection
# ---------------------------------------------------------------------------------------------


def _edit(p: Path) -> None:
    text = p.read_text()
    p.write_text(text.replace("2.0", "3.0", 1) if "2.0" in text else "# edited\n" + text)


KINDS = {
    "edited": _edit,
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),
    "emptied": lambda p: p.write_bytes(b""),
    "byte_flipped": lambda p: p.write_bytes(
        (lambda d: bytes(d[:-3]) + bytes([d[-3] ^ 0x20]) + bytes(d[-2:]))(p.read_bytes())
    ),
}


def _one_warning(rec, kind):
    ours = [r for r in rec if issubclass(r.category, (cache.CacheWarning, KernelFileWarning,
                                                       KernelBuildWarning))]  # fmt: skip
    assert len(ours) == 1, [str(r.message) for r in ours]
    assert issubclass(ours[0].category, kind), ours[0]
    return str(ours[0].message)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("file", ["plan.json", "kernel"])
def test_a_damaged_entry_never_runs(home, kind, file):
    args, key, plan = _stored(home)
    entry = home / "plans" / key
    target = entry / ("plan.json" if file == "plan.json" else f"{plan.kernels[0].name}.py")
    KINDS[kind](target)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        fast = cache.load(f, args)
        out = fast(*args)
    msg = _one_warning(rec, cache.CacheMissWarning)
    assert target.name in msg
    assert fast.plan is None and torch.equal(out, f(*args))  # eager: exact
    with pytest.raises(cache.CacheMiss):
        cache.load(f, args, strict=True)


def test_a_kernel_that_cannot_be_loaded_runs_in_eager(home, monkeypatch):
    args, key, plan = _stored(home)
    name = plan.kernels[0].name

    def cannot_load(*a):
        raise OSError("no memory for the module")

    monkeypatch.setattr(loader, "_module_from_source", cannot_load)
    monkeypatch.setattr(loader, "_BUILT", {})  # kernels built earlier in this process
    monkeypatch.setattr(loader, "_LOADED", {})
    fast = cache.load(f, args, strict=True)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        outs = [fast(*args) for _ in range(3)]
    assert name in _one_warning(rec, KernelBuildWarning)
    for out in outs:
        assert torch.allclose(out, f(*args), atol=1e-6)
    monkeypatch.setenv("AUTOFUSE_STRICT", "1")
    settings.reload_settings()
    fresh_runtime(monkeypatch)
    with pytest.raises(OSError):
        cache.load(f, args, strict=True)(*args)


def test_a_kernel_that_does_not_compile_runs_in_eager(home):
    args = _args()
    captured, plan = _plan(f, args)
    (step,) = [s for s in plan.steps if isinstance(s, KernelStep)]
    broken = replace(step.kernel, source=step.kernel.source.replace("def ", "def (", 1))
    bad = Plan(plan.graph, tuple(KernelStep(broken) if s is step else s for s in plan.steps))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        outs = [execute(bad, list(args))[0] for _ in range(2)]
    assert "SyntaxError" in _one_warning(rec, KernelBuildWarning)
    for out in outs:
        assert torch.allclose(out, f(*args), atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Compiled binaries in the entry (storage and checks; launching one needs CUDA)
# ---------------------------------------------------------------------------------------------


class _Compiled:
    """Stands in for Triton's CompiledKernel (what record_from_compiled reads)."""

    def __init__(self, tmp: Path):
        meta = tmp / "k.json"
        meta.write_text(json.dumps({"name": "k", "target": {"backend": "cuda", "arch": 90}}))
        self.kernel, self.name, self.hash = b"\x7fELF cubin bytes", "k", "abc"
        self.metadata_group = {"k.json": str(meta), "k.cubin": str(tmp / "k.cubin")}
        self.src = type("S", (), {"signature": {"x": "*fp32", "n": "i32"},
                                  "constants": {(2,): 64}, "attrs": {(0,): [["tt.divisibility", 16]]}})  # fmt: skip


@pytest.fixture
def with_binary(home, monkeypatch, tmp_path):
    monkeypatch.setattr(binaries, "current_build", lambda: {"capability": [9, 0],
                        "torch": torch.__version__, "triton": binaries.triton_version()})  # fmt: skip
    args, key, plan = _stored(home)
    step = cache.load_plan(None, key).steps[0]
    step.store.save((True, True, True, True), _Compiled(tmp_path))
    (path,) = (home / "plans" / key / "bin").glob("*.json")
    return args, key, plan, path


def test_binaries_are_stored_and_verified(with_binary):
    args, key, plan, path = with_binary
    assert path.name == f"{plan.kernels[0].name}.sm_90.aaaa.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (step,) = [s for s in cache.load_plan(None, key).steps if isinstance(s, KernelStep)]
    rec = step.store.records[(True, True, True, True)]
    # the signature keeps the kernel's parameter order (the launcher packs arguments by it)
    assert rec["signature"] == [["x", "*fp32"], ["n", "i32"]]
    assert rec["constexprs"] == [[[2], 64]]
    assert binaries.mismatch(rec) == []
    other = {"capability": [8, 0], "torch": "0.0", "triton": rec["triton"]}
    assert [m.split(":")[0] for m in binaries.mismatch(rec, other)] == ["capability", "torch"]


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_damaged_binary_is_dropped_and_the_source_runs(with_binary, kind, monkeypatch):
    args, key, plan, path = with_binary
    KINDS[kind](path)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        fast = cache.load(f, args)
        out = fast(*args)
    assert str(path) in _one_warning(rec, cache.CacheWarning)
    assert fast.plan is not None and not fast.plan.steps[0].store.records
    assert torch.allclose(out, f(*args), atol=1e-6)
    monkeypatch.setenv("AUTOFUSE_STRICT", "1")
    settings.reload_settings()
    with pytest.raises(cache.CacheMiss, match="binary"):
        cache.load(f, args, strict=True)


def test_a_binary_for_another_build_is_recompiled_or_refused(with_binary, monkeypatch):
    args, key, plan, path = with_binary
    store = cache.load_plan(None, key).steps[0].store
    monkeypatch.setattr(binaries, "current_build", lambda: {"capability": [8, 0],
                        "torch": torch.__version__, "triton": binaries.triton_version()})  # fmt: skip
    align = (True, True, True, True)
    with pytest.warns(cache.CacheWarning, match="capability"):
        assert store.restore(object(), align) is None  # loose: compile from source instead
    monkeypatch.setenv("AUTOFUSE_STRICT", "1")
    settings.reload_settings()
    store = cache.load_plan(None, key).steps[0].store
    with pytest.raises(binaries.BinaryMismatch, match="capability"):
        store.restore(object(), align)


@pytest.mark.gpu
@plain_build
def test_a_fresh_process_launches_the_stored_binary(home, tmp_path):
    import subprocess
    import sys
    import textwrap

    args = tuple(torch.randn(33, 17, device="cuda") for _ in range(2))
    fn_src = "def g(x, w):\n    return torch.tanh(x * w) * 1.2345\n"
    space = {"torch": torch}
    exec(fn_src, space)
    captured, plan = _plan(space["g"], args)
    cache.save_plan(None, cache.key_for(captured, args), plan, {"function": "g"})
    fast = cache.load(space["g"], args, strict=True)
    want = fast(*args)  # compiles, and stores the binary in the entry
    assert list((home / "plans").glob("*/bin/*.json"))
    torch.save(args, tmp_path / "in.pt")
    script = textwrap.dedent(f"""
        import torch, warnings
        warnings.simplefilter("error")
        from autofuse import cache
        from autofuse.plan import launcher
        {fn_src.replace(chr(10), chr(10) + "        ")}
        args = torch.load({str(tmp_path / "in.pt")!r})
        out = cache.load(g, args, strict=True)(*args)
        torch.save(out.cpu(), {str(tmp_path / "out.pt")!r})
        print(launcher.stats())
    """)
    env = {**os.environ, "AUTOFUSE_CACHE_DIR": str(home), "PYTHONPATH": str(Path(__file__).parents[1]),
           "TRITON_CACHE_DIR": str(tmp_path / "empty-triton-cache")}  # fmt: skip
    env.pop("AUTOFUSE_KERNEL_DIR", None)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "'restored': 1" in r.stdout, r.stdout
    assert torch.equal(torch.load(tmp_path / "out.pt"), want.cpu())


def test_a_binary_whose_signature_is_out_of_order_is_not_launched(with_binary):
    """A record whose parameters come back in another order (e.g. sorted by name) would pack
    the launch arguments wrongly: it is refused before anything is built from it."""
    args, key, plan, path = with_binary
    rec = binaries.read_binary(path, json.loads(path.read_text())["payload"]["source_sha256"])
    fn = type("F", (), {"arg_names": ["n", "x"]})()
    with pytest.raises(ValueError, match="in order"):
        binaries.compiled_from_record(fn, rec)
