"""One settings object, read from the environment once, and one target description.

``settings()`` reads every ``AUTOFUSE_*`` variable in one place (``reload_settings()`` reads
them again, for tests and for programs that change the environment on purpose):

- ``AUTOFUSE_CACHE_DIR``: the cache home: plans with their kernels and compiled binaries
  (``plans/``), readable copies of kernel sources (``kernels/``) and tuning studies (the SQLite file);
  default a per-user folder, ``$XDG_CACHE_HOME/autofuse`` or ``~/.cache/autofuse``. A
  ``cache_dir=`` argument overrides it; ``cache_dir=None`` everywhere means the home
  (``cache_home()``).
- ``AUTOFUSE_KERNEL_DIR``: where readable copies of generated kernels are written for
  ``output_code`` (kernels run from their verified text, never from these files); default
  ``<cache home>/kernels``.
- ``AUTOFUSE_SIGNING_KEY``: a secret (16 characters or more) that signs cache entries, call
  records, binaries and bundle manifests (HMAC-SHA256); when set, ``load`` and
  ``cache import`` accept only what it signed (``autofuse/cache/trust.py``, ``docs/trust.md``).
- ``AUTOFUSE_STRICT``: a kernel that fails to build raises instead of running its ops in eager.
- ``AUTOFUSE_LEAN_LAUNCH``: after a kernel's first call, launch its binary directly (default on).
- ``AUTOFUSE_DIRECT_LAUNCH``: on the lean path, launch the binary with torch's static CUDA
  launcher (one C++ call) instead of Triton's Python launch (default on;
  ``autofuse/plan/direct_launch.py``).
- ``AUTOFUSE_SPLIT_REDUCTIONS``: ``auto`` (default: split long reductions with few outputs in two
  stages, ``ir/split.py``, when the captured inputs are CUDA tensors), ``1`` (always, the
  interpreter too), ``0`` (never). ``AUTOFUSE_SPLIT_MIN_RNUMEL``: the shortest reduced extent
  split (default 4096; tests lower it).
- ``AUTOFUSE_INTERPRETER_BLOCK``: the largest block a pointwise kernel's default config takes
  under Triton's interpreter (default 1024, as on a GPU; a power of two up to 65536). There a
  program is a numpy evaluation of each op over its block at a fixed cost per op: a 224 x 224
  MobileNetV1 forward (28 kernels) took 5.8 s a call with 1024-element blocks, 1.1 s with
  16384 (``experiments.kernelbench``'s CPU mode sets it). The source is the same; only the
  launch's block and grid change.
- ``AUTOFUSE_CHECK_BOUNDS``: check every load and store of every generated kernel against the
  buffers of its launch; an access outside all of them raises :class:`OutOfBoundsAccess` naming
  the kernel, the nearest buffer and the offsets (``autofuse/bounds.py``; default off).
- ``AUTOFUSE_CONV_BIAS``: where a convolution's bias is added: ``kernel`` (default: the library
  convolution runs without it and the bias add joins the generated epilogue kernel, its
  gradient a generated sum; ``capture/convolution.py``) or ``library`` (inside the library call,
  as eager does); an unknown value warns and means ``kernel``.
- ``AUTOFUSE_CONV_LAYOUT``: each convolution's memory format: ``measure`` (default: timed once
  in each on a CUDA device, eager's layout on a CPU; ``ir/conv_layout.py``), ``eager``,
  ``contiguous`` or ``channels_last`` (forced, any device); an unknown value warns and means
  ``measure``.
- ``AUTOFUSE_BN_FOLD``: inference BatchNorm after a convolution (``ir/conv_fold.py``):
  ``measure`` (default: kept as a per-channel scale and shift in the epilogue kernel; on CUDA
  the plan with it folded into the convolution's weight is timed beside), ``fold`` (folded
  wherever it can be) or ``keep`` (never folded); an unknown value warns and means
  ``measure``.
- ``AUTOFUSE_REDUCTION_ORDER``: the order a row reduction walks its row in: ``domain``
  (default: the row's logical order) or ``stride`` (an experiment: where the row is two digits
  of the buffer it reads, the one with the smaller stride walked innermost: a GroupNorm row of
  a channels-last result, its channels then its pixels, walks each pixel's channels together;
  ``kernels/common/row_order.py``); an unknown value warns and means ``domain``.
- ``AUTOFUSE_TIME_CONFIGS``: an untuned plan on CUDA times the few launch configs its kernels'
  kinds offer (``plan/config_choice.py``) and keeps the fastest (default on; ``0``: the kinds'
  default configs, untimed).
- ``AUTOFUSE_SDPA``: which SDPA backend runs attention the torch.compile backend keeps whole:
  ``auto`` (default: the backend torch picked when tracing, or on CUDA the fastest offered one,
  timed end to end; ``kernels/library/sdpa.py``), or ``cudnn``, ``flash``, ``efficient`` or
  ``math`` (that backend wherever it applies, untimed; elsewhere the op as traced), or
  ``autofuse`` (every inference forward that can be written out runs as autofuse's own
  attention kernel, untimed: ``frontend/sdpa_written.py``; the others by the rule); an unknown
  value warns and means ``auto``.
- ``AUTOFUSE_CONV_KERNEL``: which forward convolutions may run as autofuse's own implicit-GEMM
  kernel (``kernels/conv``) beside the library call: ``rule`` (default: every one the kind
  takes is a choice the search measures; a plan chosen without measuring keeps the library
  call: ``kernels/conv/rule.py``), ``kernel`` (the
  kernel wherever the kind takes the convolution, measured or not) or ``library`` (never: every
  convolution is its library call, as before the kind existed); an unknown value warns and
  means ``rule``.
- ``AUTOFUSE_LOGS``: comma-separated log topics (``output_code``, ``search``, ``cache``,
  ``+autofuse``, ``all``); an unknown topic is ignored with one ``SettingsWarning`` naming the
  valid ones.

``target()`` describes the device kernels are built and modeled for (kind, multiprocessors, L2,
shared memory per block): the CUDA device when there is one, else an H100/H200-class default
for the interpreter and the cost model. It is passed down instead of asking torch everywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path

from autofuse.interpreter import interpreting

LOG_TOPICS = frozenset({"output_code", "search", "cache", "+autofuse", "all"})


def _flag(name: str, default: bool) -> bool:
    v = os.environ.get(name)
    if v is None:
        return default
    return v.strip().lower() not in ("", "0", "false", "no", "off")


def _cache_home() -> Path:
    root = os.environ.get("AUTOFUSE_CACHE_DIR")
    if root:
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "autofuse"


def parse_logs(value: str) -> frozenset[str]:
    """The topics of an ``AUTOFUSE_LOGS`` value; an unknown one raises naming the valid ones."""
    topics = frozenset(t.strip() for t in value.split(",") if t.strip())
    unknown = sorted(topics - LOG_TOPICS)
    if unknown:
        raise ValueError(
            f"AUTOFUSE_LOGS: unknown topic(s) {unknown}; valid topics: {sorted(LOG_TOPICS)}"
        )
    return topics


class SettingsWarning(UserWarning):
    """An ``AUTOFUSE_*`` variable with a value autofuse cannot use: what it does instead."""


def _log_topics() -> frozenset[str]:
    """``AUTOFUSE_LOGS``'s topics: an unknown one is left out with one warning naming the
    valid ones (read at ``import autofuse``: a typo must not stop the import)."""
    value = os.environ.get("AUTOFUSE_LOGS", "")
    try:
        return parse_logs(value)
    except ValueError as e:
        import warnings

        warnings.warn(f"autofuse: {e}; the unknown ones are ignored", SettingsWarning, stacklevel=4)
        return frozenset(t.strip() for t in value.split(",")) & LOG_TOPICS


@dataclass(frozen=True)
class Settings:
    cache_dir: Path
    kernel_dir: Path
    strict: bool
    lean_launch: bool
    logs: frozenset[str]
    direct_launch: bool = True
    split_reductions: str = "auto"  # "auto" (CUDA inputs), "on", "off"
    split_min_rnumel: int = 4096
    interpreter_block: int = 1024
    check_bounds: bool = False
    conv_bias: str = "kernel"  # "kernel" (peeled into the epilogue) or "library"
    conv_layout: str = "measure"  # "measure", "eager", "contiguous", "channels_last"
    sdpa: str = "auto"  # "auto", an SDPA backend (cudnn, flash, efficient, math) or "autofuse"
    conv_kernel: str = "rule"  # "rule", "kernel", "library"
    bn_fold: str = "measure"  # "measure", "fold", "keep"
    time_configs: bool = True  # untuned plans on a GPU time their kernels' quick configs
    reduction_order: str = "domain"  # "domain", "stride" (kernels/common/row_order.py)
    signing_key: bytes | None = field(default=None, repr=False)


def _split_mode() -> str:
    v = os.environ.get("AUTOFUSE_SPLIT_REDUCTIONS", "auto").strip().lower()
    if v in ("", "auto"):
        return "auto"
    return "on" if _flag("AUTOFUSE_SPLIT_REDUCTIONS", False) else "off"


@lru_cache(maxsize=1)
def settings() -> Settings:
    cache = _cache_home()
    kernels = os.environ.get("AUTOFUSE_KERNEL_DIR")
    return Settings(
        cache_dir=cache,
        kernel_dir=Path(kernels).expanduser() if kernels else cache / "kernels",
        strict=_flag("AUTOFUSE_STRICT", False),
        lean_launch=_flag("AUTOFUSE_LEAN_LAUNCH", True),
        direct_launch=_flag("AUTOFUSE_DIRECT_LAUNCH", True),
        logs=_log_topics(),
        split_reductions=_split_mode(),
        split_min_rnumel=int(os.environ.get("AUTOFUSE_SPLIT_MIN_RNUMEL", "4096")),
        interpreter_block=_interpreter_block(),
        check_bounds=_flag("AUTOFUSE_CHECK_BOUNDS", False),
        conv_bias=_choice("AUTOFUSE_CONV_BIAS", CONV_BIAS),
        conv_layout=_choice("AUTOFUSE_CONV_LAYOUT", CONV_LAYOUT),
        sdpa=_choice("AUTOFUSE_SDPA", SDPA),
        conv_kernel=_choice("AUTOFUSE_CONV_KERNEL", CONV_KERNEL),
        bn_fold=_choice("AUTOFUSE_BN_FOLD", BN_FOLD),
        time_configs=_flag("AUTOFUSE_TIME_CONFIGS", True),
        reduction_order=_choice("AUTOFUSE_REDUCTION_ORDER", REDUCTION_ORDER),
        signing_key=_signing_key(),
    )


CONV_BIAS = ("kernel", "library")
CONV_LAYOUT = ("measure", "eager", "contiguous", "channels_last")
SDPA = ("auto", "cudnn", "flash", "efficient", "math", "autofuse")
CONV_KERNEL = ("rule", "kernel", "library")
BN_FOLD = ("measure", "fold", "keep")
REDUCTION_ORDER = ("domain", "stride")


def _choice(name: str, choices: tuple[str, ...]) -> str:
    """Variable ``name``: one of ``choices``; unset or anything else is the first (with a
    warning naming the valid ones)."""
    value = os.environ.get(name, "").strip().lower() or choices[0]
    if value in choices:
        return value
    import warnings

    warnings.warn(
        f"autofuse: {name}={value!r} is not one of {list(choices)}; using {choices[0]!r}",
        SettingsWarning,
        stacklevel=4,
    )
    return choices[0]


def _interpreter_block() -> int:
    value = os.environ.get("AUTOFUSE_INTERPRETER_BLOCK", "").strip() or "1024"
    n = int(value) if value.isdigit() else 0
    if n < 1024 or n > 65536 or n & (n - 1):
        raise ValueError(
            f"AUTOFUSE_INTERPRETER_BLOCK={value!r}: expected a power of two from 1024 to 65536"
        )
    return n


def _signing_key() -> bytes | None:
    value = os.environ.get("AUTOFUSE_SIGNING_KEY")
    if not value:
        return None
    if len(value) < 16:
        raise ValueError(
            f"AUTOFUSE_SIGNING_KEY is {len(value)} characters long; a signing key needs 16 or "
            "more (e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`)"
        )
    return value.encode()


def cache_home(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir`` itself, or the settings' cache home when it is None."""
    return settings().cache_dir if cache_dir is None else Path(cache_dir)


