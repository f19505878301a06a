"""Front ends that hand autofuse a graph: the ``torch.compile`` backend (``dynamo``)."""

from .dynamo import autofuse_backend, compiled_graphs, make_backend, register

__all__ = ["autofuse_backend", "compiled_graphs", "make_backend", "register"]
