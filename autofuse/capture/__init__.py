"""Capture: a PyTorch function -> its ATen graph (make_fx with autofuse's decompositions) -> IR."""

from autofuse.capture.decompositions import function_fixes
from autofuse.capture.trace import (
    Captured,
    CaptureError,
    TraceUnsupported,
    capture,
    decomposition_table,
    dtype_name,
    fx_to_ir,
)

__all__ = [
    "CaptureError",
    "Captured",
    "capture",
    "decomposition_table",
    "dtype_name",
    "function_fixes",
    "fx_to_ir",
    "TraceUnsupported",
]
