"""The call index: ``autofuse.load`` reaches a cached plan from what the caller gives, with no
capture (capture imports Dynamo and traces: seconds in a new process).

A call key hashes the function's qualified name and code (its bytecode and constants, its
defaults and closure values, the simple global constants it reads, what it reads through modules
and classes (``cfg.scale``, ``utils.act``) and, recursively up to 8 calls deep, the Python
functions it calls; for a module, its class, the code and globals of its own classes' methods,
its ``repr``, each submodule's simple attributes, hooks and train/eval flag, and its
parameters' names, shapes and dtypes), the inputs' structure, shapes, strides, dtypes and
devices, grad mode, the device, versions and the options that change the plan. Not a module's
import name (a spec file loaded by path and the same file imported by production give one
key); code of an installed package (under site-packages) by the package's name and version; a
registry object (a ``Mapping`` of names to functions) by its items.

``<cache home>/calls/<call key>.json`` names the plan entry and holds what is needed to call it
like the function (the captured program's input/output structure and scalars). It is written
when a plan is tuned or first loaded by capture, and read (and checked against its own digest)
by the next ``load``. (An installed package re-installed with changed code under the same
version keeps its keys: ``retrace=True`` or ``autofuse cache clear`` then.)

A function that reads anything the key cannot see (a global tensor, an object whose state
changes what it computes, calls nested deeper) gets no call key: ``load`` captures it every
time, with one :class:`UnkeyedCallNote`. A record names the call key it was made for: one
copied under another function's key is ignored.
``load(..., retrace=True)`` always captures.
"""

from __future__ import annotations

import dis
import functools
import hashlib
import json
import logging
import os
import sys
import types
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from autofuse.cache.codec import canonical_json, sha256_hex
from autofuse.cache.keys import (
    CACHE_FORMAT,
    KEY_RE,
    DeviceInfo,
    generator_id,
    inputs_device,
    key_options,
    triton_version,
)
from autofuse.cache.trust import CALL_LIMIT, read_bounded, sign, signature_problem
from autofuse.capture import Captured
from autofuse.files import write_atomic
from autofuse.version import __version__

CALLS_DIR = "calls"
_SIMPLE = (type(None), bool, int, float, complex, str, bytes)
_LIBRARIES = frozenset({"torch", "triton", "autofuse", "builtins", "math", "numpy", "operator"})
_DEPTH = 8  # functions called deeper than this make the call unkeyed (captured every load)
_MAX_CONST_NUMEL = 4096  # a small tensor constant is hashed by value; a larger one is opaque


class Opaque(Exception):
    """A value the call key cannot see into (the function gets no call key)."""


def _value(v: Any, depth: int, seen: set[int]) -> Any:
    if isinstance(v, _SIMPLE):
        return [type(v).__name__, repr(v)]
    if isinstance(v, (tuple, list, frozenset, set)):
        items = sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v
        return [type(v).__name__, [_value(x, depth, seen) for x in items]]
    if isinstance(v, dict):
        return ["dict", [[repr(k), _value(x, depth, seen)] for k, x in v.items()]]
    if isinstance(v, Mapping):  # a registry object (name -> function): its class and items
        try:
            items = list(v.items())
        except Exception as e:  # noqa: BLE001 - a mapping that cannot list itself
            raise Opaque(f"a {type(v).__name__} ({type(e).__name__})") from e
        return ["mapping", _home(type(v)), [[repr(k), _value(x, depth, seen)] for k, x in items]]
    if isinstance(v, (torch.dtype, torch.device, torch.Size)):
        return [type(v).__name__, str(v)]
    if isinstance(v, torch.Tensor):
        if v.numel() > _MAX_CONST_NUMEL:
            raise Opaque(f"a {list(v.shape)} tensor constant")
        data = v.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        return ["tensor", str(v.dtype), list(v.shape), hashlib.sha256(data).hexdigest()]
    if isinstance(v, types.ModuleType):
        return ["module", v.__name__]
    if isinstance(v, logging.Logger):
        return ["logger", v.name]
    if isinstance(v, type):
        return _class(v, depth, seen)
    if isinstance(v, (types.FunctionType, types.MethodType)) or hasattr(v, "__code__"):
        return _function(v, depth, seen)
    if isinstance(
        v, (types.BuiltinFunctionType, torch._ops.OpOverload, torch._ops.OpOverloadPacket)
    ):
        return ["builtin", getattr(v, "__module__", "") or "", getattr(v, "__qualname__", str(v))]
    raise Opaque(f"a {type(v).__name__}")


