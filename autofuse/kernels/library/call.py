"""A library call as data, and the protocol of the providers that offer them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from autofuse.ir.graph import Graph


@dataclass(frozen=True)
class LibraryCall:
    """``provider.name(*args, **params)``: ``args`` are graph nodes (passed as their tensors),
    ``params`` constants (primitives); the call computes ``out``, the value of the group
    ``nodes`` (every member of the group, ``out`` among them)."""

    provider: str
    name: str
    args: tuple[int, ...]
    out: int
    nodes: tuple[int, ...]
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        return f"{self.provider}.{self.name}"


def provided(
    functions: Mapping[str, Callable[..., Any]], who: str, name: str
) -> Callable[..., Any]:
    """Provider ``who``'s function ``name`` from its table, or a ValueError naming the ones it
    has (a cached plan naming a call this version does not provide)."""
    try:
        return functions[name]
    except KeyError:
        raise ValueError(
            f"{who} provider has no function {name!r}: expected one of {sorted(functions)}"
        ) from None


class Provider(Protocol):
    """A library family: the groups it can run (as calls), and its functions by name."""

    name: str

    def offers(self, graph: Graph, group: frozenset[int]) -> tuple[LibraryCall, ...]: ...

    def function(self, name: str) -> Callable[..., Any]: ...

    def reason(self, graph: Graph, call: LibraryCall) -> str: ...

    def preferred(self, graph: Graph, group: frozenset[int]) -> LibraryCall | None:
        """The call an unmeasured plan runs a group of ops autofuse does not generate as (None:
        they run as traced, eager steps)."""
        ...

    def note(self, graph: Graph, i: int) -> str | None:
        """Why node ``i``, an op of this library, runs as traced (None: not one of its ops)."""
        ...

    def key_parts(self, graph: Graph) -> dict[str, str]:
        """What a cache key of ``graph`` must add (a library version its plan may call)."""
        ...
