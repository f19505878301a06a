"""Production trust, the files: a signing key makes forged entries, call records and bundles
refused (a marker file never appears); a cache file that is a FIFO, a link to /dev/zero or a
zip bomb ends in a clear error within a second and bounded memory; every bad bundle manifest
shape is a one-line error. Tiny shapes through the interpreter on CPU."""

# ruff: noqa: E402

import os

import torch

if not torch.cuda.is_available():  # before triton is imported: kernels run in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import json
import resource
import struct
import threading
import time
import zipfile
from pathlib import Path

import pytest

from autofuse import cache, settings
from autofuse.cache import bundle, calls, trust
from autofuse.cache.codec import canonical_json, sha256_hex
from autofuse.capture.trace import capture
from autofuse.partition.partitioner import Partitioner
from autofuse.plan.runtime import build_plan
from tests.helpers import fresh_runtime

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
KEY = "k" * 32


def f(x, w):
    return torch.sigmoid(x * w) * 2.0


def g(x, w):
    return torch.tanh(x - w) * 3.0


def _args():
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(9, 7, generator=gen).to(DEVICE) for _ in range(2))


def _stored(fn=f):
    args = _args()
    captured = capture(fn, args)
    plan = build_plan(captured.graph, Partitioner(captured.graph).greedy().groups)
    key = cache.key_for(captured, args)
    cache.save_plan(None, key, plan, {"function": fn.__name__})
    calls.write_call(settings.cache_home(None), calls.call_key(fn, args), key, captured)
    return args, key, plan


def _with_key(monkeypatch, key=KEY):
    monkeypatch.setenv("AUTOFUSE_SIGNING_KEY", key)
    settings.reload_settings()


def _forge(entry: Path, marker: Path) -> None:
    """Edit the first kernel so that it leaves ``marker`` and recompute every digest."""
    doc = json.loads((entry / "plan.json").read_text())
    payload = doc["payload"]
    k = next(s["kernel"] for s in payload["steps"] if s["kind"] == "kernel")
    src = f"open({str(marker)!r}, 'w').write('ran')\n" + (entry / k["source_file"]).read_text()
    (entry / k["source_file"]).write_text(src)
    k["source_sha256"] = sha256_hex(src.encode())
    doc["payload_sha256"] = sha256_hex(canonical_json(payload))
    (entry / "plan.json").write_text(json.dumps(doc))


def test_the_signing_key_must_be_long_enough(home, monkeypatch):
    monkeypatch.setenv("AUTOFUSE_SIGNING_KEY", "short")
    with pytest.raises(ValueError, match="AUTOFUSE_SIGNING_KEY is 5 characters"):
        settings.reload_settings()
    _with_key(monkeypatch)
    assert KEY not in repr(settings.settings())


def test_a_forged_entry_never_runs_with_a_signing_key(home, tmp_path, monkeypatch):
    _with_key(monkeypatch)
    args, key, plan = _stored()
    assert json.loads((home / "plans" / key / "plan.json").read_text())["signature"]
    assert cache.load(f, args, strict=True).plan is not None  # signed: served
    marker = tmp_path / "marker"
    _forge(home / "plans" / key, marker)
    with monkeypatch.context() as m:  # without a key the digests agree: damage, not tampering
        m.delenv("AUTOFUSE_SIGNING_KEY")
        settings.reload_settings()
        assert cache.load_plan(None, key) is not None
    settings.reload_settings()
    fresh_runtime(monkeypatch)
    with pytest.raises(cache.CacheMiss):
        cache.load(f, args, strict=True)
    with pytest.warns(cache.CacheMissWarning, match="signature"):
        out = cache.load(f, args, retrace=True)(*args)
    assert torch.equal(out, f(*args)) and not marker.exists()


@pytest.mark.parametrize("when", ["unsigned", "another key"])
def test_entries_the_key_did_not_sign_are_refused(home, monkeypatch, when):
    if when == "another key":
        _with_key(monkeypatch, "another-key-of-16+")
    args, key, _ = _stored()
    _with_key(monkeypatch)
    with pytest.warns(cache.CacheWarning, match="signature|signed"):
        assert cache.load_plan(None, key) is None
    assert calls.read_call(home, calls.call_key(f, args)) is None  # the record too: capture


def test_a_call_record_under_another_functions_key_is_refused(home, monkeypatch):
    args, _, _ = _stored(f)
    _stored(g)
    cf, cg = calls.call_key(f, args), calls.call_key(g, args)
    (home / "calls" / f"{cg}.json").write_bytes((home / "calls" / f"{cf}.json").read_bytes())
    fresh_runtime(monkeypatch)
    assert calls.read_call(home, cg) is None
    torch.testing.assert_close(cache.load(g, args, strict=True)(*args), g(*args))