def _code(co: types.CodeType) -> list:
    consts = [_code(c) if isinstance(c, types.CodeType) else repr(c) for c in co.co_consts]
    return [co.co_name, co.co_code.hex(), consts, list(co.co_names), co.co_argcount]


def _function(fn: Any, depth: int, seen: set[int]) -> list:
    if isinstance(fn, types.MethodType):
        return ["method", _function(fn.__func__, depth, seen), _value(fn.__self__, depth, seen)]
    code = getattr(fn, "__code__", None)
    name = _home(fn)
    if not isinstance(code, types.CodeType):
        raise Opaque(f"the callable {name}")
    if id(fn) in seen or _library(fn):
        return ["fn", name]  # a cycle, or a library function (its version is in the key)
    if depth <= 0:
        raise Opaque(f"{name}: functions called deeper than the key follows")
    seen = seen | {id(fn)}
    out: list = ["fn", name, _code(code), _value(getattr(fn, "__defaults__", None), depth, seen)]
    for cell in getattr(fn, "__closure__", None) or ():
        out.append(_value(cell.cell_contents, depth - 1, seen))
    glb = getattr(fn, "__globals__", {})
    for n in _global_names(code):
        if n in glb:
            out.append([n, _value(glb[n], depth - 1, seen)])
    for chain in _attribute_chains(code):
        if chain[0] in glb:
            out.append(_through_modules(glb[chain[0]], chain, depth - 1, seen))
    return out


@functools.cache
def _installed_version(top: str) -> str | None:
    """``name==version`` of the installed package ``top`` (a regular install, under
    site-packages: not the user's own code, nor an editable install), else None."""
    parts = Path(str(getattr(sys.modules.get(top), "__file__", None) or "")).parts
    if "site-packages" not in parts and "dist-packages" not in parts:
        return None
    try:
        from importlib import metadata

        return f"{top}=={metadata.version(top)}"  # a distribution named as its package
    except Exception:  # noqa: BLE001 - named otherwise (PIL: pillow), or no metadata
        pass
    try:
        dists = metadata.packages_distributions().get(top) or []  # (scans every install)
        return f"{dists[0]}=={metadata.version(dists[0])}" if dists else None
    except Exception:  # noqa: BLE001 - no metadata: its code is keyed instead
        return None


def _library(obj: Any) -> bool:
    """A function or class of a library: keyed by its name and version, not its code (torch,
    triton, ..., whose versions every key holds, or an installed package such as
    transformers)."""
    top = str(getattr(obj, "__module__", "") or "").split(".")[0]
    return top in _LIBRARIES or _installed_version(top) is not None


def _home(obj: Any) -> str:
    """How the key names a function or class: a library's by module, name and version; the
    user's by qualified name alone (its code is keyed), as the module's name depends on how it
    was imported (``autofuse tune spec.py`` loads the file under a name of its own, production
    imports it as ``spec``)."""
    qualname = str(getattr(obj, "__qualname__", "") or type(obj).__qualname__)
    module = str(getattr(obj, "__module__", "") or "")
    if not _library(obj):
        return qualname
    top = module.split(".")[0]
    version = None if top in _LIBRARIES else _installed_version(top)  # (theirs: in every key)
    return f"{module}.{qualname}" + (f" ({version})" if version else "")


def _class(cls: type, depth: int, seen: set[int]) -> list:
    """A class the code reads: a library's by name; the user's with its methods' code."""
    if _library(cls) or id(cls) in seen or depth <= 0:
        return ["class", _home(cls)]
    try:
        return ["class", _home(cls), _class_code(cls, depth - 1, seen | {id(cls)})]
    except Opaque:  # methods reading what the key cannot see: the class by its name, as ever
        return ["class", _home(cls)]


def _attribute_chains(co: types.CodeType) -> list[tuple[str, ...]]:
    """``(g, a, b)`` for every ``g.a.b`` the code reads from a global (nested code too)."""
    chains: set[tuple[str, ...]] = set()
    chain: list[str] = []
    for ins in dis.get_instructions(co):
        if ins.opname == "LOAD_GLOBAL":
            chain = [str(ins.argval)]
        elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and chain:
            chain.append(str(ins.argval))
        else:
            if len(chain) > 1:
                chains.add(tuple(chain))
            chain = []
    if len(chain) > 1:
        chains.add(tuple(chain))
    for c in co.co_consts:
        if isinstance(c, types.CodeType):
            chains.update(_attribute_chains(c))
    return sorted(chains)


