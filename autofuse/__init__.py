"""autofuse: a profiler-driven autotuning fusion explorer for PyTorch on NVIDIA GPUs."""

from .api import OptimizedFunction, explain, optimize
from .cache import CacheMiss, load
from .capture import CaptureError, capture
from .kernels import FusionRefused, KernelConfig
from .plan import InputError, Plan

__all__ = [
    "CacheMiss",
    "CaptureError",
    "FusionRefused",
    "InputError",
    "KernelConfig",
    "OptimizedFunction",
    "Plan",
    "capture",
    "explain",
    "load",
    "optimize",
]
__version__ = "0.1.0"

from . import logs as _logs  # noqa: E402

_logs.configure()

from .frontend import register as _register_backend  # noqa: E402

_register_backend()  # torch.compile(..., backend="autofuse"), without importing Dynamo now
