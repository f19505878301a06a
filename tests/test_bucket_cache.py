"""Cache entries by shape bucket (``autofuse/cache/buckets.py``): ``optimize(..., dynamic=...,
trials=...)`` caches its plan by each dynamic dim's bucket, and ``autofuse.load`` in a new
process runs it at a size it never saw inside that bucket (strict), misses outside every
bucket, and bundles carry such entries. Tiny shapes, Triton's interpreter on CPU."""

import os

import torch

if not torch.cuda.is_available():  # before triton is imported: kernels run in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import json
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import autofuse
from autofuse import cache
from autofuse.cache.buckets import BucketNote, BucketSpec, bucket_key, bucket_specs, probe, varying
from autofuse.capture.trace import capture
from autofuse.cli import main

ROOT = Path(__file__).resolve().parents[1]
DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
W = 8  # the static width


def scaled_softmax(x, w):
    return torch.softmax(x * 2.0, -1) * w + 1.0


def _args(rows, dtype=torch.float32, width=W):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, width, generator=g, dtype=dtype)
    w = torch.randn(width, generator=g, dtype=dtype)
    return x.to(DEVICE), w.to(DEVICE)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A cache holding the plan tuned at 5 rows, dim 0 of ``x`` dynamic (bucket 5..8)."""
    root = tmp_path_factory.mktemp("bucket-cache")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the backend path's note: it tunes on CUDA alone
        opt = autofuse.optimize(scaled_softmax, _args(5), dynamic={"x": [0]}, trials=2,
                                cache_dir=root, progress=False)  # fmt: skip
    assert opt.bucket_entry is not None and opt.bucket_entry.tuning is not None
    (spec,) = bucket_specs(root, capture(scaled_softmax, _args(7)).graph)
    return root, spec


def _child(script: str, home: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOFUSE_CACHE_DIR": str(home)}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    return r.stdout.strip()


LOAD_SCRIPT = """
    import sys, warnings
    warnings.simplefilter("error")
    import torch
    import autofuse
    from autofuse import cache
    from autofuse.api import OptimizedFunction
    from tests.test_bucket_cache import _args, scaled_softmax
    for rows in (6, 7, 8):  # never seen, inside the bucket of 5
        args = _args(rows)
        fast = autofuse.load(scaled_softmax, args, strict=True)
        assert isinstance(fast, OptimizedFunction), fast
        assert fast.plan.graph.nodes[0].shape == (rows, 8), fast.plan.graph.nodes[0]
        torch.testing.assert_close(fast(*args), scaled_softmax(*args))
    try:
        autofuse.load(scaled_softmax, _args(9), strict=True)  # the next bucket: never tuned
        raise SystemExit("no CacheMiss at 9 rows")
    except autofuse.CacheMiss as e:
        assert "1 shape bucket(s) of its graph are cached" in str(e), e
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        eager = autofuse.load(scaled_softmax, _args(3))
    assert eager.plan is None and [w.category for w in caught] == [cache.CacheMissWarning]
    assert "optuna" not in sys.modules, "optuna was imported"
    assert "autofuse.tune.tuner" not in sys.modules, "the tuner was imported"
    print("OK", fast.cache_key)
