"""The lean launch path's bookkeeping, with a stand-in for a jitted kernel (the real path runs
only on CUDA; tests/test_gpu.py checks it there)."""

import torch

from autofuse.plan import launcher
from autofuse.plan.launcher import Launcher


class _Binary:
    function = object()  # what a compiled kernel has

    def __init__(self, log, key):
        self.log, self.key = log, key

    def __getitem__(self, grid):
        def run(*args, stream=None):
            self.log.append(("lean", self.key, grid, args))

        return run


class _Jit:
    def __init__(self, arg_names):
        self.arg_names = arg_names
        self.log = []

    def __getitem__(self, grid):
        def run(*args, **meta):
            key = tuple(a.data_ptr() % 16 == 0 for a in args if isinstance(a, torch.Tensor))
            self.log.append(("regular", key, grid, args, meta))
            return _Binary(self.log, key)

        return run


def _lean(monkeypatch):
    monkeypatch.setattr(launcher, "lean_enabled", lambda: True)
    monkeypatch.setattr(launcher, "_on_cuda", lambda args: True)


def test_second_call_reuses_the_binary_with_constexprs_in_signature_order(monkeypatch):
    _lean(monkeypatch)
    fn = _Jit(["in_ptr0", "out_ptr0", "xnumel", "XBLOCK", "RBLOCK"])
    run = Launcher(fn, (8,), {"RBLOCK": 4, "XBLOCK": 2, "num_warps": 4})
    x, y = torch.zeros(64), torch.zeros(64)
    run([x, y, 64])
    run([x, y, 64])
    kinds = [e[0] for e in fn.log]
    assert kinds == ["regular", "lean"]
    _, _, grid, args = fn.log[1]
    assert grid == (8, 1, 1)
    assert args[3:] == (2, 4)  # XBLOCK, RBLOCK: meta-parameters after the positional ones


def test_a_misaligned_buffer_gets_its_own_binary(monkeypatch):
    _lean(monkeypatch)
    fn = _Jit(["in_ptr0", "out_ptr0", "xnumel", "XBLOCK"])
    run = Launcher(fn, (1,), {"XBLOCK": 64})
    x, y = torch.zeros(64), torch.zeros(64)
    odd = torch.zeros(65)[1:]
    assert odd.data_ptr() % 16 != 0
    for args in ([x, y, 64], [odd, y, 64], [x, y, 64], [odd, y, 64]):
        run(args)
    assert [(e[0], e[1]) for e in fn.log] == [
        ("regular", (True, True)),
        ("regular", (False, True)),
        ("lean", (True, True)),
        ("lean", (False, True)),
    ]


def test_an_unknown_kernel_shape_stays_on_the_regular_path(monkeypatch):
    _lean(monkeypatch)
    fn = _Jit(["in_ptr0", "out_ptr0", "xnumel", "extra", "XBLOCK"])  # a parameter we never pass
    run = Launcher(fn, (1,), {"XBLOCK": 64})
    x = torch.zeros(64)
    for _ in range(3):
        run([x, x, 64])
    assert [e[0] for e in fn.log] == ["regular"] * 3


def test_off_on_cpu_tensors_and_under_the_interpreter():
    fn = _Jit(["in_ptr0", "XBLOCK"])
    run = Launcher(fn, (1,), {"XBLOCK": 64})
    for _ in range(2):
        run([torch.zeros(4)])
    assert [e[0] for e in fn.log] == ["regular", "regular"]


def test_a_store_attached_after_compiling_receives_the_binaries(monkeypatch):
    """Tuning compiles a kernel before its cache entry exists; when the entry's store is
    attached, what was compiled is saved there (else the first production load compiles)."""
    _lean(monkeypatch)
    fn = _Jit(["in_ptr0", "out_ptr0", "xnumel", "XBLOCK"])
    run = Launcher(fn, (1,), {"XBLOCK": 64})
    x, y = torch.zeros(64), torch.zeros(64)
    run([x, y, 64])

    class Store:
        records: dict = {}

        def __init__(self):
            self.saved = []

        def save(self, key, compiled):
            self.saved.append(key)

    store = Store()
    run.attach(store)
    assert store.saved == [(True, True)]
    store.records = {(True, True): {}}
    again = Store()
    again.records = {(True, True): {}}
    run.attach(again)  # already in the entry: not written again
    assert again.saved == []