def _through_modules(v: Any, chain: tuple[str, ...], depth: int, seen: set[int]) -> list:
    """What ``g.a.b`` reads: followed through modules and classes to the first value that is
    neither (a module attribute such as ``cfg.scale``, a helper ``utils.act``), which is keyed."""
    for i, attr in enumerate(chain[1:], 1):
        home = getattr(v, "__name__", "") if isinstance(v, types.ModuleType) else \
            getattr(v, "__module__", "") if isinstance(v, type) else None  # fmt: skip
        if home is None or str(home).split(".")[0] in _LIBRARIES:
            return [".".join(chain[:i]), _value(v, depth, seen)]
        if not hasattr(v, attr):
            return [".".join(chain[: i + 1]), "missing"]
        v = getattr(v, attr)
    return [".".join(chain), _value(v, depth, seen)]


def _global_names(co: types.CodeType) -> list[str]:
    names = list(co.co_names)
    for c in co.co_consts:
        if isinstance(c, types.CodeType):
            names += _global_names(c)
    return sorted(set(names))


def _module(m: torch.nn.Module) -> list:
    out: list = ["nn.Module", _home(type(m)), repr(m)]
    seen: set[int] = set()
    for name, sub in m.named_modules():
        attrs = []
        for k, v in sorted(vars(sub).items()):
            if k.startswith("_") and k in ("_parameters", "_buffers", "_modules"):
                continue
            try:
                attrs.append([k, _value(v, 1, seen)])
            except Opaque:
                attrs.append([k, _shallow(v)])
        out.append([name, sub.training, _class_code(type(sub), _DEPTH, set()), attrs, _hooks(sub)])
    for name, t in [*m.named_parameters(), *m.named_buffers()]:
        out.append([name, list(t.shape), str(t.dtype), t.requires_grad])
    return out


def _class_code(cls: type, depth: int, seen: set[int]) -> list:
    """The methods of a class's own classes (not torch's), with what they read: the globals of
    ``forward`` and of the helpers it calls are part of the key."""
    out: list = []
    for klass in cls.__mro__:
        if _library(klass) or klass is object:
            continue
        for name, attr in sorted(vars(klass).items()):
            fn = getattr(attr, "__func__", attr)
            if isinstance(fn, types.FunctionType):
                out.append([klass.__qualname__, name, _function(fn, depth, seen)])
    return out


def _hooks(m: torch.nn.Module) -> list:
    """The module's hooks (forward, pre-forward, state): each one's code changes the call."""
    out = []
    for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks"):
        for h in (getattr(m, attr, None) or {}).values():
            out.append([attr, _function(h, _DEPTH, set())])
    return out


def _shallow(obj: Any) -> list:
    """An object attribute of a module (a model config, say): its class and the simple values
    among its own attributes, so a config that changes what forward computes changes the key."""
    out: list = [_home(type(obj))]
    for k, v in sorted(getattr(obj, "__dict__", {}).items()):
        try:
            out.append([k, _value(v, 0, set())])
        except Opaque:
            out.append([k, type(v).__qualname__])
    return out


def _inputs(example_inputs: Any) -> list:
    leaves, spec = pytree.tree_flatten(tuple(example_inputs))
    out: list = [str(spec)]
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            out.append([list(leaf.shape), list(leaf.stride()), str(leaf.dtype), str(leaf.device),
                        leaf.requires_grad])  # fmt: skip
        elif isinstance(leaf, _SIMPLE):
            out.append(_value(leaf, 0, set()))
        else:
            raise Opaque(f"an input of type {type(leaf).__name__}")
    return out


class UnkeyedCallNote(UserWarning):
    """``load`` captures this function on every call: its key cannot see what it reads."""


_NOTED: set[str] = set()


def call_key(fn: Any, example_inputs: Any, options: dict | None = None) -> str | None:
    """The call key of ``fn`` on these inputs, or None when the key cannot see what ``fn``
    reads (it is then captured on every load)."""
    return call_key_why(fn, example_inputs, options)[0]


