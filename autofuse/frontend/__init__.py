"""Front ends that hand autofuse a graph: the ``torch.compile`` backend (``dynamo.py``) and
``optimize``'s autograd path (``optimized.py``).

Importing this package is cheap: it imports neither ``torch._dynamo`` nor Triton (Triton reads
``TRITON_INTERPRET`` when it is first imported, so ``import autofuse`` must not import it).
:func:`register` makes ``torch.compile(..., backend="autofuse")`` work: at once when Dynamo is
already imported, else the moment Dynamo's backend registry is imported. An installed autofuse
is also found through its ``torch_dynamo_backends`` entry point without being imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any

_REGISTRY = "torch._dynamo.backends.registry"

__all__ = ["autofuse_backend", "compiled_graphs", "make_backend", "register"]


def autofuse_backend(gm: Any, example_inputs: Any, options: dict | None = None, **kw: Any) -> Any:
    """The backend registered as "autofuse" (see ``dynamo.autofuse_backend``)."""
    from .dynamo import autofuse_backend as impl

    return impl(gm, example_inputs, options=options, **kw)


def make_backend(**options: Any) -> Any:
    from .dynamo import make_backend as impl

    return impl(**options)


def compiled_graphs() -> list:
    from .dynamo import compiled_graphs as impl

    return impl()


def _register_into(registry: Any) -> None:
    from importlib.metadata import EntryPoint

    if "autofuse" in getattr(registry, "_COMPILER_FNS", {}):
        return  # registered already (by an earlier call, or by the entry point's loading)
    if isinstance(getattr(registry, "_BACKENDS", {}).get("autofuse"), EntryPoint):
        # Dynamo found the "torch_dynamo_backends" entry point and is loading it (or will, at
        # the first lookup): registering here too would make that fail with "duplicate name"
        return
    registry.register_backend(autofuse_backend, name="autofuse")


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Registers the backend right after Dynamo's registry module is executed (once)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _REGISTRY:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _register_into(module)

        loader.exec_module = exec_module  # this spec's own loader instance
        return spec


def register() -> None:
    """Make "autofuse" a ``torch.compile`` backend name (idempotent; imports no Dynamo)."""
    registry = sys.modules.get(_REGISTRY)
    if registry is not None and hasattr(registry, "register_backend"):
        _register_into(registry)
    elif not any(isinstance(f, _RegisterOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport())
