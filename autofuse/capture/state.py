"""A module's buffers as the caller left them while autofuse builds a plan for it.

Capturing, verifying and timing a module in train mode runs its forward several times; each
run moves state such as BatchNorm's running statistics and ``num_batches_tracked``. Eager
would move them once per call the caller makes, so the buffers are restored afterwards.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import chain
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


def _inner_dicts(attrs: dict[str, Any]) -> list[dict]:
    """The dicts one level below a module's attributes that ``_attr_state`` reads: its dict
    attributes (parameters, buffers, submodules, hooks) and other objects' own attributes."""
    out = []
    for v in attrs.values():
        if isinstance(v, dict):
            out.append(v)
        elif not isinstance(v, (_SIMPLE, torch.Tensor)):
            own = getattr(v, "__dict__", None)
            if type(own) is dict:
                out.append(own)
    return out


class ModuleState:
    """What a plan captured from a module depends on: each submodule (by identity and path),
    its train/eval flag, its attributes, parameters, buffers and hooks. ``changed()`` names the
    first difference since capture (None: the plan still computes what the module would).

    ``check()`` answers the same per call without walking the module in Python: the keys and
    values of every attribute dict it depends on, compared by identity in C (``watch``). What
    that check flags (a value rebound, even to an equal one) goes to ``changed()``; where that
    finds no difference the watch is taken again. ``tensors`` are the module's parameters and
    buffers named ``names`` (the plan's trailing inputs), found once per watch: the watch sees
    any of them rebound."""

    def __init__(self, module: torch.nn.Module, names: Sequence[str] = ()) -> None:
        self.module = module
        self.names = tuple(names)
        self.snapshot = self._take()
        self.watch()

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

    def watch(self) -> None:
        """Take the identities ``check()`` compares, and the parameters and buffers in use."""
        own = [vars(sub) for _, sub in self.module.named_modules(remove_duplicate=False)]
        self._dicts = (*own, *chain.from_iterable(map(_inner_dicts, own)))
        self._sizes = list(map(len, self._dicts))  # most are empty hook dicts: sizes alone
        self._full = tuple(d for d in self._dicts if d)
        self._seen = self._identities()
        self.tensors = self._by_name()

    def current(self) -> tuple[torch.Tensor, ...]:
        """The parameters and buffers named ``names`` now (found by name again where the
        module changed since the watch)."""
        return self.tensors if self.unchanged() else self._by_name()

    def _by_name(self) -> tuple[torch.Tensor, ...]:
        found = dict(self.module.named_parameters())
        found.update(self.module.named_buffers())
        return tuple(found[n] for n in self.names)

    def _identities(self) -> tuple[list, list]:
        dicts = self._full
        keys = list(chain.from_iterable(map(dict.keys, dicts)))
        return keys, list(chain.from_iterable(map(dict.values, dicts)))

    def unchanged(self) -> bool:
        """Every watched dict has its size, and the keys (strings, hook numbers: equality) and
        values (identity) of those that held any are the ones watched; C loops, no Python per
        item."""
        if list(map(len, self._dicts)) != self._sizes:
            return False
        keys, values = self._identities()
        was_keys, was_values = self._seen
        return keys == was_keys and all(map(operator.is_, values, was_values))

    def check(self) -> str | None:
        """``changed()``, made in full only where the identity check flags something."""
        if self.unchanged():
            return None
        why = self.changed()
        if why is None:
            self.watch()  # rebound to equal values: nothing the plan depends on moved
        return why

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
