"""The option names ``optimize`` and the ``torch.compile`` backend accept, checked in one place.

An unknown name raises :class:`UnknownOptionError`, a ``TypeError`` naming it (with the closest
known name): a typo such as ``trails=8`` must not silently tune nothing.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from autofuse.cache.keys import TUNING_OPTIONS

# the keyword arguments of tune.tune (and api._tuned's ``retune``): the options that steer the
# search, less the ones only a cache key reads
TUNING = TUNING_OPTIONS - {"strict", "seed"}
OPTIMIZE = TUNING | {"example_kwargs", "cuda_graph", "dynamic", "buckets"}
BACKEND = TUNING | {"cuda_graph", "buckets"}


def _base() -> type:
    """Dynamo wraps a backend's exceptions in BackendCompilerFailed (a RuntimeError) except
    those it shortens (ShortenTraceback): deriving from it lets the TypeError reach the user."""
    try:
        from torch._dynamo.exc import ShortenTraceback
    except ImportError:  # pragma: no cover - an older torch
        return Exception
    return ShortenTraceback


class UnknownOptionError(TypeError, _base()):  # type: ignore[misc]
    """An option name autofuse does not know."""

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)
        self.message = message
        self.first_useful_frame = None  # what ShortenTraceback reads (no frame to cut to)

    def __str__(self) -> str:
        return self.message


class OptionValueError(UnknownOptionError, ValueError):
    """A known option given a value it cannot take (named, with what it takes)."""


SAMPLERS = ("tpe", "random", "exhaustive")  # the names the search's sampler_spec reads


def check_options(options: Mapping[str, Any], known: Iterable[str], where: str) -> None:
    """Raise :class:`UnknownOptionError` for the first name of ``options`` not in ``known``,
    :class:`OptionValueError` for a search option's value that cannot work, whether or not a
    search runs (``sampler="foo"`` without ``trials`` is as wrong as with them)."""
    known = sorted(known)
    for name in options:
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UnknownOptionError(
                f"{where}: unknown option {name!r}{hint} (known options: {', '.join(known)})"
            )
    sampler = options.get("sampler")
    if isinstance(sampler, str) and sampler.strip().lower() not in SAMPLERS:
        raise OptionValueError(
            f"{where}: sampler={sampler!r} is not a sampler: give one of {list(SAMPLERS)}, a "
            "search.SamplerSpec or an optuna sampler"
        )
    for name, whole in (("trials", True), ("time_budget", False)):
        v = options.get(name)
        kinds = (int,) if whole else (int, float)
        if v is not None and (isinstance(v, bool) or not isinstance(v, kinds) or not v >= 0):
            what = "a whole number" if whole else "a number of seconds"
            raise OptionValueError(f"{where}: {name}={v!r} must be {what}, 0 or more")


def wants_tuning(options: Mapping[str, Any]) -> bool:
    return bool(options.get("trials") or options.get("time_budget"))


class OptionNote(UserWarning):
    """An option this machine cannot honour (said once per process and option)."""


_NOTED: set[str] = set()


def note_unhonoured(name: str, why: str) -> None:
    """One :class:`OptionNote` per process for option ``name``: what happens instead."""
    if name in _NOTED:
        return
    _NOTED.add(name)
    warnings.warn(f"autofuse: option {name}: {why}", OptionNote, stacklevel=3)


def note_backend_tuning(options: Mapping[str, Any], cuda: bool, origin: str = "backend") -> None:
    """The backend tunes on a GPU only: say so where ``trials`` / ``time_budget`` ask for it
    on a machine without one, in the words of the front end that asked (``origin``: "backend",
    "optimize": a plan ``optimize`` tuned, its other calls on the backend path, or
    "optimize-backend": ``optimize`` returned the backend path alone)."""
    if not wants_tuning(options) or cuda:
        return
    asked = ", ".join(f"{k}={options[k]!r}" for k in ("trials", "time_budget") if options.get(k))
    where = "the torch.compile backend path, which tunes only on a CUDA GPU"
    why = {
        "backend": f"{asked} not used: the torch.compile backend tunes only on a CUDA GPU; each "
        "graph runs its greedy plan here (autofuse.optimize(fn, inputs, trials=...) tunes with "
        "the cost model on CPU)",
        "optimize": f"{asked} tuned the captured plan (with the cost model on CPU); the calls it "
        f"cannot run (autograd, the module's other mode, keyword arguments) take {where}: they "
        "run greedy plans here",
        "optimize-backend": f"{asked} not used: the function runs on {where} (keyword "
        "arguments, dynamic= or code make_fx cannot trace): its graphs run greedy plans here",
    }[origin]
    note_unhonoured(f"trials ({origin})", why)