def test_binaries_are_signed_and_checked(home, tmp_path, monkeypatch):
    from autofuse.cache import binaries

    rec = {"source_sha256": "s", "binary_b64": "AA==", "binary_sha256": sha256_hex(b"\0")}
    binaries.write_binary(tmp_path / "unsigned.json", rec)
    _with_key(monkeypatch)
    binaries.write_binary(tmp_path / "signed.json", rec)
    assert binaries.read_binary(tmp_path / "signed.json", "s") == rec
    with pytest.raises(ValueError, match="not signed"):
        binaries.read_binary(tmp_path / "unsigned.json", "s")


def _forge_bundle(out: Path, marker: Path) -> None:
    """Edit a kernel in the bundle and recompute every digest (entry, files, manifest)."""
    with zipfile.ZipFile(out) as z:
        files = {n: z.read(n) for n in z.namelist()}
    plan_name = next(n for n in files if n.endswith("plan.json"))
    entry = out.parent / "unpacked"
    entry.mkdir()
    prefix = plan_name.rsplit("/", 1)[0]
    for n, d in files.items():
        if n.startswith(prefix + "/") and "/" not in n[len(prefix) + 1 :]:
            (entry / n[len(prefix) + 1 :]).write_bytes(d)
    _forge(entry, marker)
    m = json.loads(files["manifest.json"])
    key = prefix.split("/")[1]
    for p in entry.iterdir():
        files[f"{prefix}/{p.name}"] = p.read_bytes()
        m["entries"][key]["files"][p.name] = sha256_hex(p.read_bytes())
    m.pop("manifest_hmac", None)
    m.pop("manifest_sha256")
    m["manifest_sha256"] = sha256_hex(canonical_json(m))
    files["manifest.json"] = json.dumps(m).encode()
    with zipfile.ZipFile(out, "w") as z:
        for n, d in files.items():
            z.writestr(n, d)


def test_a_forged_bundle_is_refused_with_a_signing_key(home, tmp_path, monkeypatch):
    _with_key(monkeypatch)
    args, key, _ = _stored()
    good = tmp_path / "good.afz"
    bundle.export_bundle(good, None, None)
    assert bundle.import_bundle(good, tmp_path / "a") == [(key, key)]
    forged = tmp_path / "forged" / "b.afz"
    forged.parent.mkdir()
    bundle.export_bundle(forged, None, None)
    marker = tmp_path / "marker"
    _forge_bundle(forged, marker)
    with pytest.raises(bundle.BundleError, match="manifest is not signed"):
        bundle.import_bundle(forged, tmp_path / "b")
    monkeypatch.delenv("AUTOFUSE_SIGNING_KEY")
    settings.reload_settings()
    bundle.export_bundle(tmp_path / "unsigned.afz", None, None)
    _with_key(monkeypatch)
    with pytest.raises(bundle.BundleError, match="not signed"):
        bundle.import_bundle(tmp_path / "unsigned.afz", tmp_path / "c")
    assert cache.list_entries(tmp_path / "b") == [] and not marker.exists()


# ---------------------------------------------------------------------------------------------
# Bounded readers
# ---------------------------------------------------------------------------------------------