def reload_settings() -> Settings:
    """Read the environment again (tests; programs that set AUTOFUSE_* after import)."""
    settings.cache_clear()
    return settings()


@dataclass(frozen=True)
class Target:
    """The device kernels are generated, modeled and cached for."""

    kind: str  # "cuda" or "cpu" (the interpreter)
    name: str
    sm_count: int
    l2_bytes: int
    smem_bytes: int  # shared memory per block

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"


HOPPER = Target("cpu", "cpu (modeled as an H100/H200-class GPU)", 132, 50 * 2**20, 232448)


@cache
def target(device_index: int | None = None) -> Target:
    """The CUDA device ``device_index`` (default: the current one), or ``HOPPER``'s description
    where kernels run in Triton's interpreter or there is no GPU."""
    import torch

    if interpreting() or not torch.cuda.is_available():
        return HOPPER
    idx = torch.cuda.current_device() if device_index is None else device_index
    p = torch.cuda.get_device_properties(idx)
    smem = int(getattr(p, "shared_memory_per_block_optin", 0)) or HOPPER.smem_bytes
    return Target(
        "cuda",
        torch.cuda.get_device_name(idx),
        int(p.multi_processor_count),
        int(getattr(p, "L2_cache_size", 0)) or HOPPER.l2_bytes,
        smem,
    )