"""


def test_load_at_an_unseen_size_of_a_bucket_in_a_new_process(tuned, tmp_path):
    root, spec = tuned
    home = tmp_path / "home"
    shutil.copytree(root, home)
    five = _args(5)
    key, _ = bucket_key(capture(scaled_softmax, five), five, spec)
    assert _child(LOAD_SCRIPT, home) == f"OK {key}"


def test_sizes_of_one_bucket_share_a_key_dtypes_and_static_sizes_do_not(tuned):
    _, spec = tuned

    def key(args):
        return bucket_key(capture(scaled_softmax, args), args, spec)[0]

    five, seven = _args(5), _args(7)
    assert cache.key_for(capture(scaled_softmax, five), five) != cache.key_for(
        capture(scaled_softmax, seven), seven
    )  # the exact keys hold the size
    assert key(five) == key(seven) == key(_args(8))
    assert key(_args(9)) != key(five)  # the next bucket
    assert key(_args(5, torch.float64)) != key(five)  # dtype
    assert key(_args(5, width=16)) != key(five)  # a static size
    x, w = _args(5)
    strided = (torch.empty(W, 5, device=DEVICE).t().copy_(x), w)  # another layout of x
    assert key(strided) != key(five)


def test_the_mask_hides_only_what_moves_with_the_dynamic_size():
    five = _args(5)
    dims = {0: (0,)}
    graph = capture(scaled_softmax, five).graph
    mask = varying(graph, capture(scaled_softmax, probe(five, dims)).graph)
    assert mask  # x's rows (and every shape that follows them)
    kept = [(i, n) for i, n in enumerate(graph.nodes) if n.shape == (W,)]
    assert kept and not any(i == j for i, _ in kept for j, _ in mask)  # w's width stays
    assert probe(_args(1), dims) is None  # size 1 is a bucket of its own: nothing to probe
    spec = BucketSpec(((0, (0,)),), None, mask)
    assert BucketSpec.from_json(spec.to_json()) == spec


def test_export_import_round_trip_of_a_bucket_entry(tuned, tmp_path):
    root, _ = tuned
    (key,) = [p.name for p in (root / "plans").iterdir()]
    out = tmp_path / "plans.afz"
    assert main(["cache", "export", key, "-o", str(out), "--cache-dir", str(root)]) == 0
    home = tmp_path / "home"
    assert main(["cache", "import", str(out), "--cache-dir", str(home)]) == 0
    assert list((home / "buckets").iterdir())  # the import wrote the bucket index
    assert _child(LOAD_SCRIPT, home) == f"OK {key}"


def test_a_size_of_the_bucket_tuned_again_reuses_the_entry(tuned, tmp_path):
    root, _ = tuned
    home = tmp_path / "home"
    shutil.copytree(root, home)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = autofuse.optimize(scaled_softmax, _args(7), dynamic={"x": [0]}, trials=2,
                                cache_dir=home, progress=False)  # fmt: skip
    assert opt.bucket_entry.tuning.cached  # the bucket's plan, built for 7 rows: no search
    assert len(list((home / "plans").iterdir())) == 1
    args = _args(7)
    torch.testing.assert_close(opt.bucket_entry(*args), scaled_softmax(*args))


TUNE_SPEC = """
import torch

def scaled_softmax(x, w):
    return torch.softmax(x * 2.0, -1) * w + 1.0

def inputs(device, rows=5):
    return torch.randn(rows, 8, device=device), torch.randn(8, device=device)

