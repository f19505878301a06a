"""``autofuse.optimize`` on top of the ``torch.compile`` backend: autograd, module modes, kwargs.

``optimize(fn, example_inputs)`` still captures ``fn`` with ``make_fx`` and builds (or tunes) one
plan: that is the plan of ``.plan`` / ``.report()`` / ``.tuning``, and it runs every plain call
(positional arguments, nothing requiring grad, the module in the mode it was captured in). The
calls that plan cannot run go through ``torch.compile(fn, backend=<autofuse, same options>)``
(:class:`AutogradPath`): a call in grad mode with an input or parameter that requires grad
(forward and backward plans, ``loss.backward()`` works), a module switched between train and
eval since the capture (Dynamo recompiles for the new mode) and calls with keyword arguments.
When the example call itself needs autograd, the backend path is compiled and run forward and
backward before ``optimize`` returns (so the tuning happens then); the gradients of that warm-up
are taken with ``torch.autograd.grad`` and never touch ``.grad``.

A plan with no backend path (``autofuse.load``'s cached plans, ``OptimizedFunction(captured,
plan)``) raises :class:`AutogradUnsupported` on such calls instead of dropping the graph.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from autofuse.report import format_summary, summarize
from autofuse.routing import AutogradUnsupported, needs_grad, route  # noqa: F401 - re-exported

from .dynamo import AutofuseBackend, CompiledGraph
from .pyguard import python_guard, side_effects


class AutogradPath:
    """``fn`` compiled by Dynamo with the autofuse backend (options as given to optimize)."""

    def __init__(self, fn: Any, options: dict[str, Any], origin: str = "optimize") -> None:
        self.fn = fn
        self.backend = AutofuseBackend(**options)
        self.backend.origin = origin  # whose voice its notes speak in (options.py)
        self.compiled = torch.compile(fn, backend=self.backend)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled(*args, **kwargs)

    @property
    def records(self) -> list[CompiledGraph]:
        return self.backend.records

    def warm(self, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """Run once (compiling, and tuning when asked) and, when the result requires grad,
        compile the backward too through ``torch.autograd.grad`` (``.grad`` is not touched)."""
        out = self(*args, **kwargs)
        outs = [
            o
            for o in pytree.tree_leaves(out)
            if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point()
        ]
        if not outs:
            return
        wrt = [
            x
            for x in pytree.tree_leaves((tuple(args), kwargs))
            if isinstance(x, torch.Tensor) and x.requires_grad
        ]
        if isinstance(self.fn, torch.nn.Module):
            wrt += [p for p in self.fn.parameters() if p.requires_grad]
        if wrt:
            loss = sum(o.float().sum() for o in outs)
            torch.autograd.grad(loss, wrt, allow_unused=True)


def attach(opt: Any, fn: Any, example_inputs: Sequence[Any], options: dict[str, Any]) -> None:
    """Give ``opt`` (an OptimizedFunction) its backend path; warm it when the example call
    needs autograd."""
    opt.autograd = AutogradPath(fn, options)
    opt.py_guard = python_guard(fn)
    effects = side_effects(fn)
    if effects:
        warnings.warn(
            f"autofuse.optimize: {getattr(fn, '__name__', type(fn).__name__)} calls "
            f"{', '.join(effects)}: Python side effects ran once, at capture, and do not run on "
            "the plan's calls (torch.compile(..., backend='autofuse') runs them on every call)",
            stacklevel=3,
        )
    if route(opt, example_inputs, {}) is not None:
        opt.autograd.warm(example_inputs, {})


class BackendFunction:
    """What ``optimize`` returns when ``fn`` is called with keyword arguments or cannot be
    captured with make_fx: the backend path alone. ``.plan`` is the latest forward (or
    inference) plan, ``.plans`` every compiled graph's."""

    def __init__(self, fn: Any, options: dict[str, Any]) -> None:
        self.autograd = AutogradPath(fn, options, "optimize-backend")
        self.__name__ = f"autofuse_{getattr(fn, '__name__', type(fn).__name__)}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.autograd(*args, **kwargs)

    @property
    def records(self) -> list[CompiledGraph]:
        return self.autograd.records

    @property
    def plans(self) -> list[Any]:
        return [r.plan for r in self.records]

    @property
    def plan(self) -> Any:
        fw = [r for r in self.records if r.kind in ("forward", "inference")]
        return fw[-1].plan if fw else None

    @property
    def tuning(self) -> Any:
        tuned = [r.tuning for r in self.records if r.tuning is not None]
        return tuned[-1] if tuned else None

    def report(self) -> str:
        parts = []
        for r in self.records:
            times = r.tuning.kernel_times if r.tuning is not None else None
            text = f"== {r.kind} graph {r.name}\n" + format_summary(summarize(r.plan, times))
            if r.tuning is not None:
                text += "\n" + r.tuning.summary()
            parts.append(text)
        return "\n".join(parts) if parts else "(nothing compiled yet)"