def call_key_why(fn: Any, example_inputs: Any, options: dict | None = None) -> tuple:
    """(call key, None), or (None, what the key cannot see)."""
    try:
        who = _module(fn) if isinstance(fn, torch.nn.Module) else _function(fn, _DEPTH, set())
        parts = {
            "format": CACHE_FORMAT,
            "fn": who,
            "inputs": _inputs(example_inputs),
            "grad": torch.is_grad_enabled(),
            "device": DeviceInfo.current(inputs_device(example_inputs)).tag(),
            "versions": [
                str(torch.__version__),
                triton_version(),
                __version__,
                generator_id(),
            ],  # fmt: skip
            "options": repr(sorted((str(k), repr(v)) for k, v in key_options(options).items())),
        }
    except (Opaque, RecursionError, TypeError, ValueError, RuntimeError) as e:
        return None, f"{type(e).__name__}: {e}" if not isinstance(e, Opaque) else str(e)
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()[:32], None


def note_unkeyed(fn: Any, why: str) -> None:
    """One note per function: it is captured on every load (what its key cannot see)."""
    name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
    if name in _NOTED:
        return
    _NOTED.add(name)
    warnings.warn(
        f"autofuse.load: {name} reads {why}, which a call key cannot see; it is captured on "
        "every load (a plan is still found by its graph)",
        UnkeyedCallNote,
        stacklevel=3,
    )


def _path(cache_dir: str | os.PathLike, ck: str) -> Path:
    return Path(cache_dir) / CALLS_DIR / f"{ck}.json"


def write_call(cache_dir: str | os.PathLike, ck: str | None, plan_key: str, captured: Any) -> None:
    """Record that call key ``ck`` runs entry ``plan_key`` (best effort: a read-only cache or
    a structure pytree cannot serialize only means capture on the next load)."""
    if ck is None:
        return
    try:
        payload = {
            "call_key": ck,
            "plan_key": plan_key,
            "graph_key": captured.graph.key,
            "in_spec": pytree.treespec_dumps(captured.in_spec),
            "out_spec": pytree.treespec_dumps(captured.out_spec),
            "leaf_kinds": list(captured.leaf_kinds),
            "scalars": [_scalar_json(s) for s in captured.scalars],
            "param_names": list(captured.param_names),
            "source_name": captured.source_name,
        }
        doc = {"autofuse_call": CACHE_FORMAT, "sha256": sha256_hex(canonical_json(payload))}
        signature = sign("call", doc["sha256"])
        if signature is not None:
            doc["signature"] = signature
        doc["payload"] = payload
        path = _path(cache_dir, ck)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(doc, sort_keys=True).encode())
    except (Opaque, OSError, TypeError, ValueError, NotImplementedError):
        return


def _scalar_json(s: Any) -> list:
    if not isinstance(s, (type(None), bool, int, float, str)):
        raise Opaque(f"a scalar of type {type(s).__name__}")
    return [type(s).__name__, s if not (isinstance(s, float) and s != s) else "nan"]


def _scalar_back(item: list) -> Any:
    kind, v = item
    return float("nan") if kind == "float" and v == "nan" else v


def read_call(cache_dir: str | os.PathLike, ck: str | None) -> dict | None:
    """The index record of ``ck`` (checked against its digest, bound to ``ck``, signed where a
    signing key is set), or None (the call is captured)."""
    if ck is None:
        return None
    try:
        doc = json.loads(read_bounded(_path(cache_dir, ck), CALL_LIMIT))
        payload = doc["payload"]
        if (
            doc.get("autofuse_call") != CACHE_FORMAT
            or sha256_hex(canonical_json(payload)) != doc["sha256"]
        ):
            return None
        if not isinstance(payload.get("plan_key"), str) or not KEY_RE.match(payload["plan_key"]):
            return None
        if payload.get("call_key") != ck or signature_problem("call", doc["sha256"],
                                                              doc.get("signature")):  # fmt: skip
            return None  # a record of another call (copied here), or one the key did not sign
        return payload
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def captured_from(record: dict, graph: Any) -> Any:
    """The ``Captured`` program of an index record, over the entry's graph."""
    return Captured(
        graph=graph,
        in_spec=pytree.treespec_loads(record["in_spec"]),
        out_spec=pytree.treespec_loads(record["out_spec"]),
        leaf_kinds=tuple(record["leaf_kinds"]),
        scalars=tuple(_scalar_back(s) for s in record["scalars"]),
        param_names=tuple(record["param_names"]),
        source_name=record["source_name"],
    )
