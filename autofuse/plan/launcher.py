"""A lean launch path for generated kernels.

``fn[grid](*args, **meta)`` on a ``triton.jit`` function binds every argument, computes its
specialization key and looks the binary up on each call. A plan's kernels are launched with the
same shapes, dtypes and meta-parameters every time; only the buffers change. So the first call
goes through Triton (which compiles and specializes), and later calls reuse the compiled binary
as long as what Triton specialized on still holds: through torch's static CUDA launcher, one C++
call (``direct_launch.py``), or Triton's own launch of the binary (``CompiledKernel[grid]``)
where that one cannot. Tensors are read once per launch, for their pointers, which are passed
as plain integers. Triton specializes tensor arguments on 16-byte alignment; the lean path keys
its binaries on that, so a misaligned buffer gets (and keeps) its own binary.
``experiments/bench/host_overhead.py`` measures each layer's cost per launch.

A plan decoded from a cache entry carries the entry's binaries (``store``): the first launch
for a given alignment uses the verified stored binary when there is one (no compile), and a
first compile stores its binary there (``autofuse/cache/binaries.py``).

Off under Triton's interpreter, on CPU tensors, with ``AUTOFUSE_LEAN_LAUNCH=0`` or
``AUTOFUSE_CHECK_BOUNDS=1``, and for any
kernel whose first launch returns something that is not a compiled kernel (other Triton
versions): those take the regular path every time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from autofuse.interpreter import interpreting
from autofuse.kernels.common.loader import load_kernel
from autofuse.plan.direct_launch import bind
from autofuse.settings import settings

_STATS = {"lean": 0, "regular": 0, "restored": 0, "direct": 0}


def lean_enabled() -> bool:
    s = settings()  # bounds-checked kernels take Triton's launch, which passes their extents
    return s.lean_launch and not s.check_bounds and not interpreting()


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
        self.slots: list[int] | None = None  # positions of tensor arguments, once known
        self.aligned: tuple[bool, ...] = ()
        # a cache entry's binaries (cache/binaries.py): restore(fn, key) -> CompiledKernel|None
        # and save(key, compiled) after a first compile
        self.store = store

    def __call__(self, args: Sequence[Any]) -> None:
        if 0 in self.grid:  # no program runs (an empty domain): nothing to build or launch; a
            return  # GPU build of such a kernel may fail where its empty blocks fold to scalars
        if self.scratch:
            ensure_allocator()
        slots = self.slots
        # the lean path, once a first launch has seen where the tensors go (CPU tensors take
        # Triton's launch, which says clearly that it cannot use them)
        if slots is not None and _on_cuda(args):
            vals, acc = list(args), 0
            for i in slots:
                vals[i] = p = args[i].data_ptr()  # launched as plain pointers: read once here
                acc |= p
            key = self.aligned if acc % 16 == 0 else tuple(vals[i] % 16 == 0 for i in slots)
            run = self.binaries.get(key)
            if run is not None:
                _STATS["lean"] += 1
                run(vals)
                return
        self._first(args)

    def _first(self, args: Sequence[Any]) -> None:
        """A launch the lean path has no binary for: through Triton (which compiles and
        specializes) or a stored binary, kept for the next launches with these alignments."""
        if not self.lean or not args or not _on_cuda(args):
            _STATS["regular"] += 1
            with _quiet_numpy(not (args and _on_cuda(args))):
                self.fn[self.grid](*args, **self.meta)
            return
        slots = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        key = tuple(args[i].data_ptr() % 16 == 0 for i in slots)
        if self.store is not None and self._restore(key, args):
            self.slots, self.aligned = slots, (True,) * len(slots)
            return
        _STATS["regular"] += 1
        compiled = self.fn[self.grid](*args, **self.meta)
        self._keep(key, compiled, args)
        if key in self.binaries:
            self.slots, self.aligned = slots, (True,) * len(slots)
            if self.store is not None:
                self.store.save(key, compiled)

    def _restore(self, key: tuple[bool, ...], args: Sequence[Any]) -> bool:
        """Launch a stored, verified binary instead of compiling (True when it ran)."""
        if len(args) + len(self.const_names) != self.n_params:
            return False
        compiled = self.store.restore(self.fn, key)
        if compiled is None:
            return False
        try:
            run = self._bind(compiled, args)  # loads the binary on the device
        except Exception:  # noqa: BLE001 - e.g. a binary the driver refuses: compile instead
            if settings().strict:
                raise
            return False
        run(args)
        self.binaries[key] = run
        _STATS["restored"] += 1
        return True

    def _bind(self, compiled: Any, args: Sequence[Any]) -> Callable[[Sequence[Any]], None]:
        """The launch kept for this binary: torch's static launcher where it can launch it
        (``direct_launch.py``, which loads a restored binary itself), else Triton's own launch
        of the compiled kernel."""
        device = next(a for a in args if isinstance(a, torch.Tensor)).device.index or 0
        direct = bind(compiled, self.grid3, len(args), device) if settings().direct_launch else None
        if direct is not None:
            _STATS["direct"] += 1
            return direct
        runner = compiled[self.grid3]  # Triton loads the binary and builds its launcher here
        consts = self.consts
        return lambda a: runner(*a, *consts)

    def attach(self, store: Any) -> None:
        """A cache entry's binary store, for a launcher that may have compiled already (during
        tuning, before the entry existed): what it compiled goes into the entry now."""
        self.store = store
        for key, compiled in self.compiled.items():
            if key not in store.records:
                store.save(key, compiled)

    def _keep(self, key: tuple[bool, ...], compiled: Any, args: Sequence[Any]) -> None:
        if len(args) + len(self.const_names) != self.n_params or not hasattr(compiled, "function"):
            self.lean = False  # not a shape of Triton this path knows: stay on the regular one
            return
        try:
            self.binaries[key] = self._bind(compiled, args)
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


@contextlib.contextmanager
def _quiet_numpy(on: bool) -> Any:
    """Triton's interpreter computes in numpy: ``x / 0`` gives inf and an all-NaN argmax its
    NaN's index as in eager, without numpy's ``RuntimeWarning`` (eager says nothing either)."""
    if not on:
        yield
        return
    import warnings

    import numpy as np

    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime")
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"numpy\.")
        yield


def _on_cuda(args: Sequence[Any]) -> bool:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.is_cuda
    return False


def stats() -> dict[str, int]:
    """How many launches took the lean and the regular path (tests read it)."""
    return dict(_STATS)


_LAUNCHERS: dict[tuple, Launcher] = {}


def launcher_for(kernel: Any, store: Any = None) -> Launcher:
    """The one launcher of ``kernel`` in this process (its source loaded on first use); a
    ``store`` (a cache entry's binaries) is attached to it where it has none yet."""
    key = (kernel.source, kernel.name, kernel.grid, kernel.launch_kw)
    hit = _LAUNCHERS.get(key)
    if hit is None:
        fn = load_kernel(kernel.source, kernel.name)
        scratch = kernel.meta.needs_allocator
        hit = _LAUNCHERS[key] = Launcher(fn, kernel.grid, dict(kernel.launch_kw), scratch, store)
    elif store is not None and hit.store is None:
        hit.attach(store)  # a plan from a cache entry: its binaries are used and kept there
    return hit
