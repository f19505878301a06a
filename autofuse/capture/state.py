"""A module's buffers as the caller left them while autofuse builds a plan for it.

Capturing, verifying and timing a module in train mode runs its forward several times; each
run moves state such as BatchNorm's running statistics and ``num_batches_tracked``. Eager
would move them once per call the caller makes, so the buffers are restored afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


@contextmanager
def buffers_kept(fn: Any) -> Iterator[None]:
    """Run the block, then put ``fn``'s buffers (a module's) back to their values before it."""
    if not isinstance(fn, torch.nn.Module):
        yield
        return
    saved = [(b, b.detach().clone()) for b in fn.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, value in saved:
                if b.shape == value.shape:
                    b.copy_(value)


_COMPILE_MARKS = frozenset({"_is_torch_compile", "_compiled_call_impl"})  # torch.compile's own
_SIMPLE = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)


def _attr_state(v: Any) -> Any:
    """What is compared of one module attribute: a simple value itself; a dict of parameters,
    buffers, submodules or hooks by its items' identities; another object by identity and the
    simple values among its own attributes (a config object edited in place)."""
    if isinstance(v, _SIMPLE):
        return v
    if isinstance(v, dict):
        return tuple((k, id(x)) for k, x in v.items())
    own = getattr(v, "__dict__", None)
    if isinstance(own, dict) and not isinstance(v, torch.Tensor):
        return id(v), tuple((k, x) for k, x in own.items() if isinstance(x, _SIMPLE))
    return id(v)


class ModuleState:
    """What a plan captured from a module depends on: each submodule (by identity and path),
    its train/eval flag, its attributes, parameters, buffers and hooks. ``changed()`` names the
    first difference since capture (None: the plan still computes what the module would)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.snapshot = self._take()

    def _take(self) -> list[tuple[str, int, bool, dict[str, Any]]]:
        return [
            (
                name,
                id(sub),
                sub.training,
                {k: _attr_state(v) for k, v in vars(sub).items() if k not in _COMPILE_MARKS},
            )
            for name, sub in self.module.named_modules(remove_duplicate=False)
        ]

    def changed(self) -> str | None:
        now = self._take()
        if [(n, i) for n, i, _, _ in now] != [(n, i) for n, i, _, _ in self.snapshot]:
            return "a submodule was added, removed or replaced since the plan was captured"
        for (name, _, mode, attrs), (_, _, was_mode, was) in zip(now, self.snapshot):
            where = name or type(self.module).__name__
            if mode != was_mode:
                return f"{where} was switched to {'train' if mode else 'eval'} mode"
            if attrs != was:
                diff = sorted(k for k in set(attrs) | set(was) if attrs.get(k) != was.get(k))
                return f"{where}'s {', '.join(d.lstrip('_') for d in diff)} changed"
        return None
