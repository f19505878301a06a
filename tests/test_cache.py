"""The plan cache: round trips, integrity, keys, atomic writes and the production ``load``."""

# ruff: noqa: E402

import os

import torch

if not torch.cuda.is_available():  # before triton is imported: kernels run in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import json
import math
import subprocess
import sys
import textwrap
import threading
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from autofuse import cache
from autofuse.capture.trace import capture
from autofuse.ir.graph import Graph, Node, contiguous_strides, make_attrs
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import EagerStep, InputError, KernelStep, Plan, build_plan, execute

from .helpers import assert_close
from .workloads import cases as cpu_cases
from .workloads import gemm_cases as cpu_gemm_cases

ROOT = Path(__file__).resolve().parents[1]
CPU = cache.DeviceInfo.current("cpu")
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"  # the GPU machine runs these on CUDA tensors
CHILD_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}  # keeps TRITON_INTERPRET as set here


def _to_device(table):
    return {
        k: (fn, tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args))
        for k, (fn, args) in table.items()
    }


def cases():
    return _to_device(cpu_cases())


def gemm_cases():
    return _to_device(cpu_gemm_cases())


def greedy_plan(fn, args):
    captured = capture(fn, args)
    plan = build_plan(captured.graph, Partitioner(captured.graph).greedy().groups, label="greedy")
    return captured, plan


def tensors(args):
    return [a for a in args if isinstance(a, torch.Tensor)]


def scaled(x, alpha):
    return torch.sigmoid(x * alpha)


# ---------------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------------

ROUND_TRIP = ["pointwise_example", "softmax", "layernorm", "masked_softmax_3d", "with_unsupported"]


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_round_trip(tmp_path, name):
    fn, args = cases()[name]
    captured, plan = greedy_plan(fn, args)
    key = cache.plan_key(captured, CPU, {})
    path = cache.save_plan(tmp_path, key, plan, {"function": fn.__name__})
    assert path == tmp_path / "plans" / key
    # readable kernels beside plan.json
    for k in plan.kernels:
        assert (path / f"{k.name}.py").read_text() == k.source
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = cache.load_plan(tmp_path, key)
    assert loaded == plan
    assert loaded.graph.key == plan.graph.key
    assert [n.name for n in loaded.graph.nodes] == [n.name for n in plan.graph.nodes]
    for a, b in zip(loaded.steps, plan.steps):
        assert type(a) is type(b) and a == b
        if isinstance(a, KernelStep):
            assert type(a.kernel.config) is type(b.kernel.config)
            assert a.kernel.info == b.kernel.info and a.kernel.layout == b.kernel.layout
    flat = tensors(args)
    got, want = execute(loaded, flat), execute(plan, flat)
    ref = fn(*args)
    ref = ref if isinstance(ref, tuple) else (ref,)
    for g, w, r in zip(got, want, ref):
        assert torch.equal(g, w)
        assert_close(g, r, torch.float32, name)
    if name == "with_unsupported":
        assert loaded.fallbacks and any(n.op == "opaque" for n in loaded.graph.nodes)
    if name == "masked_softmax_3d":
        consts = [v for n in loaded.graph.nodes for k, v in n.attrs if k == "value"]
        assert -math.inf in consts


def test_round_trip_gemm_config(tmp_path):
    fn, args = gemm_cases()["gemm_bias_gelu"]
    captured, plan = greedy_plan(fn, args)
    assert any(type(k.config).__name__ == "GemmConfig" for k in plan.kernels)
    key = cache.plan_key(captured, CPU, {})
    cache.save_plan(tmp_path, key, plan, {})
    loaded = cache.load_plan(tmp_path, key)
    assert loaded == plan
    assert_close(execute(loaded, tensors(args))[0], fn(*args), torch.float32)


def test_attrs_round_trip_nested_tuples_inf_nan(tmp_path):
    s = (4,)
    st = contiguous_strides(s)
    attrs = make_attrs(value=math.nan, lo=-math.inf, hi=math.inf, nested=((1, "a"), (None, True)))
    nodes = (
        Node("input", (), s, "float32", st, make_attrs(index=0), "x"),
        Node("const", (), (), "float32", (), attrs, "c"),
        Node("add", (0, 1), s, "float32", st, (), "y"),
    )
    graph = Graph(nodes, (0,), (2,))
    plan = Plan(graph, (EagerStep(2, "test"),), "hand-made")
    cache.save_plan(tmp_path, "k1", plan, {})
    loaded = cache.load_plan(tmp_path, "k1")
    c = loaded.graph[1]
    assert math.isnan(c.attr("value")) and c.attr("lo") == -math.inf and c.attr("hi") == math.inf
    assert c.attr("nested") == ((1, "a"), (None, True)) and isinstance(c.attr("nested"), tuple)
    assert loaded.graph.key == graph.key and loaded.steps == plan.steps
    assert loaded.graph[0] == graph[0] and loaded.graph[2] == graph[2]


