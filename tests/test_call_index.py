"""autofuse.load reaches a cached plan from the call itself (autofuse/cache/calls.py): no
capture, no Dynamo import in a fresh process; a changed function, a constant the key cannot see
or a damaged index record go through capture as before."""

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import torch

import autofuse
from autofuse import cache
from autofuse.cache.calls import CALLS_DIR, call_key

ROOT = Path(__file__).resolve().parents[1]
DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


def rms(x, r, w):
    h = x + r
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w, h


def _args():
    torch.manual_seed(0)
    return tuple(torch.randn(*s, device=DEVICE) for s in ((6, 40), (6, 40), (40,)))


def _tune(tmp_path):
    args = _args()
    autofuse.optimize(rms, args, trials=2, cache_dir=str(tmp_path), progress=False)
    return args


def test_tuning_indexes_the_call_and_a_fresh_process_loads_it_without_capture(tmp_path):
    args = _tune(tmp_path)
    assert len(list((tmp_path / CALLS_DIR).glob("*.json"))) == 1
    torch.save(args, tmp_path / "in.pt")
    script = textwrap.dedent(f"""
        import sys, warnings
        warnings.simplefilter("error")
        import torch
        import autofuse
        import importlib
        trace = importlib.import_module("autofuse.capture.trace")
        from tests.test_call_index import rms
        def no_capture(*a, **k):
            raise AssertionError("load captured the function")
        trace.capture = no_capture
        args = torch.load({str(tmp_path / "in.pt")!r})
        fast = autofuse.load(rms, args, cache_dir={str(tmp_path)!r}, strict=True)
        out, h = fast(*args)
        want, _ = rms(*args)
        assert (out - want).abs().max().item() < 1e-4
        for m in ("torch._dynamo", "torch._inductor", "optuna"):
            assert m not in sys.modules, m + " was imported"
        print("OK", len(fast.plan.kernels))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert r.stdout.startswith("OK")


def test_the_call_key_sees_code_constants_inputs_and_grad_mode():
    args = _args()
    k = call_key(rms, args)
    assert k is not None and k == call_key(rms, args)

    def rms2(x, r, w):  # same name, another epsilon
        h = x + r
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * w, h

    rms2.__name__ = rms2.__qualname__ = "rms"
    assert call_key(rms2, args) != k
    assert call_key(rms, (args[0][:, :20].contiguous(), args[1][:, :20], args[2][:20])) != k
    assert call_key(rms, (args[0].t().contiguous().t(), *args[1:])) != k  # strides
    with torch.no_grad():
        assert call_key(rms, args) != k
    big = torch.randn(5000)
    assert call_key(lambda x: x + big, (args[0],)) is None  # a constant it cannot see into
    small = torch.randn(3)
    key_small = call_key(lambda x: x[:, :3] + small, (args[0],))
    small += 1
    assert key_small != call_key(lambda x: x[:, :3] + small, (args[0],))


def test_modules_are_keyed_by_class_config_mode_and_state_shapes():
    m = torch.nn.LayerNorm(40, eps=1e-5)
    x = (torch.randn(3, 40),)
    k = call_key(m, x)
    assert k is not None
    assert call_key(torch.nn.LayerNorm(40, eps=1e-3), x) != k
    m.eval()
    assert call_key(m, x) != k


def test_a_damaged_index_record_falls_back_to_capture(tmp_path):
    args = _tune(tmp_path)
    (rec,) = (tmp_path / CALLS_DIR).glob("*.json")
    doc = json.loads(rec.read_text())
    doc["payload"]["leaf_kinds"] = ["scalar"] * 3
    rec.write_text(json.dumps(doc))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fast = cache.load(rms, args, cache_dir=tmp_path, strict=True)
    out, _ = fast(*args)
    torch.testing.assert_close(out, rms(*args)[0], rtol=1e-4, atol=1e-4)
    # the capture path rewrote a good record
    assert json.loads(rec.read_text())["payload"]["leaf_kinds"] == ["tensor"] * 3


def test_a_module_config_object_is_part_of_the_key():
    class Cfg:
        def __init__(self, act):
            self.act = act

    class Block(torch.nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.cfg = cfg
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            y = self.lin(x)
            return torch.relu(y) if self.cfg.act == "relu" else torch.tanh(y)

    x = (torch.randn(2, 8),)
    assert call_key(Block(Cfg("relu")), x) != call_key(Block(Cfg("tanh")), x)
    assert call_key(Block(Cfg("relu")), x) == call_key(Block(Cfg("relu")), x)
