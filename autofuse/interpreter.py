"""Workarounds for Triton's CPU interpreter (``TRITON_INTERPRET=1``), applied only there.

The interpreter stores bf16 as uint16 and its ``create_dot`` multiplies the raw bit patterns
(triton-lang/triton#11584), so a bf16 ``tl.dot`` returns garbage on CPU. The patch converts bf16
dot operands to fp32 first, which is what the GPU's bf16 MMA computes (exact products, fp32
accumulation). The interpreter also ignores ``tl.device_assert`` (it builds with debug off):
the second patch turns it on. A mask ``block_condition & scalar_condition`` (a gather's range
check on an index read once per program, e.g. of the program's batch) is typed int1 but holds
int32 data there, which its loads and stores refuse: the third patch reads such masks as bool,
and a comparison's result is typed int1 (typed as its float operands, a 0-d comparison
broadcast to a block became float32 data, which ``|`` with a bool block refused: fuzz seed 7,
graph 1918).
Its float32 -> bf16 cast truncates (999.9 becomes 996) where the GPU and torch round to nearest
even (1000): the fourth patch rounds. ``AUTOFUSE_CHECK_BOUNDS`` checks every access on top of
these (``autofuse/bounds.py``, installed by the kernel loader). Nothing changes on a GPU.
"""

from __future__ import annotations

import os
import warnings

_APPLIED = False


class InterpreterNote(UserWarning):
    """``import autofuse`` found no CUDA device and turned Triton's interpreter on."""


_SELECTED = {"by_autofuse": False, "noted": False}


def select_for_machine() -> bool:
    """Without CUDA, and where the user left ``TRITON_INTERPRET`` unset, turn Triton's CPU
    interpreter on; the first kernel loaded says so (one :class:`InterpreterNote`). Triton
    reads the variable at each kernel's definition and launch, so this holds even where Triton
    was imported first. Returns whether it set the variable."""
    if "TRITON_INTERPRET" in os.environ:
        return False
    import torch

    if torch.cuda.is_available():
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    _SELECTED["by_autofuse"] = True
    return True


def note_given() -> None:
    """The caller told the user itself (the CLI prints the device): no InterpreterNote."""
    _SELECTED["noted"] = True


def _note_selection() -> None:
    if _SELECTED["by_autofuse"] and not _SELECTED["noted"]:
        _SELECTED["noted"] = True
        warnings.warn(
            "autofuse: no CUDA device; generated kernels run on CPU in Triton's interpreter "
            "(TRITON_INTERPRET=1 set for this process; set the variable yourself to choose)",
            InterpreterNote,
            stacklevel=4,
        )


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def apply_patches() -> None:
    global _APPLIED
    if _APPLIED or not interpreting():
        return
    _note_selection()
    import triton.language as tl
    from triton.runtime import interpreter as interp

    _interpretable_language()
    _run_device_asserts(interp)
    _bool_masks(interp)
    _round_bf16_casts(interp)
    orig = interp.InterpreterBuilder.create_dot
    if getattr(orig, "_autofuse_patched", False):
        _APPLIED = True
        return

    def _up(h):
        if h.dtype.scalar == tl.bfloat16:
            return interp.TensorHandle(bf16_to_f32(h.data), tl.float32)
        return h

    def create_dot(self, a, b, d, *args, **kwargs):
        return orig(self, _up(a), _up(b), d, *args, **kwargs)

    create_dot._autofuse_patched = True
    interp.InterpreterBuilder.create_dot = create_dot
    _APPLIED = True


def _interpretable_language() -> None:
    """Triton decides at each ``@triton.jit`` whether the function is interpreted. Its own
    library functions (``tl.sum``, ``tl.max``, ``tl.cumsum``, ...) were decided when Triton was
    first imported: where a library imported Triton before autofuse switched the interpreter
    on (``import transformers`` first, on a machine without CUDA), they are compiled-mode
    functions that refuse to run in an interpreted kernel ("Cannot call @triton.jit'd outside
    of the scope of a kernel"). Rebuild each as the interpreter's function, in every loaded
    ``triton.language`` module and on the tensor class (their method forms)."""
    import sys

    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    done: dict[int, object] = {}

    def swap(owner, name: str, value) -> None:
        if isinstance(value, JITFunction) and not isinstance(value, InterpretedFunction):
            if id(value) not in done:
                done[id(value)] = InterpretedFunction(value.fn)
            setattr(owner, name, done[id(value)])

    mods = [m for n, m in list(sys.modules.items()) if n.startswith("triton.language") and m]
    for mod in mods:
        for name, value in list(vars(mod).items()):
            swap(mod, name, value)
    for name, value in list(vars(tl.core.tensor).items()):
        swap(tl.core.tensor, name, value)