WORKLOADS = [{"name": "softmax", "fn": scaled_softmax, "inputs": inputs}]
"""


def test_a_spec_with_sizes_is_one_workload_per_size(tmp_path):
    from autofuse.tune.runfiles import SpecError, load_spec

    spec = tmp_path / "spec.py"
    spec.write_text(
        TUNE_SPEC.replace('"inputs": inputs}', '"inputs": inputs, "sizes": [5, 16, 5]}')
    )
    five, sixteen = load_spec(str(spec))
    assert (five.name, five.base, five.size, five.sizes) == ("softmax.5", "softmax", 5, (5, 16))
    assert sixteen.example("cpu")[0].shape == (16, 8)
    spec.write_text(
        TUNE_SPEC.replace('"inputs": inputs}', '"inputs": inputs, "dynamic": {0: [0]}}')
    )
    with pytest.raises(SpecError, match="'dynamic' needs 'sizes'"):
        load_spec(str(spec))


def test_autofuse_tune_over_sizes_caches_one_entry_per_bucket(tmp_path):
    (tmp_path / "spec.py").write_text(TUNE_SPEC)
    home = tmp_path / "home"
    env = dict(os.environ, PYTHONPATH=str(ROOT), AUTOFUSE_COMMIT="test",
               AUTOFUSE_CACHE_DIR=str(home))  # fmt: skip
    cmd = [sys.executable, "-m", "autofuse", "tune", "spec.py", "--sizes", "5,16", "--trials",
           "2", "--polish", "0", "--out", "runs", "--no-progress"]  # fmt: skip
    r = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    (folder,) = (tmp_path / "runs").iterdir()
    docs = [json.loads((folder / f"softmax.{n}.json").read_text()) for n in (5, 16)]
    assert [d["size"] for d in docs] == [5, 16] and all(d["complete"] for d in docs)
    assert docs[0]["bucket"]["dims"] == [[0, [0]]]  # found: the dims whose sizes differ
    assert len({d["cache_key"] for d in docs}) == 2 == len(list((home / "plans").iterdir()))
    for rows in (7, 13):  # 5..8 and 9..16: never tuned at these sizes
        args = _args(rows)
        fast = autofuse.load(scaled_softmax, args, cache_dir=home, strict=True)
        assert fast.cache_key == docs[rows > 8]["cache_key"]
        torch.testing.assert_close(fast(*args), scaled_softmax(*args))


def test_user_bucket_edges_and_two_dynamic_dims(tmp_path):
    """``buckets=[8, 64]``: 9 and 60 rows share the bucket 64; a reduced dim that is dynamic
    too (the softmax's width) is bucketed like the rows."""
    args = _args(5, width=6)
    dynamic = {"x": [0, 1], "w": [0]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        autofuse.optimize(scaled_softmax, args, dynamic=dynamic, trials=1, buckets=[8, 64],
                          cache_dir=tmp_path, progress=False)  # fmt: skip
    (spec,) = bucket_specs(tmp_path, capture(scaled_softmax, args).graph)
    assert spec.edges == (8, 64) and spec.dims == ((0, (0, 1)), (1, (0,)))
    for rows, width in ((7, 7), (2, 8), (8, 3)):
        x, w = _args(rows, width=width)
        fast = autofuse.load(scaled_softmax, (x, w), cache_dir=tmp_path, strict=True)
        torch.testing.assert_close(fast(x, w), scaled_softmax(x, w))
    with pytest.raises(cache.CacheMiss):
        autofuse.load(scaled_softmax, _args(5, width=9), cache_dir=tmp_path, strict=True)

    def key(rows):
        args = _args(rows)
        return bucket_key(capture(scaled_softmax, args), args, spec)[0]

    assert key(9) == key(60) != key(5)


def test_cache_list_show_name_the_bucket_and_clear_removes_the_index(tuned, tmp_path, capsys):
    root, _ = tuned
    home = tmp_path / "home"
    shutil.copytree(root, home)
    (key,) = [p.name for p in (home / "plans").iterdir()]
    assert main(["cache", "list", "--cache-dir", str(home)]) == 0
    assert main(["cache", "show", key[:8], "--cache-dir", str(home)]) == 0
    out = capsys.readouterr().out
    assert out.count("arg 0: float32['<=8', 8], arg 1: float32[8]") == 2, out
    assert main(["cache", "clear", "--cache-dir", str(home)]) == 0
    assert not (home / "buckets").exists() and not (home / "plans").exists()


def branches_on_rows(x):
    return x * 2.0 if x.shape[0] <= 5 else x + 2.0


def test_a_graph_that_changes_with_the_size_is_not_cached_by_bucket_and_says_so(tmp_path):
    with pytest.warns(BucketNote, match="changes with the dynamic sizes"):
        opt = autofuse.optimize(branches_on_rows, (torch.randn(5, 4, device=DEVICE),),
                                dynamic={"x": [0]}, trials=1, cache_dir=tmp_path, progress=False)  # fmt: skip
    assert opt.bucket_entry is None and not (tmp_path / "buckets").exists()
    x = torch.randn(7, 4, device=DEVICE)
    torch.testing.assert_close(opt(x), branches_on_rows(x))
    with pytest.raises(cache.CacheMiss):
        autofuse.load(branches_on_rows, (x,), cache_dir=tmp_path, strict=True)
