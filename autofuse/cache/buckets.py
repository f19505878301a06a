"""Cache entries by shape bucket: a plan tuned at one size of a dynamic dim serves every size
of that dim's bucket (``kernels/common/sizes.py``'s ``size_bucket``: powers of two by default).

An exact entry's key hashes the graph with its sizes. A bucket entry's key hashes instead:

- the graph with the values that change with the dynamic sizes masked: ``optimize`` captures
  the function once more at a probe size (each dynamic size + 1) and masks each value (a
  shape, a stride, an attribute: a view's target shape, a scale read from a size) that differs
  between the two graphs; every other value (static sizes, dtypes, reduction dims, constants)
  stays in the key as it is;
- each dynamic dim's bucket, the dims themselves, the bucket edges, the mask and the stride
  order of every tensor argument;
- all the rest of an exact key (scalars, input and output structure, device, versions,
  generator, options).

The entry holds the plan of the tuning size; ``load`` at another size of the bucket builds its
partition and configs for the graph captured at that size (the planner's ``fitted``): the kernels are generated from that graph, so they compute what it
computes. The index ``buckets/<structure>.json`` lists, per graph structure (ops and edges,
no sizes), the dims and masks cached, which is how ``load`` finds a bucket entry with no
``dynamic=`` of its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from autofuse.cache.keys import DeviceInfo, inputs_device, key_of_parts, key_parts
from autofuse.capture.trace import Captured, capture
from autofuse.files import write_atomic
from autofuse.ir.graph import Graph, Node
from autofuse.kernels.common.sizes import size_bucket
from autofuse.plan.buckets import structure_key

__all__ = [
    "BUCKETS_DIR",
    "BucketNote",
    "BucketSpec",
    "bucket_key",
    "bucket_parts",
    "bucket_specs",
    "note_bucket",
    "probe",
    "spec_for",
    "varying",
]

BUCKETS_DIR = "buckets"
INDEX_LIMIT = 1 << 20  # bytes read of an index file at most
STRUCTURE_RE = re.compile(r"^[0-9a-f]{24}$")


class BucketNote(UserWarning):
    """``optimize(..., dynamic=..., trials=...)`` could not cache its plan by shape bucket (the
    function's graph changes with the dynamic sizes, or cannot be captured at another size):
    ``autofuse.load`` misses at the bucket's other sizes."""


@dataclass(frozen=True)
class BucketSpec:
    """Which dims of which arguments are bucketed, the bucket edges (None: powers of two) and
    the graph values masked in the key (node index, position among the node's values)."""

    dims: tuple[tuple[int, tuple[int, ...]], ...]  # (argument position, its dynamic dims)
    edges: tuple[int, ...] | None
    mask: tuple[tuple[int, int], ...]

    def to_json(self) -> dict[str, Any]:
        return {"dims": [[p, list(d)] for p, d in self.dims],
                "edges": None if self.edges is None else list(self.edges),
                "mask": [list(m) for m in self.mask]}  # fmt: skip

    @classmethod
    def from_json(cls, doc: Any) -> BucketSpec:
        """The spec of an index record (ValueError / TypeError / KeyError where malformed)."""
        dims = tuple((int(p), tuple(int(d) for d in ds)) for p, ds in doc["dims"])
        edges = doc["edges"]
        edges = None if edges is None else tuple(sorted(int(e) for e in edges))
        mask = tuple((int(i), int(k)) for i, k in doc["mask"])
        return cls(dims, edges, mask)


# ---------------------------------------------------------------------------------------------
# The masked graph
# ---------------------------------------------------------------------------------------------


def _flat(value: Any) -> list[str]:
    if isinstance(value, (tuple, list)):
        return ["(", *(a for v in value for a in _flat(v)), ")"]
    return [f"{type(value).__name__}:{value!r}"]


def _values(node: Node) -> list[str]:
    """The node's values in order: its shape, strides and attribute values, bracketed."""
    return [*_flat(node.shape), *_flat(node.strides), *_flat(tuple(v for _, v in node.attrs))]


def varying(graph: Graph, other: Graph) -> tuple[tuple[int, int], ...] | None:
    """The values that differ between two captures of one function at two sizes; None where
    the graphs' structures differ (the function is not one graph over the bucket)."""
    if structure_key(graph) != structure_key(other):
        return None
    out = []
    for i, (a, b) in enumerate(zip(graph.nodes, other.nodes)):
        va, vb = _values(a), _values(b)
        if len(va) != len(vb):
            return None
        out += [(i, k) for k, (x, y) in enumerate(zip(va, vb)) if x != y]
    return tuple(out)


def masked_key(graph: Graph, mask: Sequence[tuple[int, int]]) -> str:
    """A hash of ``graph`` with the values ``mask`` names left out."""
    hidden = set(map(tuple, mask))
    h = hashlib.sha256()
    for i, n in enumerate(graph.nodes):
        vals = ["*" if (i, k) in hidden else v for k, v in enumerate(_values(n))]
        h.update(repr((n.op, n.inputs, n.dtype, tuple(k for k, _ in n.attrs), vals)).encode())
    h.update(repr((graph.inputs, graph.outputs)).encode())
    return h.hexdigest()[:24]


# ---------------------------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------------------------


def stride_order(x: torch.Tensor) -> tuple[int, ...]:
    """The dims of ``x`` from the outermost in memory to the innermost (size-1 dims, whose
    strides mean nothing, left out): contiguous, channels-last and transposed apart."""
    dims = [d for d in range(x.dim()) if x.shape[d] != 1]
    return tuple(sorted(dims, key=lambda d: (-x.stride(d), -d)))


def arguments(example_inputs: Sequence[Any], spec: BucketSpec) -> list[Any]:
    """Per tensor argument: its dtype, stride order and shape, each dynamic size by bucket."""
    dyn = dict(spec.dims)
    out: list[Any] = []
    for pos, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            continue
        ds = dyn.get(pos, ())
        shape = [f"b{size_bucket(s, spec.edges)}" if d in ds else s for d, s in enumerate(x.shape)]
        out.append([pos, str(x.dtype), list(stride_order(x)), shape])
    return out


def bucket_parts(base: dict, captured: Captured, example_inputs: Sequence[Any],
                 spec: BucketSpec) -> dict:  # fmt: skip
    """The key parts of a bucket entry: ``base`` (an exact key's parts, ``keys.key_parts``)
    with the exact graph replaced by the masked one and the buckets added."""
    return {
        **base,
        "graph": masked_key(captured.graph, spec.mask),
        "bucket": {
            **spec.to_json(),
            "structure": structure_key(captured.graph),
            "arguments": arguments(example_inputs, spec),
        },
    }


def bucket_key(captured: Captured, example_inputs: Sequence[Any], spec: BucketSpec,
               options: dict | None = None) -> tuple[str, dict]:  # fmt: skip
    """(the key, its parts) of the bucket entry of these inputs under ``spec``."""
    device = DeviceInfo.current(inputs_device(example_inputs))
    parts = bucket_parts(key_parts(captured, device, options), captured, example_inputs, spec)
    return key_of_parts(parts), parts


def spec_for(fn: Any, captured: Captured, example_inputs: Sequence[Any],
             dims: dict[int, tuple[int, ...]], edges: Sequence[int] | None) -> BucketSpec | None:  # fmt: skip
    """The bucket spec of ``fn`` captured at the example inputs (``captured``), its dims
    ``dims`` (argument position -> dims) dynamic: ``fn`` captured again at a probe size gives
    the mask; None where the graph's structure changes with the sizes (raises the capture's
    error where ``fn`` cannot be captured at the probe size)."""
    moved = probe(example_inputs, dims)
    other = captured if moved is None else capture(fn, moved)
    mask = varying(captured.graph, other.graph)
    if mask is None:
        return None
    ordered = tuple(sorted((int(p), tuple(sorted(d))) for p, d in dims.items()))
    return BucketSpec(ordered, tuple(sorted(edges)) if edges else None, mask)


def probe(example_inputs: Sequence[Any], dims: dict[int, tuple[int, ...]]) -> list[Any] | None:
    """The example inputs with each dynamic size of 2 or more grown by one (same dtype,
    device and stride order, zeros); None where no size moves (sizes 0 and 1 are buckets of
    their own)."""
    out, moved = list(example_inputs), False
    for pos, ds in dims.items():
        x = example_inputs[pos]
        shape = [s + 1 if d in ds and s >= 2 else s for d, s in enumerate(x.shape)]
        moved |= shape != list(x.shape)
        order = [d for d in sorted(range(x.dim()), key=lambda d: (-x.stride(d), -d))]
        y = torch.zeros([shape[d] for d in order], dtype=x.dtype, device=x.device)
        out[pos] = y.permute([order.index(d) for d in range(x.dim())])
    return out if moved else None


# ---------------------------------------------------------------------------------------------
# The index: graph structure -> the bucket specs cached for it
# ---------------------------------------------------------------------------------------------


def _index_path(cache_dir: str | os.PathLike, structure: str) -> Path:
    if not STRUCTURE_RE.match(structure):
        raise ValueError(f"not a graph structure key: {structure!r}")
    return Path(cache_dir) / BUCKETS_DIR / f"{structure}.json"


def _read_index(path: Path) -> list[Any]:
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read(INDEX_LIMIT))
        return list(doc["specs"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def bucket_specs(cache_dir: str | os.PathLike, graph: Graph) -> list[BucketSpec]:
    """The bucket specs cached for graphs of ``graph``'s structure (a malformed record is
    skipped: the entry it names is only found again once re-tuned)."""
    out = []
    for doc in _read_index(_index_path(cache_dir, structure_key(graph))):
        try:
            out.append(BucketSpec.from_json(doc))
        except (ValueError, TypeError, KeyError):
            continue
    return out


def note_bucket(cache_dir: str | os.PathLike, parts: Any) -> None:
    """Add the bucket of an entry's key ``parts`` (:func:`bucket_parts`) to the index of its
    graph structure (best effort: a cache that cannot be written, or parts of an exact entry,
    only mean that ``load`` misses at the bucket's other sizes)."""
    try:
        bucket = parts["bucket"]
        structure, spec = str(bucket["structure"]), BucketSpec.from_json(bucket).to_json()
        path = _index_path(cache_dir, structure)
    except (ValueError, TypeError, KeyError):
        return
    specs = _read_index(path)
    if spec in specs:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"structure": structure, "specs": [*specs, spec]}
        write_atomic(path, json.dumps(doc, sort_keys=True).encode(), hidden=True)
    except OSError:
        return
