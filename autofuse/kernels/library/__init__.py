"""Library providers: a group of the graph run by a named library call instead of a generated
kernel: cuBLAS through ``torch.mm`` (``cublas.py``), SDPA's backends for attention kept whole
(``sdpa.py``), a convolution and its bias, residual and ReLU as one cuDNN call
(``cudnn.py``).

A provider offers, for a group, the calls that compute it (``offers``). A call
(:class:`LibraryCall`) is data: the provider's name, the function's name, the graph nodes it
takes and its constant keyword arguments. A plan stores it as such and a new process resolves
the function by name (``bind_call``): no code is pickled or loaded from a cache entry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autofuse.ir.graph import Graph
from autofuse.kernels.library.call import LibraryCall, Provider
from autofuse.kernels.library.cublas import CublasProvider
from autofuse.kernels.library.cudnn import CudnnProvider
from autofuse.kernels.library.sdpa import FORWARD_OPS as SDPA_FORWARD_OPS
from autofuse.kernels.library.sdpa import SdpaProvider

PROVIDERS: tuple[Provider, ...] = (CublasProvider(), SdpaProvider(), CudnnProvider())
_BY_NAME = {p.name: p for p in PROVIDERS}


def provider(name: str) -> Provider:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(
            f"unknown library provider {name!r}: expected one of {sorted(_BY_NAME)}"
        ) from None


def library_calls(graph: Graph, group: frozenset[int]) -> tuple[LibraryCall, ...]:
    """Every call a provider offers for ``group`` (providers in order; none: no library)."""
    return tuple(c for p in PROVIDERS for c in p.offers(graph, frozenset(group)))


def check_call(call: LibraryCall, graph: Graph) -> None:
    """Raise ValueError unless ``call`` names a known provider and function and nodes of
    ``graph`` (a call read back from a cache entry)."""
    provider(call.provider).function(call.name)
    n = len(graph.nodes)
    if not all(0 <= i < n for i in (*call.args, call.out, *call.nodes)):
        raise ValueError(f"library call {call.label} names a node outside the graph")
    if call.out not in call.nodes:
        raise ValueError(f"library call {call.label} computes a node outside its group")


def bind_call(call: LibraryCall) -> Callable[..., Any]:
    """``f(*tensors)``: the call's function with its constant arguments bound."""
    fn = provider(call.provider).function(call.name)
    if not call.params:
        return fn
    params = dict(call.params)
    return lambda *args: fn(*args, **params)


def preferred_call(graph: Graph, i: int) -> LibraryCall | None:
    """The call an unmeasured plan runs node ``i`` (an op autofuse does not generate) as, or
    None (it runs as traced)."""
    group = frozenset({i})
    return next((c for p in PROVIDERS if (c := p.preferred(graph, group)) is not None), None)


def library_note(graph: Graph, i: int) -> str | None:
    """A provider's words on why node ``i`` runs as traced (None: no provider's op)."""
    return next((n for p in PROVIDERS if (n := p.note(graph, i)) is not None), None)


def library_key_parts(graph: Graph) -> dict[str, str]:
    """What the providers add to a cache key of ``graph`` (library versions its plan may call)."""
    return {k: v for p in PROVIDERS for k, v in p.key_parts(graph).items()}


def call_reason(graph: Graph, call: LibraryCall) -> str:
    """Why / how the group runs as this call, in words (for reports and ``explain``)."""
    return provider(call.provider).reason(graph, call)


__all__ = [
    "PROVIDERS",
    "SDPA_FORWARD_OPS",
    "LibraryCall",
    "Provider",
    "bind_call",
    "call_reason",
    "check_call",
    "library_calls",
    "library_key_parts",
    "library_note",
    "preferred_call",
    "provider",
]
