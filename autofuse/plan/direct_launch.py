"""Launch a compiled Triton kernel with one C++ call: torch's static CUDA launcher.

Triton's own launch of a compiled kernel (``CompiledKernel[grid](*args)``) runs three Python
layers per call: the grid closure (current device and stream, launch metadata for hooks), the
CUDA launcher object (scratch allocation) and then its C extension. torch ships the launcher
Inductor uses for the same binaries (``torch._C._StaticCudaLauncher``): one C++ call that reads
the tensors' pointers and calls ``cuLaunchKernel`` on the function Triton already loaded. The
plan's kernels have fixed grids, warps and shared memory, so everything but the buffers and the
stream is bound once here.

A kernel this path cannot launch exactly as Triton would (scratch memory, several CTAs per
cluster, programmatic dependent launch, host TMA descriptors, launch hooks installed by a
profiler, an argument type outside the table) keeps Triton's launch: ``bind`` returns None.

A binary restored from a cache entry has not been loaded on the device yet. Triton's own first
launch of it (``CompiledKernel[grid]``) builds Triton's launcher for the kernel's signature,
which some Triton versions do by compiling a C extension (a host compiler run per new
signature, the bulk of a new process's first call); this path needs only the loaded function,
so it loads the binary itself through Triton's driver utilities (``load_function``) and never
builds that launcher.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

# Triton's argument types -> the one-letter codes the static launcher switches on
_TYPES = {
    "i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l",
    "u1": "I", "u8": "B", "u16": "H", "u32": "I", "u64": "K",
    "fp16": "f", "bf16": "f", "fp32": "f", "f32": "f", "fp64": "d",
}  # fmt: skip


def _launcher() -> Any:
    return getattr(torch._C, "_StaticCudaLauncher", None)


def _hooks_empty() -> bool:
    try:
        from triton import knobs
    except ImportError:  # an older Triton: no knobs, no hooks to respect here
        return False
    for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if hook is not None and len(getattr(hook, "calls", (hook,))) > 0:
            return False
    return True


def _index(src: Any, key: Any) -> int:
    if isinstance(key, str):
        return list(src.fn.arg_names).index(key)
    return key[0] if isinstance(key, tuple) else int(key)


def _arg_types(compiled: Any, n_args: int) -> tuple[list[int], str] | None:
    """The positions among the first ``n_args`` parameters the binary takes (Triton folds
    constexprs and arguments it specialized, e.g. an int equal to 1, into the binary) and
    their type codes; None for a type the launcher has no code for."""
    src = compiled.src
    signature = {_index(src, k): v for k, v in src.signature.items()}
    folded = {_index(src, k) for k in getattr(src, "constants", {}) or {}}
    keep, codes = [], []
    for i in range(n_args):
        ty = signature.get(i)
        if ty is None or ty == "constexpr" or i in folded:
            continue
        code = "O" if ty.startswith("*") else _TYPES.get(ty)
        if code is None:
            return None
        keep.append(i)
        codes.append(code)
    return keep, "".join(codes)


def _scratch_slots(md: Any) -> int | None:
    """Extra null pointer parameters Triton appends (global and profile scratch); None when a
    kernel really uses scratch memory (Triton allocates it per launch)."""
    n = 0
    for name in ("global_scratch_size", "profile_scratch_size"):
        if hasattr(md, name):
            if getattr(md, name) > 0:
                return None
            n += 1
    return n


def _driver_utils() -> Any:
    from triton.runtime import driver

    return driver.active.utils


_MAX_SHARED: dict[int, int] = {}


def load_function(compiled: Any, device: int) -> int | None:
    """The CUDA function of ``compiled``'s binary, loaded on ``device`` through Triton's driver
    utilities (what ``CompiledKernel`` does on its first launch, without building Triton's
    launcher); None where the binary does not fit the device (Triton's own launch then raises
    its error). The module stays loaded for the life of the process, like Triton's."""
    utils = _driver_utils()
    md = compiled.metadata
    shared = int(md.shared)
    if device not in _MAX_SHARED:
        _MAX_SHARED[device] = int(utils.get_device_properties(device)["max_shared_mem"])
    if shared > _MAX_SHARED[device]:
        return None
    loaded = utils.load_binary(compiled.name, compiled.kernel, shared, device)
    function = loaded[1]
    max_threads = loaded[4] if len(loaded) > 4 else None
    if max_threads is not None and int(md.num_warps) * getattr(md, "warp_size", 32) > max_threads:
        return None
    return function


def bind(
    compiled: Any, grid3: tuple[int, int, int], n_args: int, device: int
) -> Callable[[Sequence], None] | None:
    """A launch of ``compiled`` over ``grid3`` on CUDA device ``device`` taking the plan's
    runtime arguments (the first ``n_args`` parameters, constexprs left out), or None where
    Triton's launch must be kept. A binary not loaded yet is loaded here (``load_function``)."""
    impl = _launcher()
    try:
        md = compiled.metadata
        unsupported = (
            impl is None
            or getattr(md, "num_ctas", 1) != 1
            or getattr(md, "launch_pdl", False)
            or getattr(md, "launch_cooperative_grid", False)
            or getattr(md, "tensordesc_meta", None)
            or not _hooks_empty()
        )
        slots = None if unsupported else _scratch_slots(md)
        types = None if slots is None else _arg_types(compiled, n_args)
        if types is None:
            return None
        keep, codes = types
        warps, shared = int(md.num_warps), int(md.shared)
        function = getattr(compiled, "function", None) or load_function(compiled, device)
        if not function:
            return None
    except Exception:  # noqa: BLE001 - a CompiledKernel of a shape this path does not know
        return None
    codes += "O" * slots
    pad = (None,) * slots
    gx, gy, gz = grid3
    launch, stream = impl._launch_kernel, torch._C._cuda_getCurrentRawStream
    everything = keep == list(range(n_args))

    def run(args: Sequence) -> None:
        t = tuple(args) if everything else tuple(args[i] for i in keep)
        launch(function, gx, gy, gz, warps, shared, codes, t + pad, stream(device))

    return run
