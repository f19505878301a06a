"""Cache keys: everything that changes a plan's output (graph, scalars, structure, device,
versions, options) hashed into an entry name; and the cache's errors and warnings."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from autofuse.capture.trace import Captured
from autofuse.kernels import library_key_parts
from autofuse.version import __version__

CACHE_FORMAT = 3  # 2: kernels carry their metadata; 3: eager outputs read in their traced layout
PLANS = "plans"
PLAN_FILE = "plan.json"

# Options of ``optimize`` that steer the search but not what a given plan computes: a plan tuned
# with 20 trials and one tuned with 200 are interchangeable, so they share a key.
TUNING_OPTIONS = frozenset(
    {
        "trials",
        "time_budget",
        "cache_dir",
        "storage",
        "sampler",
        "verify",
        "isolate",
        "measurer",
        "top_k",
        "progress",
        "study_name",
        "strict",
        "seed",
        "retune",
        "polish",
    }
)

KEY_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")  # the form of a cache key
STALE_SECONDS = 3600.0  # leftover temp / trash directories older than this are swept


class CacheMiss(LookupError):
    """No usable cached plan for this function and these inputs (raised by strict ``load``)."""


class CacheWarning(UserWarning):
    """A cache entry that cannot be used (corrupt, truncated, another format)."""


class CacheMissWarning(CacheWarning):
    """``load`` found no usable plan and runs the function in eager."""


class CorruptEntry(Exception):
    """An entry (or bundle) that cannot be used; ``file`` names the culprit, ``problem`` says why."""

    def __init__(self, file: Path, problem: str) -> None:
        super().__init__(f"{file}: {problem}")
        self.file = file
        self.problem = problem


# ---------------------------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceInfo:
    """What the generated code is compiled for: a CUDA device, or the CPU interpreter."""

    kind: str  # "cuda" | "cpu"
    name: str  # the GPU's name, or "cpu-interpreter"
    capability: tuple[int, int] | None = None

    @classmethod
    def current(cls, device: torch.device | str | None = None) -> DeviceInfo:
        """``device``'s GPU (CUDA device 0 when None and CUDA is available), else the interpreter."""
        if device is not None:
            device = torch.device(device)
            if device.type != "cuda":
                return cls("cpu", "cpu-interpreter")
            index = device.index if device.index is not None else 0
        elif torch.cuda.is_available():
            index = 0
        else:
            return cls("cpu", "cpu-interpreter")
        cap = torch.cuda.get_device_capability(index)
        return cls("cuda", torch.cuda.get_device_name(index), (int(cap[0]), int(cap[1])))

    def tag(self) -> str:
        if self.kind != "cuda":
            return self.name
        major, minor = self.capability or (0, 0)
        return f"{self.name} sm_{major}{minor}"


def inputs_device(example_inputs: Any) -> torch.device | None:
    """The device of the first tensor among the example inputs (None when there is none)."""
    import torch.utils._pytree as pytree

    for leaf in pytree.tree_leaves(tuple(example_inputs)):
        if isinstance(leaf, torch.Tensor):
            return leaf.device
    return None


def triton_version() -> str:
    """The installed Triton's version ("none" without Triton): part of every key and build record."""
    try:
        import triton
    except ImportError:  # pragma: no cover - triton is a dependency
        return "none"
    return str(getattr(triton, "__version__", "unknown"))


def source_hash(root: Path) -> str:
    """A hash of the ``.py`` files under ``root`` (their paths and bytes, in path order)."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@functools.cache
def generator_id() -> str:
    """The code generator's identity: a hash of the package's source files (computed once per
    process). Every key holds it, so a plan cached by other code (a rounding fix, a new
    kernel template) is never served by this one, whatever ``__version__`` says."""
    try:
        return source_hash(Path(__file__).resolve().parents[1])
    except OSError:  # pragma: no cover - sources that cannot be read: the version alone
        return "unknown"


def key_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """The options that take part in the key: all but :data:`TUNING_OPTIONS`."""
    return {k: v for k, v in (options or {}).items() if k not in TUNING_OPTIONS}


def _scalar_repr(v: Any) -> str:
    return f"{type(v).__name__}:{v!r}"


def key_parts(captured: Captured, device: DeviceInfo, options: dict | None = None) -> dict:
    """What the key hashes, readable (plan.json stores it, to explain a miss); a graph whose
    plan may call a library with versions of its own adds them (the cuDNN version where it
    holds a CUDA SDPA op: its cuDNN backend's support and speed change by version)."""
    opts = key_options(options)
    return {
        **library_key_parts(captured.graph),
        "format": CACHE_FORMAT,
        "graph": captured.graph.key,
        "nodes": len(captured.graph.nodes),
        "scalars": [_scalar_repr(s) for s in captured.scalars],
        "leaf_kinds": list(captured.leaf_kinds),
        "param_names": list(captured.param_names),
        "in_spec": str(captured.in_spec),
        "out_spec": str(captured.out_spec),
        "device": device.tag(),
        "torch": str(torch.__version__),
        "triton": triton_version(),
        "autofuse": __version__,
        "generator": generator_id(),
        "options": repr(sorted((str(k), repr(v)) for k, v in opts.items())),
    }


def plan_key(captured: Captured, device: DeviceInfo, options: dict | None = None) -> str:
    """A hash of everything that changes the generated code or the output of the plan."""
    return key_of_parts(key_parts(captured, device, options))


def key_of_parts(parts: dict) -> str:
    """The key of :func:`key_parts` (a bundle imported for another device is re-keyed)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def key_for(captured: Captured, example_inputs: Any, options: dict | None = None) -> str:
    """The key ``load`` computes: the device is the example inputs' (what ``optimize`` must use)."""
    return plan_key(captured, DeviceInfo.current(inputs_device(example_inputs)), options)


def valid_key(key: Any) -> bool:
    """Whether ``key`` has the form of a cache key (not whether such an entry exists)."""
    return isinstance(key, str) and bool(KEY_RE.match(key))


def check_key(key: str) -> None:
    """Raise ValueError unless ``key`` has the form of a cache key (``valid_key``)."""
    if not isinstance(key, str) or not KEY_RE.match(key):
        raise ValueError(
            f"invalid cache key {key!r}: expected letters, digits, '_', '-' or '.' "
            "(plan_key makes one)"
        )
