"""Which calls a captured plan cannot run (autograd, another module mode, keyword arguments),
and sending them to the plan's backend path, or raising when it has none. Imports no Dynamo."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree


class AutogradUnsupported(RuntimeError):
    """A call that needs autograd (or a mode / signature the plan was not captured for) on a
    plan that has no backend path to run it."""


def _module_needs_grad(module: torch.nn.Module | None) -> bool:
    return module is not None and any(p.requires_grad for p in module.parameters())


def needs_grad(args: Sequence[Any], kwargs: dict[str, Any], module: Any = None) -> bool:
    """Grad mode is on and an input (any pytree leaf) or a parameter of ``module`` requires
    grad: the call must record an autograd graph."""
    if not torch.is_grad_enabled():
        return False
    for leaf in pytree.tree_leaves((tuple(args), kwargs)):
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
            return True
    return _module_needs_grad(module)


def route(opt: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """Why ``opt``'s make_fx plan cannot run this call (None when it can)."""
    module = getattr(opt, "_module", None)
    if kwargs:
        return f"keyword arguments ({', '.join(kwargs)})"
    captured_mode = getattr(opt, "_training", None)
    if module is not None and captured_mode is not None and module.training != captured_mode:
        was, now = ("train", "eval") if captured_mode else ("eval", "train")
        return f"the module was captured in {was} mode and is now in {now} mode"
    if needs_grad(args, {}, module):
        return "an input or parameter requires grad in grad mode (the plan has no backward)"
    return None


class ModuleChangedWarning(UserWarning):
    """The module changed since its plan was captured: its calls run in eager."""


def run_changed(opt: Any, changed: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """A call of a module that changed since capture (an attribute, a submodule, a hook, a
    mode, a parameter): the plan no longer computes what it would, so the module runs in eager
    (one warning per plan)."""
    if not getattr(opt, "_changed_noted", False):
        opt._changed_noted = True
        warnings.warn(
            f"autofuse: the module changed since its plan was captured ({changed}); its calls "
            "run in eager: call autofuse.optimize on it again for a plan of the new module",
            ModuleChangedWarning,
            stacklevel=3,
        )
    return opt._module(*args, **kwargs)


def call_routed(opt: Any, why: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    path = getattr(opt, "autograd", None)
    if path is None:
        raise AutogradUnsupported(
            f"autofuse: {getattr(opt, '__name__', 'this plan')} cannot run this call: {why}. "
            "This plan has no backward or backend path (e.g. it was loaded from the plan cache): "
            "call it under torch.no_grad() with the captured signature, or build it with "
            "autofuse.optimize(...) or torch.compile(..., backend='autofuse'), which train."
        )
    return path(*args, **kwargs)