def test_unserializable_attr_is_refused_at_save(tmp_path):
    s = (2,)
    nodes = (Node("input", (), s, "float32", (1,), make_attrs(index=0, bad=[1, 2]), "x"),)
    plan = Plan(Graph(nodes, (0,), (0,)), ())
    with pytest.raises(TypeError, match="bad"):
        cache.save_plan(tmp_path, "k", plan, {})
    assert cache.list_entries(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# Integrity
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def two_entries(tmp_path):
    saved = {}
    for name in ("pointwise_example", "softmax"):
        fn, args = cases()[name]
        captured, plan = greedy_plan(fn, args)
        key = cache.plan_key(captured, CPU, {})
        cache.save_plan(tmp_path, key, plan, {"function": name})
        saved[name] = (key, plan)
    return tmp_path, saved


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _corrupt_payload_value(path: Path) -> None:
    text = path.read_text()
    i = text.index('"reads:') if '"reads:' in text else text.index('"dtype": "float32"')
    path.write_text(text[:i] + text[i:].replace("float32", "float64", 1))


CORRUPTIONS = {
    "flipped_byte": lambda e, k: _flip(e / "plan.json", len((e / "plan.json").read_bytes()) // 2),
    "edited_value": lambda e, k: _corrupt_payload_value(e / "plan.json"),
    "garbage_json": lambda e, k: (e / "plan.json").write_bytes(b"\x00\xffnot json{{{"),
    "truncated_json": lambda e, k: (e / "plan.json").write_bytes(
        (e / "plan.json").read_bytes()[:100]
    ),
    "truncated_kernel": lambda e, k: (e / k).write_bytes((e / k).read_bytes()[:50]),
    "missing_kernel": lambda e, k: (e / k).unlink(),
    "missing_plan": lambda e, k: (e / "plan.json").unlink(),
    "other_format": lambda e, k: (e / "plan.json").write_text(
        (e / "plan.json")
        .read_text()
        .replace(f'"autofuse_plan_cache": {cache.CACHE_FORMAT}', '"autofuse_plan_cache": 99')
    ),
}


@pytest.mark.parametrize("how", list(CORRUPTIONS))
def test_corrupt_entry_is_skipped(two_entries, how):
    root, saved = two_entries
    key, plan = saved["pointwise_example"]
    entry = root / "plans" / key
    CORRUPTIONS[how](entry, f"{plan.kernels[0].name}.py")
    with pytest.warns(cache.CacheWarning) as rec:
        assert cache.load_plan(root, key) is None
    (w,) = rec
    msg = str(w.message)
    assert key in msg and str(entry) in msg
    if "kernel" in how:
        assert plan.kernels[0].name in msg
    else:
        assert "plan.json" in msg
    if how == "other_format":
        assert "format 99" in msg
    # the other entry is unaffected
    other_key, other_plan = saved["softmax"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.load_plan(root, other_key) == other_plan
    listing = {e.key: e for e in cache.list_entries(root)}
    assert listing[other_key].ok and listing[other_key].function == "softmax"
    assert not listing[key].ok and listing[key].problem
    assert "CORRUPT" in str(listing[key])


def test_entry_under_the_wrong_key_is_refused(two_entries):
    root, saved = two_entries
    key, _ = saved["softmax"]
    os.rename(root / "plans" / key, root / "plans" / "renamed")
    with pytest.warns(cache.CacheWarning, match="not 'renamed'"):
        assert cache.load_plan(root, "renamed") is None


def test_miss_is_silent_and_listing(two_entries):
    root, saved = two_entries
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.load_plan(root, "0" * 32) is None
        assert cache.load_plan(root / "nowhere", "0" * 32) is None
        assert cache.list_entries(root / "nowhere") == []
    entries = cache.list_entries(root)
    assert {e.key for e in entries} == {k for k, _ in saved.values()}
    for e in entries:
        assert e.ok and e.kernels == 1 and e.created and e.function in saved
    with pytest.raises(ValueError, match="invalid cache key"):
        cache.save_plan(root, "../escape", saved["softmax"][1], {})


def test_metadata(tmp_path):
    fn, args = cases()["softmax"]
    captured, plan = greedy_plan(fn, args)
    cache.save_plan(tmp_path, "m", plan, {"function": "softmax", "times": {"k": (1e-6, "modeled")}})
    meta = cache.load_metadata(tmp_path, "m")
    assert meta["function"] == "softmax" and meta["times"] == {"k": [1e-6, "modeled"]}
    assert meta["torch"] == str(torch.__version__) and "triton" in meta and meta["created"] > 0
    doc = json.loads((tmp_path / "plans" / "m" / "plan.json").read_text())
    step = doc["payload"]["steps"][0]["kernel"]
    assert step["source_file"] == f"{plan.kernels[0].name}.py" and step["config"]["fields"]


# ---------------------------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------------------------


def test_key_is_stable_and_sensitive(monkeypatch):
    fn, args = cases()["pointwise_example"]
    x, w, b = args
    base = cache.plan_key(capture(fn, args), CPU, {})
    assert cache.plan_key(capture(fn, args), CPU, {}) == base  # traced twice
    assert cache.plan_key(capture(fn, (x * 2, w, b)), CPU, {}) == base  # values don't matter
    assert cache.plan_key(capture(fn, (x[:5], w, b[:5])), CPU, {}) != base  # shape
    assert cache.plan_key(capture(fn, [a.double() for a in args]), CPU, {}) != base  # dtype
    assert cache.plan_key(capture(fn, (x.t().contiguous().t(), w, b)), CPU, {}) != base  # strides
    assert cache.plan_key(capture(lambda x, w, b: torch.tanh(x * w + b), args), CPU, {}) != base
    gpu = cache.DeviceInfo("cuda", "NVIDIA H200", (9, 0))
    assert cache.plan_key(capture(fn, args), gpu, {}) != base
    assert cache.plan_key(capture(fn, args), CPU, {"allow_tf32": True}) != base
    assert cache.plan_key(capture(fn, args), CPU, {"trials": 50, "cache_dir": "x"}) == base
    assert cache.plan_key(capture(fn, args), CPU, None) == base
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert cache.plan_key(capture(fn, args), CPU, {}) != base


def test_key_scalars():
    x = torch.randn(4, 8, device=DEVICE)
    a, b = capture(scaled, (x, 2.0)), capture(scaled, (x, 3.0))
    assert cache.plan_key(a, CPU) != cache.plan_key(b, CPU)
    assert cache.plan_key(a, CPU) == cache.plan_key(capture(scaled, (x, 2.0)), CPU)
    # the specialized scalar values alone change the key (even with the same graph)
    assert cache.plan_key(a, CPU) != cache.plan_key(replace(a, scalars=(5.0,)), CPU)
    assert cache.plan_key(a, CPU) != cache.plan_key(replace(a, scalars=(2,)), CPU)  # 2 vs 2.0
    assert cache.plan_key(a, CPU) != cache.plan_key(replace(a, out_spec="other"), CPU)


def test_device_info():
    assert CPU == cache.DeviceInfo("cpu", "cpu-interpreter") and CPU.tag() == "cpu-interpreter"
    if not torch.cuda.is_available():
        assert cache.DeviceInfo.current() == CPU
    else:
        gpu = cache.DeviceInfo.current()
        assert gpu.kind == "cuda" and gpu.capability and gpu == cache.DeviceInfo.current("cuda:0")
        fn, args = cpu_cases()["softmax"]
        on_gpu = tuple(a.cuda() for a in args)
        assert cache.key_for(capture(fn, args), args) != cache.key_for(capture(fn, on_gpu), on_gpu)
    assert cache.DeviceInfo("cuda", "NVIDIA H200", (9, 0)).tag() == "NVIDIA H200 sm_90"


# ---------------------------------------------------------------------------------------------
# Atomic writes
# ---------------------------------------------------------------------------------------------


def test_killed_writer_leaves_no_entry(tmp_path, monkeypatch):
    fn, args = cases()["pointwise_example"]
    captured, plan = greedy_plan(fn, args)
    key = cache.plan_key(captured, CPU, {})
    monkeypatch.setattr(os, "replace", _crash)
    with pytest.raises(KeyboardInterrupt):
        cache.save_plan(tmp_path, key, plan, {})
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.load_plan(tmp_path, key) is None
    assert cache.list_entries(tmp_path) == []
    assert not (tmp_path / "plans" / key).exists()
    # a writer killed hard leaves its temp dir behind: it is never listed or loaded
    stale = tmp_path / "plans" / f".tmp-{key}-1-dead"
    stale.mkdir()
    (stale / "plan.json").write_text("{")
    assert cache.list_entries(tmp_path) == []
    cache.save_plan(tmp_path, key, plan, {})
    assert cache.load_plan(tmp_path, key) == plan
    assert [e.key for e in cache.list_entries(tmp_path)] == [key]


@pytest.mark.parametrize("swap", ["exchange", "move-aside"])
def test_overwrite_last_writer_wins(tmp_path, monkeypatch, swap):
    if swap == "move-aside":  # no atomic directory exchange on this OS / filesystem
        monkeypatch.setattr(cache.disk, "_renameat2", False)
    fn, args = cases()["softmax"]
    captured = capture(fn, args)
    graph = captured.graph
    groups = Partitioner(graph).greedy().groups
    space = _configs(graph, groups)
    first = build_plan(graph, groups, [space[0]])
    second = build_plan(graph, groups, [space[-1]])
    assert first != second
    cache.save_plan(tmp_path, "k", first, {})
    cache.save_plan(tmp_path, "k", second, {})
    assert cache.load_plan(tmp_path, "k") == second
    assert sorted(p.name for p in (tmp_path / "plans").iterdir()) == ["k"]
    # a writer killed while replacing an entry leaves the old one intact
    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(os, "replace", _crash)
        cache.save_plan(tmp_path, "k", first, {})
    assert cache.load_plan(tmp_path, "k") == second
    # threads replacing one entry while others read it: readers never see a corrupt entry
    plans, seen, errors = [first, second], [], []

    def write(n):
        try:
            for i in range(8):
                cache.save_plan(tmp_path, "k", plans[(n + i) % 2], {"n": n})
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def read():
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            for _ in range(30):
                seen.append(cache.load_plan(tmp_path, "k"))
        errors.extend(r.message for r in rec)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    threads += [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(p in (first, second) for p in seen if p is not None)
    if swap == "exchange" and cache.disk._exchange_supported():
        assert None not in seen  # the entry never disappears
    assert cache.load_plan(tmp_path, "k") in (first, second)
    assert sorted(p.name for p in (tmp_path / "plans").iterdir()) == ["k"]


def _crash(*a, **k):
    raise KeyboardInterrupt("killed between writing the temp entry and the rename")


def _configs(graph, groups):
    from autofuse.kernels import analyze_group, config_space

    return config_space(analyze_group(graph, groups[0]), graph)


def test_concurrent_writers(tmp_path):
    fn, args = cases()["softmax"]
    captured, plan = greedy_plan(fn, args)
    cache.save_plan(tmp_path, "k", plan, {})  # build the kernels once, here
    script = textwrap.dedent(
        f"""
        import sys
        from autofuse import cache
        plan = cache.load_plan({str(tmp_path)!r}, "k")
        for i in range(15):
            cache.save_plan({str(tmp_path)!r}, "k", plan, {{"writer": sys.argv[1], "i": i}})
        """
    )
    env = CHILD_ENV
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(n)], env=env, stderr=subprocess.PIPE)
        for n in range(3)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()[-3000:]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.load_plan(tmp_path, "k") == plan
    assert cache.load_metadata(tmp_path, "k")["i"] == 14
    assert [e.key for e in cache.list_entries(tmp_path)] == ["k"]
    assert sorted(p.name for p in (tmp_path / "plans").iterdir()) == ["k"]


# ---------------------------------------------------------------------------------------------
# load(): the production entry point
# ---------------------------------------------------------------------------------------------


def test_load_miss_warns_once_and_runs_eager(tmp_path):
    fn, args = cases()["layernorm"]
    with pytest.warns(cache.CacheMissWarning) as rec:
        f1 = cache.load(fn, args, cache_dir=tmp_path)
        f2 = cache.load(fn, args, cache_dir=tmp_path)
    assert len(rec) == 1
    msg = str(rec[0].message)
    key = cache.key_for(capture(fn, args), args)
    assert "layernorm" in msg and key in msg and "autofuse.optimize" in msg
    assert f1.cache_key == key and f1.plan is None
    for f in (f1, f2):
        assert torch.equal(f(*args), fn(*args))
    with pytest.raises(cache.CacheMiss) as ei:
        cache.load(fn, args, cache_dir=tmp_path, strict=True)
    assert key in str(ei.value) and "layernorm" in str(ei.value) and str(tmp_path) in str(ei.value)


def test_load_corrupt_entry_falls_back(tmp_path):
    fn, args = cases()["softmax"]
    captured, plan = greedy_plan(fn, args)
    key = cache.key_for(captured, args)
    path = cache.save_plan(tmp_path, key, plan, {"function": "softmax"})
    (path / f"{plan.kernels[0].name}.py").write_text("garbage")
    with pytest.raises(cache.CacheMiss, match="sha256"):
        cache.load(fn, args, cache_dir=tmp_path, strict=True)
    with pytest.warns(cache.CacheMissWarning) as rec:
        f = cache.load(fn, args, cache_dir=tmp_path)
    assert len(rec) == 1 and plan.kernels[0].name in str(rec[0].message)
    assert torch.equal(f(*args), fn(*args))


def test_load_hit_and_wrong_inputs(tmp_path):
    fn, args = cases()["pointwise_example"]
    captured, plan = greedy_plan(fn, args)
    cache.save_plan(tmp_path, cache.key_for(captured, args), plan, {"function": fn.__name__})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt = cache.load(fn, args, cache_dir=tmp_path, strict=True)
    assert opt.plan == plan and opt.cache_metadata["function"] == fn.__name__
    assert_close(opt(*args), fn(*args), torch.float32)
    x, w, b = args
    name = plan.graph[plan.graph.inputs[0]].name
    with pytest.raises(InputError) as ei:
        opt(x[:8], w, b[:8])
    msg = str(ei.value)
    assert "input 0" in msg and name in msg and "[33, 17]" in msg and "[8, 17]" in msg
    with pytest.raises(InputError) as ei:
        opt(x, w.double(), b)
    msg = str(ei.value)
    assert "input 1" in msg and "float32[17]" in msg and "float64[17]" in msg


def test_load_hit_in_a_fresh_process_imports_no_optuna(tmp_path):
    fn, args = cases()["pointwise_example"]
    captured, plan = greedy_plan(fn, args)
    cache.save_plan(tmp_path, cache.key_for(captured, args), plan, {"function": fn.__name__})
    torch.save(args, tmp_path / "inputs.pt")
    script = textwrap.dedent(
        f"""
        import sys, warnings
        warnings.simplefilter("error")
        import torch
        from autofuse import cache
        from autofuse.api import OptimizedFunction
        from tests.workloads import pointwise_example
        args = torch.load({str(tmp_path / "inputs.pt")!r})
        opt = cache.load(pointwise_example, args, cache_dir={str(tmp_path)!r}, strict=True)
        assert isinstance(opt, OptimizedFunction), opt
        out = opt(*args)
        err = (out - pointwise_example(*args)).abs().max().item()
        assert err < 1e-5, err
        assert "optuna" not in sys.modules, "optuna was imported"
        assert "search" not in sys.modules, "the search was imported"
        assert "autofuse.tune.tuner" not in sys.modules, "the tuner was imported"
        print("OK", len(opt.plan.kernels))
        """
    )
    env = CHILD_ENV
    r = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180
    )
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    assert r.stdout.strip() == "OK 1"


def test_load_module_and_store(tmp_path):
    from autofuse.api import OptimizedFunction

    mod = torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.Sigmoid()).to(DEVICE)
    args = (torch.randn(4, 16, device=DEVICE),)
    captured, plan = greedy_plan(mod, args)
    path = cache.store(OptimizedFunction(captured, plan, mod), args, tmp_path)
    assert cache.load_metadata(tmp_path, path.name)["function"] == captured.source_name
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt = cache.load(mod, args, cache_dir=tmp_path, strict=True)
    with torch.no_grad():  # a cached plan has no backward: in grad mode it refuses the call
        assert_close(opt(*args), mod(*args).detach(), torch.float32)
    with pytest.raises(RuntimeError, match="requires grad"):
        opt(*args)
