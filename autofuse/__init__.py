"""autofuse: a profiler-driven autotuning fusion explorer for PyTorch on NVIDIA GPUs."""

from .interpreter import select_for_machine as _select_for_machine

_select_for_machine()  # without CUDA: Triton's interpreter, before any kernel is defined

from .api import OptimizedFunction, explain, optimize  # noqa: E402
from .cache import CacheMiss, load  # noqa: E402
from .capture import CaptureError, capture  # noqa: E402
from .interpreter import InterpreterNote  # noqa: E402
from .kernels import FusionRefused, KernelConfig  # noqa: E402
from .plan import InputError, Plan  # noqa: E402
from .version import __version__  # noqa: E402

__all__ = [
    "CacheMiss",
    "CaptureError",
    "FusionRefused",
    "InputError",
    "InterpreterNote",
    "KernelConfig",
    "OptimizedFunction",
    "Plan",
    "__version__",
    "capture",
    "explain",
    "load",
    "optimize",
]

from . import logs as _logs  # noqa: E402

_logs.configure()

from .frontend import register as _register_backend  # noqa: E402

_register_backend()  # torch.compile(..., backend="autofuse"), without importing Dynamo now
