"""Plan: kernel, library and eager steps in topological order, and running them."""

from autofuse.plan.runtime import (
    EagerStep,
    InputError,
    KernelBuildWarning,
    KernelStep,
    LibraryStep,
    Plan,
    build_plan,
    execute,
)

__all__ = [
    "EagerStep",
    "InputError",
    "KernelBuildWarning",
    "KernelStep",
    "LibraryStep",
    "Plan",
    "build_plan",
    "execute",
]