def _run_device_asserts(interp) -> None:
    """The interpreter builds every kernel with ``debug=False``, so ``tl.device_assert`` (an
    out-of-range gather / embedding index) did nothing on CPU while a GPU kernel built with
    ``debug=True`` traps. Build interpreted kernels in debug mode too, without Triton's integer
    overflow checks (which debug mode would also turn on)."""
    import dataclasses

    init = interp.InterpreterBuilder.__init__
    if getattr(init, "_autofuse_patched", False):
        return

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.options = dataclasses.replace(self.options, debug=True, sanitize_overflow=False)

    __init__._autofuse_patched = True
    interp.InterpreterBuilder.__init__ = __init__
    shared = interp.interpreter_builder  # the instance every interpreted kernel uses
    shared.options = dataclasses.replace(shared.options, debug=True, sanitize_overflow=False)


def _bool_masks(interp) -> None:
    """Masked loads and stores read their mask's data as bool (int1 typed, int32 held: see the
    module docstring)."""
    import numpy as np
    import triton.language as tl

    cls = interp.InterpreterBuilder
    if getattr(cls.create_masked_load, "_autofuse_patched", False):
        return
    load, store = cls.create_masked_load, cls.create_masked_store

    def _bool(mask):
        if isinstance(mask, np.ndarray):  # Triton 3.6's descriptor loads pass a bare array
            return interp.TensorHandle(mask.astype(np.bool_, copy=False), tl.int1)
        if mask.data.dtype == np.bool_:
            return mask
        return interp.TensorHandle(mask.data != 0, mask.dtype)

    def create_masked_load(self, ptrs, mask, *args, **kwargs):
        return load(self, ptrs, _bool(mask), *args, **kwargs)

    def create_masked_store(self, ptrs, value, mask, *args, **kwargs):
        return store(self, ptrs, value, _bool(mask), *args, **kwargs)

    create_masked_load._autofuse_patched = True
    cls.create_masked_load = create_masked_load
    cls.create_masked_store = create_masked_store
    binary = cls.binary_op
    compares = {np.less, np.less_equal, np.greater, np.greater_equal, np.equal, np.not_equal}

    def binary_op(self, lhs, rhs, op):  # a comparison's handle typed int1, not as its operands
        out = binary(self, lhs, rhs, op)
        return interp.TensorHandle(out.data, tl.int1) if op in compares else out

    cls.binary_op = binary_op


def bf16_to_f32(bits):
    """bf16 values held as uint16 -> float32, exactly (subnormals included: the interpreter's
    own conversion turned the smallest ones into zeros or wrong values)."""
    import numpy as np

    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def _round_bf16_casts(interp) -> None:
    """float32 -> bf16 casts round to nearest even (ties to even; NaN stays a quiet NaN;
    overflow carries into infinity), as ``x.to(tl.bfloat16)`` does on the GPU; bf16 -> float32
    is exact."""
    import numpy as np
    import triton.language as tl

    orig = interp.InterpreterBuilder.cast_impl
    if getattr(orig, "_autofuse_patched", False):
        return

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.bfloat16 and dst_type.scalar == tl.float32:
            return interp.TensorHandle(bf16_to_f32(src.data), tl.float32)
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            u = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32).astype(np.uint64)
            rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
            nan = np.isnan(src.data)
            if np.any(nan):
                rounded[nan] = ((u[nan] >> 16) | 0x0040).astype(np.uint16)
            return interp.TensorHandle(rounded, tl.bfloat16)
        return orig(self, src, dst_type)

    cast_impl._autofuse_patched = True
    interp.InterpreterBuilder.cast_impl = cast_impl
