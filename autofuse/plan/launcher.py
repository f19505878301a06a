"""A lean launch path for generated kernels.

``fn[grid](*args, **meta)`` on a ``triton.jit`` function binds every argument, computes its
specialization key and looks the binary up on each call. A plan's kernels are launched with the
same shapes, dtypes and meta-parameters every time; only the buffers change. So the first call
goes through Triton (which compiles and specializes), and later calls reuse the compiled binary
straight through its own launcher (``CompiledKernel[grid](*args)``), as long as what Triton
specialized on still holds. Triton specializes tensor arguments on 16-byte alignment; the lean
path keys its binaries on that, so a misaligned buffer gets (and keeps) its own binary. On the
H200 host a one-kernel plan took 31.0 us per call this way and 35.2 us through ``JITFunction``
(results/h200/host_overhead_5af5d14.json).

A plan decoded from a cache entry carries the entry's binaries (``store``): the first launch
for a given alignment uses the verified stored binary when there is one (no compile), and a
first compile stores its binary there (``autofuse/cache/binaries.py``).

Off under Triton's interpreter, on CPU tensors, with ``AUTOFUSE_LEAN_LAUNCH=0``, and for any
kernel whose first launch returns something that is not a compiled kernel (other Triton
versions): those take the regular path every time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from autofuse.interpreter import interpreting
from autofuse.settings import settings

_STATS = {"lean": 0, "regular": 0, "restored": 0}


def lean_enabled() -> bool:
    return settings().lean_launch and not interpreting()


class Launcher:
    """Launches one jitted kernel on one grid with fixed meta-parameters."""

    def __init__(
        self,
        fn: Any,
        grid: tuple[int, ...],
        meta: dict[str, Any],
        scratch: bool = False,
        store: Any = None,
    ) -> None:
        self.fn, self.meta = fn, dict(meta)
        self.scratch = scratch  # builds TMA descriptors on the device: needs an allocator
        self.grid = tuple(grid)
        self.grid3 = (*self.grid, 1, 1)[:3]
        names = list(getattr(fn, "arg_names", None) or [])
        self.const_names = [n for n in names if n in self.meta]
        self.consts = [self.meta[n] for n in self.const_names]  # constexprs, signature order
        self.n_params = len(names)
        self.binaries: dict[tuple[bool, ...], Any] = {}
        self.compiled: dict[tuple[bool, ...], Any] = {}  # Triton's CompiledKernel per key
        self.lean = lean_enabled() and bool(names)
        # a cache entry's binaries (cache/binaries.py): restore(fn, key) -> CompiledKernel|None
        # and save(key, compiled) after a first compile
        self.store = store

    def __call__(self, args: Sequence[Any]) -> None:
        if self.scratch:
            ensure_allocator()
        if not self.lean or not args or not _on_cuda(args):
            _STATS["regular"] += 1
            self.fn[self.grid](*args, **self.meta)
            return
        key = tuple(a.data_ptr() % 16 == 0 for a in args if isinstance(a, torch.Tensor))
        run = self.binaries.get(key)
        if run is not None:
            _STATS["lean"] += 1
            run(*args, *self.consts)
            return
        if self.store is not None and self._restore(key, args):
            return
        _STATS["regular"] += 1
        compiled = self.fn[self.grid](*args, **self.meta)
        self._keep(key, compiled, len(args))
        if self.store is not None and key in self.binaries:
            self.store.save(key, compiled)

    def _restore(self, key: tuple[bool, ...], args: Sequence[Any]) -> bool:
        """Launch a stored, verified binary instead of compiling (True when it ran)."""
        if len(args) + len(self.const_names) != self.n_params:
            return False
        compiled = self.store.restore(self.fn, key)
        if compiled is None:
            return False
        try:
            run = compiled[self.grid3]  # loads the binary on the device
        except Exception:  # noqa: BLE001 - e.g. a binary the driver refuses: compile instead
            if settings().strict:
                raise
            return False
        run(*args, *self.consts)
        self.binaries[key] = run
        _STATS["restored"] += 1
        return True

    def attach(self, store: Any) -> None:
        """A cache entry's binary store, for a launcher that may have compiled already (during
        tuning, before the entry existed): what it compiled goes into the entry now."""
        self.store = store
        for key, compiled in self.compiled.items():
            if key not in store.records:
                store.save(key, compiled)

    def _keep(self, key: tuple[bool, ...], compiled: Any, n_args: int) -> None:
        if n_args + len(self.const_names) != self.n_params or not hasattr(compiled, "function"):
            self.lean = False  # not a shape of Triton this path knows: stay on the regular one
            return
        try:
            self.binaries[key] = compiled[self.grid3]
            self.compiled[key] = compiled
        except Exception:  # noqa: BLE001 - an unknown CompiledKernel API: regular path
            self.lean = False


def _scratch(size: int, alignment: int, stream: Any) -> torch.Tensor:
    device = "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"
    return torch.empty(size, dtype=torch.int8, device=device)


def ensure_allocator() -> None:
    """Kernels that make TMA descriptors on the device take scratch memory from the allocator
    of ``triton.set_allocator``; set one (torch's caching allocator) where none is set in this
    thread's context, and leave a user's own allocator alone."""
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        _allocation.set_allocator(_scratch)


def _on_cuda(args: Sequence[Any]) -> bool:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.is_cuda
    return False


def stats() -> dict[str, int]:
    """How many launches took the lean and the regular path (tests read it)."""
    return dict(_STATS)