def dynamic_spec(
    fn: Any, example_inputs: Sequence[Any], dynamic: Any
) -> dict[int, tuple[int, ...]]:
    """``optimize``'s ``dynamic={"x": [0], ...}``: argument position -> its dynamic dims (a name
    of ``fn``'s parameters or a position); ``True``: every dim of every tensor argument. An
    unknown name, a non-tensor argument or a dim out of range raises, naming the argument."""
    import inspect

    if dynamic is True:
        return {k: tuple(range(x.dim())) for k, x in enumerate(example_inputs)
                if isinstance(x, torch.Tensor)}  # fmt: skip
    if not isinstance(dynamic, dict):
        raise TypeError(f"autofuse.optimize: dynamic= takes a dict {{name: dims}} or True, "
                        f"got {type(dynamic).__name__}")  # fmt: skip
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        names = list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        names = []
    out: dict[int, tuple[int, ...]] = {}
    for key, dims in dynamic.items():
        pos = key if isinstance(key, int) else (names.index(key) if key in names else None)
        if pos is None or not 0 <= pos < len(example_inputs):
            raise TypeError(f"autofuse.optimize: dynamic= names {key!r}, which is not an "
                            f"argument of the example call (arguments: {names[:len(example_inputs)]})")  # fmt: skip
        x = example_inputs[pos]
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"autofuse.optimize: dynamic= names {key!r}, a "
                            f"{type(x).__name__}, not a tensor")  # fmt: skip
        dims = (dims,) if isinstance(dims, int) else dims
        if not isinstance(dims, (list, tuple)) or not all(isinstance(d, int) for d in dims):
            raise TypeError(f"autofuse.optimize: dynamic={{{key!r}: {dims!r}}}: the dims of "
                            f"{key!r} must be integers (a list of them)")  # fmt: skip
        dims = tuple(dims)
        bad = [d for d in dims if not -x.dim() <= d < x.dim()]
        if bad:
            raise ValueError(f"autofuse.optimize: dynamic={{{key!r}: {list(dims)}}}: dim {bad[0]} "
                             f"is out of range for {key!r} with {x.dim()} dims")  # fmt: skip
        out[pos] = tuple(sorted({d % x.dim() for d in dims}))
    return out


class DynamicFunction(BackendFunction):
    """What ``optimize(..., dynamic=...)`` returns: the backend path with the named dims marked
    dynamic on every call (``torch._dynamo.mark_dynamic``), so the graph is symbolic in them
    and gets one plan per shape bucket (``plan/buckets.py``). With a search (``trials=``,
    ``time_budget=``), ``bucket_entry`` is the function captured and tuned at the example
    sizes, cached by bucket for ``autofuse.load`` (``cache/buckets.py``; None: not cached)."""

    def __init__(self, fn: Any, options: dict[str, Any], spec: dict[int, tuple[int, ...]]) -> None:
        super().__init__(fn, options)
        self.spec = spec
        self.bucket_entry: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for pos, dims in self.spec.items():
            if pos < len(args) and isinstance(args[pos], torch.Tensor):
                torch._dynamo.maybe_mark_dynamic(args[pos], dims)
        return self.autograd(*args, **kwargs)

    @property
    def counts(self) -> Any:
        """Plans made and bucket plans instantiated (``AutofuseBackend.counts``)."""
        return self.autograd.backend.counts
