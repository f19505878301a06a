"""The one IR: frozen nodes and graphs (``graph``), the op table (``ops``), index expressions
(``indexing``) and eager evaluation of nodes (``eager``)."""

from autofuse.ir.graph import (
    FLOAT_DTYPES,
    Graph,
    Node,
    contiguous_strides,
    dedupe,
    make_attrs,
    numel,
)
from autofuse.ir.ops import OPS, OpDef, op_def

__all__ = [
    "FLOAT_DTYPES",
    "OPS",
    "Graph",
    "Node",
    "OpDef",
    "contiguous_strides",
    "dedupe",
    "make_attrs",
    "numel",
    "op_def",
]
