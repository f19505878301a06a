"""Plans to JSON and back: nodes, graphs, launch configs, kernels with their metadata."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from autofuse.ir.graph import Graph, Node
from autofuse.kernels import GroupInfo, Kernel, KernelMeta, LibraryCall, check_call, config_classes
from autofuse.plan import LibraryStep

# ---------------------------------------------------------------------------------------------
# Encoding: tuples of primitives <-> JSON
# ---------------------------------------------------------------------------------------------


def _enc(v: Any, what: str) -> Any:
    """A nested tuple of primitives -> JSON (tuples become lists; IR values never hold lists)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, tuple):
        return [_enc(x, what) for x in v]
    raise TypeError(
        f"cannot cache {what}: it holds a {type(v).__name__} ({v!r}); "
        "cached values must be nested tuples of str/int/float/bool/None"
    )


def _dec(v: Any) -> Any:
    """JSON -> the nested tuples it was (every list decodes to a tuple)."""
    if isinstance(v, list):
        return tuple(_dec(x) for x in v)
    if isinstance(v, dict):
        raise ValueError(f"unexpected JSON object {v!r} where a value was expected")
    return v


def json_safe(v: Any) -> Any:
    """Metadata -> JSON: anything that is not a primitive, a sequence or a dict is repr'd."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: json_safe(getattr(v, f.name)) for f in dataclasses.fields(v)}
    return repr(v)


def _encode_node(node: Node) -> dict:
    what = f"node {node.name or node.op}"
    return {
        "op": node.op,
        "inputs": list(node.inputs),
        "shape": list(node.shape),
        "dtype": node.dtype,
        "strides": list(node.strides),
        "attrs": [[k, _enc(v, f"attribute {k} of {what}")] for k, v in node.attrs],
        "name": node.name,
    }


def _decode_node(d: dict) -> Node:
    return Node(
        op=d["op"],
        inputs=tuple(d["inputs"]),
        shape=tuple(d["shape"]),
        dtype=d["dtype"],
        strides=tuple(d["strides"]),
        attrs=tuple((str(k), _dec(v)) for k, v in d["attrs"]),
        name=d.get("name", ""),
    )


def encode_graph(graph: Graph) -> dict:
    """``graph`` as JSON: its key, nodes, inputs and outputs."""
    return {
        "key": graph.key,
        "nodes": [_encode_node(n) for n in graph.nodes],
        "inputs": list(graph.inputs),
        "outputs": list(graph.outputs),
    }


def decode_graph(d: dict) -> Graph:
    """The graph ``encode_graph`` wrote."""
    graph = Graph(
        tuple(_decode_node(n) for n in d["nodes"]), tuple(d["inputs"]), tuple(d["outputs"])
    )
    if graph.key != d["key"]:
        raise ValueError(f"the decoded graph has key {graph.key}, the entry says {d['key']}")
    return graph


def _encode_dataclass(obj: Any, what: str) -> dict:
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise TypeError(f"cannot cache {what}: {type(obj).__name__} is not a dataclass")
    return {f.name: _enc(getattr(obj, f.name), f"{what}.{f.name}") for f in dataclasses.fields(obj)}


def _encode_config(config: Any) -> dict:
    cls = type(config).__name__
    if config_classes().get(cls) is not type(config):
        raise TypeError(f"cannot cache a launch config of type {type(config).__qualname__}")
    return {"class": cls, "fields": _encode_dataclass(config, cls)}


def _decode_config(d: dict) -> Any:
    cls = config_classes().get(d["class"])
    if cls is None:
        raise ValueError(f"unknown launch config class {d['class']!r}")
    return cls(**{k: _dec(v) for k, v in d["fields"].items()})


_KERNEL_SPECIAL = ("name", "source", "config", "info", "meta")


def encode_kernel(kernel: Kernel, source_file: str) -> dict:
    """``kernel`` as JSON, its source kept in ``source_file`` beside the plan."""
    extra = {
        f.name: _enc(getattr(kernel, f.name), f"kernel {kernel.name}.{f.name}")
        for f in dataclasses.fields(kernel)
        if f.name not in _KERNEL_SPECIAL
    }
    return {
        "name": kernel.name,
        "source_file": source_file,
        "source_sha256": sha256_hex(kernel.source.encode()),
        "config": _encode_config(kernel.config),
        "info": _encode_dataclass(kernel.info, f"kernel {kernel.name}.info"),
        "meta": _encode_dataclass(kernel.meta, f"kernel {kernel.name}.meta"),
        "fields": extra,
    }


def decode_kernel(d: dict, source: str) -> Kernel:
    """The kernel ``encode_kernel`` wrote, with its verified ``source`` text."""
    return Kernel(
        name=d["name"],
        source=source,
        config=_decode_config(d["config"]),
        info=GroupInfo(**{k: _dec(v) for k, v in d["info"].items()}),
        meta=KernelMeta(**{k: _dec(v) for k, v in d["meta"].items()}),
        **{k: _dec(v) for k, v in d["fields"].items()},
    )


def encode_library_step(step: LibraryStep) -> dict:
    """A library step as data: its provider, function and arguments (nodes and constants)."""
    call = step.call
    what = f"library call {call.label}"
    return {
        "kind": "library",
        "provider": call.provider,
        "call": call.name,
        "args": list(call.args),
        "out": call.out,
        "nodes": list(call.nodes),
        "params": [[k, _enc(v, f"argument {k} of {what}")] for k, v in call.params],
        "reason": step.reason,
    }


def decode_library_step(d: dict, graph: Graph) -> LibraryStep:
    """The step ``encode_library_step`` wrote; raises ValueError where it names a provider,
    a function or a node this autofuse and ``graph`` do not have."""
    call = LibraryCall(
        provider=str(d["provider"]),
        name=str(d["call"]),
        args=tuple(int(a) for a in d["args"]),
        out=int(d["out"]),
        nodes=tuple(int(n) for n in d["nodes"]),
        params=tuple((str(k), _dec(v)) for k, v in d["params"]),
    )
    check_call(call, graph)
    return LibraryStep(call, str(d["reason"]))


def sha256_hex(data: bytes) -> str:
    """The hex SHA-256 digest of ``data``: the cache's checksum of files and documents."""
    return hashlib.sha256(data).hexdigest()


def canonical_json(payload: Any) -> bytes:
    """The one byte form of a JSON document that digests and signatures are taken over (sorted
    keys, no spaces, ASCII)."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