def _bounded(fn, seconds=1.0):
    """Run ``fn`` in a thread: it must end within ``seconds``, growing memory by < 64 MB."""
    result: dict = {}
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def run():
        try:
            result["value"] = fn()
        except Exception as e:  # noqa: BLE001 - the test inspects it
            result["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t0 = time.perf_counter()
    t.start()
    t.join(seconds + 5)
    assert not t.is_alive(), "still reading"
    assert time.perf_counter() - t0 < seconds
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB
    return result


def _replace(path: Path, how: str) -> None:
    path.unlink()
    if how == "fifo":
        os.mkfifo(path)
    elif how == "dev_zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()


@pytest.mark.parametrize("how", ["fifo", "dev_zero", "folder"])
@pytest.mark.parametrize("file", ["call", "plan.json", "kernel"])
def test_a_cache_file_that_is_no_regular_file_ends_in_a_clear_error(home, how, file):
    args, key, plan = _stored()
    entry = home / "plans" / key
    target = {"call": home / "calls" / f"{calls.call_key(f, args)}.json",
              "plan.json": entry / "plan.json",
              "kernel": next(entry.glob("*.py"))}[file]  # fmt: skip
    _replace(target, how)
    if file == "call":
        assert _bounded(lambda: calls.read_call(home, calls.call_key(f, args)))["value"] is None
        return
    with pytest.warns(cache.CacheWarning) as rec:
        got = _bounded(lambda: cache.load_plan(None, key))
    assert got["value"] is None and target.name in str(rec[0].message)
    assert "regular file" in str(rec[0].message) or "link" in str(rec[0].message)


def test_read_bounded_refuses_what_is_too_large(tmp_path):
    p = tmp_path / "big"
    p.write_bytes(b"x" * 101)
    with pytest.raises(trust.UnsafeFile, match="101 bytes, over the 100-byte limit"):
        trust.read_bounded(p, 100)
    assert trust.read_bounded(p, 101) == b"x" * 101


def _bomb(path: Path, size: int, declared: int | None = None) -> None:
    """A zip whose member unpacks to ``size`` zero bytes (its headers saying ``declared``)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("manifest.json", "{}")
        with z.open("plans/x/plan.json", "w") as w:
            chunk = bytes(1 << 20)
            for _ in range(size >> 20):
                w.write(chunk)
    if declared is not None:  # lie in both headers: the stored size says `declared`
        data = bytearray(path.read_bytes())
        for sig, off in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
            at = data.find(sig + b"", data.find(sig) if sig == b"PK\x01\x02" else 0)
            while at >= 0:
                name_at = at + (30 if sig == b"PK\x03\x04" else 46)
                if data[name_at : name_at + 17] == b"plans/x/plan.json":
                    struct.pack_into("<I", data, at + off, declared)
                at = data.find(sig, at + 4)
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("lie", [False, True])
def test_a_zip_bomb_ends_in_a_clear_error(tmp_path, monkeypatch, lie):
    monkeypatch.setattr(bundle, "MEMBER_LIMIT", 1 << 20)
    out = tmp_path / "bomb.afz"
    _bomb(out, 8 << 20, declared=1000 if lie else None)
    assert out.stat().st_size < 64 << 10
    got = _bounded(lambda: bundle.read_bundle(out))
    assert isinstance(got.get("error"), bundle.BundleError), got
    assert "corrupted" in str(got["error"])
    assert ("CRC" if lie else "over the limits") in str(got["error"])


def test_a_bundle_that_is_a_fifo_ends_in_a_clear_error(tmp_path):
    os.mkfifo(tmp_path / "b.afz")
    got = _bounded(lambda: bundle.read_bundle(tmp_path / "b.afz"))
    assert "regular file" in str(got["error"])


def _manifest_bundle(path: Path, change) -> None:
    m = {"autofuse_bundle": bundle.BUNDLE_FORMAT, "provenance": {},
         "entries": {KEY: {"files": {"plan.json": sha256_hex(b"{}")}, "build": {}}}}  # fmt: skip
    files = {f"plans/{KEY}/plan.json": b"{}"}
    change(m, files)
    m["manifest_sha256"] = sha256_hex(canonical_json(m))
    with zipfile.ZipFile(path, "w") as z:
        for n, d in files.items():
            z.writestr(n, d)
        z.writestr("manifest.json", json.dumps(m))


def _both(m, files):
    m["entries"][KEY]["files"]["plan.json/x"] = sha256_hex(b"")
    files[f"plans/{KEY}/plan.json/x"] = b""


SHAPES = {
    "entries a list": lambda m, f: m.update(entries=[KEY]),
    "entries null": lambda m, f: m.update(entries=None),
    "entries missing": lambda m, f: m.pop("entries"),
    "entry null": lambda m, f: m["entries"].update({KEY: None}),
    "files a list": lambda m, f: m["entries"][KEY].update(files=["plan.json"]),
    "files missing": lambda m, f: m["entries"][KEY].pop("files"),
    "digest null": lambda m, f: m["entries"][KEY]["files"].update({"plan.json": None}),
    "build a list": lambda m, f: m["entries"][KEY].update(build=[]),
    "a and a/b": _both,
    "key ../x": lambda m, f: m["entries"].update({"../x": m["entries"].pop(KEY)}),
    "key /etc": lambda m, f: m["entries"].update({"/etc": m["entries"].pop(KEY)}),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_bad_manifest_shape_is_a_one_line_error(tmp_path, shape):
    out = tmp_path / "b.afz"
    _manifest_bundle(out, SHAPES[shape])
    with pytest.raises(bundle.BundleError, match="corrupted") as e:
        bundle.import_bundle(out, tmp_path / "dst")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "dst").exists()
