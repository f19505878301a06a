"""Triton GEMM kernel template: a source-code generator with prologue/epilogue hooks.

The fusion compiler describes one GEMM kernel with a :class:`GemmSpec` (name, batching,
extra arguments, and *hooks* that return source lines) and :func:`render` turns it into
the Python source of one ``@triton.jit`` kernel. :func:`load_kernel` writes that source to
a file and imports it (``triton.jit`` needs a real file for ``inspect.getsource``).

Computation
-----------
``acc[M, N] = A[M, K] @ B[K, N]`` accumulated in fp32, per batch when ``batched``; with
``n_b == 2`` (horizontal fusion) ``acc0 = A @ B`` and ``acc1 = A @ B1`` share the A tile.
Then the epilogue hook runs and does all the stores. Transposed operands are expressed
purely through strides (pass ``w.t()`` and its strides), never through copies.

Kernel arguments, in this order
-------------------------------
``a_ptr, b_ptr, [b1_ptr], M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
[stride_b1k, stride_b1n], [stride_ab, stride_bb, [stride_b1b]], *extra_params,
BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr``
(``[...]``: only with ``n_b == 2`` / only when ``batched``). Batch strides may be 0 (a
broadcast operand). :func:`param_names` returns the runtime names in order; :func:`launch`
launches by keyword. An ``extra_params`` entry is emitted verbatim, so ``"ACT: tl.constexpr"``
declares a constexpr (its name is the part before ``:``).

Hook calling convention
-----------------------
A hook is a zero-argument callable returning a list of source lines (a plain list/tuple
of strings is accepted too). Lines carry no base indentation (the template indents them);
relative indentation inside a hook (an ``if`` block) is kept, and an element containing
``\\n`` is split into lines. Hooks may use any documented name below, the kernel
arguments (including their own ``extra_params``) and ``tl``/``triton``. Hook-local
variables should not reuse template names (prefix them, e.g. ``ep_``).

Names defined for every hook:

* ``pid_m``, ``pid_n``: tile coordinates (after the GROUP_M swizzle); ``pid_b``: batch
  index ``tl.program_id(1)`` (only when ``batched``).
* ``offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)``, ``offs_n`` likewise (1-D, int32).
* ``rm = offs_m[:, None]``, ``rn = offs_n[None, :]``.
* ``mask_m = offs_m < M``, ``mask_n = offs_n < N`` (1-D), ``mask = (rm < M) & (rn < N)``.
* ``a_base``, ``b_base`` (``b1_base``): the operand pointers already advanced to the
  current batch (``a_ptr + pid_b.to(tl.int64) * stride_ab``; equal to ``a_ptr`` when not
  batched).

Inside the K loop (load hooks only) additionally:

* ``k_iter``: the K-chunk number 0, 1, ...;
  ``offs_k = k_iter * BLOCK_K + tl.arange(0, BLOCK_K)``; ``mask_k = offs_k < K``.

Hooks:

* ``load_a`` (prologue on A) must assign ``a``: the [BLOCK_M, BLOCK_K] tile, zero on the
  M and K tails. Default::

      a = tl.load(a_base + rm * stride_am + offs_k[None, :] * stride_ak,
                  mask=mask_m[:, None] & mask_k[None, :], other=0.0)

* ``load_b`` must assign ``b`` ([BLOCK_K, BLOCK_N], zero on K and N tails); ``load_b1``
  (``n_b == 2``) must assign ``b1``. Defaults are the analogous strided loads.
* The template passes ``a``/``b`` to ``tl.dot`` **as they are**: a hook that changes the
  dtype (e.g. fp32 -> bf16) casts itself, and both operands must end up with the same
  dtype. The dot is ``acc = tl.dot(a, b, acc)`` (fp32 accumulation; ``input_precision``
  only when ``GemmSpec.input_precision`` is set).
* ``epilogue`` (required) runs after the K loop with ``acc`` (or ``acc0``, ``acc1``) in
  fp32 [BLOCK_M, BLOCK_N] plus the names above; it computes whatever it needs and issues
  its own ``tl.store`` lines (cast to the output dtype itself, e.g.
  ``.to(out_ptr.dtype.element_ty)``, and store with ``mask=mask``).

Public functions: :func:`render`, :func:`grid`, :func:`param_names`, :func:`launch`,
:func:`load_kernel`; its configs' candidates and pruning are in ``tiles.py``.
"""

from __future__ import annotations

import ast
import keyword
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from autofuse.kernels.common import loader

__all__ = [
    "GemmConfig",
    "GemmSpec",
    "render",
    "grid",
    "param_names",
    "launch",
    "load_kernel",
]


Hook = Callable[[], Sequence[str]] | Sequence[str]


@dataclass(frozen=True)
class GemmConfig:
    SWITCHES: ClassVar[tuple[str, ...]] = (
        "TMA",
        "PERSISTENT",
    )  # the search and the polish switch them
    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int = 8
    num_warps: int = 4
    num_stages: int = 3
    # operands that are plain row-major buffers load through TMA tensor descriptors (the copy
    # engine, out-of-bounds rows zero-filled) instead of pointer arithmetic; the emitter
    # decides which operands qualify
    TMA: bool = False
    # a grid of PERSISTENT programs (the SM count), each looping over output tiles; 0: one
    # program per tile
    PERSISTENT: int = 0

    def smem_bytes(self, dtype_bytes: int, n_b: int = 1) -> int:
        """Shared memory of the pipelined operand buffers."""
        tile = self.BLOCK_M * self.BLOCK_K + self.BLOCK_K * self.BLOCK_N * n_b
        return self.num_stages * tile * dtype_bytes

    def constexprs(self) -> dict[str, int]:
        """Keyword arguments of a launch: the constexprs plus num_warps / num_stages."""
        return {
            "BLOCK_M": self.BLOCK_M,
            "BLOCK_N": self.BLOCK_N,
            "BLOCK_K": self.BLOCK_K,
            "GROUP_M": self.GROUP_M,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
        }

    def label(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return (
            f"BLOCK_M={self.BLOCK_M} BLOCK_N={self.BLOCK_N} BLOCK_K={self.BLOCK_K} "
            f"GROUP_M={self.GROUP_M} num_warps={self.num_warps} num_stages={self.num_stages}"
            + (" TMA" if self.TMA else "")
            + (f" PERSISTENT={self.PERSISTENT}" if self.PERSISTENT else "")
        )


@dataclass(frozen=True)
class GemmSpec:
    name: str
    batched: bool
    extra_params: tuple[str, ...] = ()
    n_b: int = 1
    load_a: Hook | None = None
    load_b: Hook | None = None
    epilogue: Hook | None = None  # required; checked by render()
    load_b1: Hook | None = None  # n_b == 2 only
    doc: str = ""  # what the kernel computes, for the header comment
    setup: Hook | None = None  # lines run once before the K loop (e.g. TMA descriptors)
    input_precision: str | None = None  # e.g. "ieee" / "tf32"; None -> Triton's default


# --------------------------------------------------------------------------------------
# rendering

_INDENT = "    "
_CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")
# locals the template defines; extra params must not shadow them
_TEMPLATE_LOCALS = (
    "pid",
    "pid_m",
    "pid_n",
    "pid_b",
    "num_pid_m",
    "num_pid_n",
    "num_pid_in_group",
    "group_id",
    "first_pid_m",
    "group_size_m",
    "offs_m",
    "offs_n",
    "offs_k",
    "rm",
    "rn",
    "mask_m",
    "mask_n",
    "mask_k",
    "mask",
    "k_iter",
    "a_base",
    "b_base",
    "b1_base",
    "a",
    "b",
    "b1",
    "acc",
    "acc0",
    "acc1",
    "tl",
    "triton",
)


def _param_name(entry: str) -> str:
    return entry.split(":", 1)[0].split("=", 1)[0].strip()


def _standard_params(spec: GemmSpec) -> list[str]:
    p = ["a_ptr", "b_ptr"]
    if spec.n_b == 2:
        p.append("b1_ptr")
    p += ["M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn"]
    if spec.n_b == 2:
        p += ["stride_b1k", "stride_b1n"]
    if spec.batched:
        p += ["stride_ab", "stride_bb"]
        if spec.n_b == 2:
            p.append("stride_b1b")
    return p


def param_names(spec: GemmSpec) -> list[str]:
    """Runtime (non-block-size) kernel argument names, in signature order."""
    return _standard_params(spec) + [_param_name(e) for e in spec.extra_params]


def _hook_lines(hook: Hook, what: str) -> list[str]:
    out = hook() if callable(hook) else hook
    if isinstance(out, str) or not all(isinstance(x, str) for x in out):
        raise TypeError(f"{what} hook must return a list of source lines (str)")
    lines: list[str] = []
    for x in out:
        lines.extend(x.rstrip("\n").split("\n"))
    return lines


def _assigned_names(lines: list[str], what: str) -> set[str]:
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError as e:
        raise ValueError(f"{what} hook produced invalid Python: {e}\n" + "\n".join(lines)) from e
    names: set[str] = set()
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.NamedExpr):
            targets = [node.target]
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name):
                    names.add(n.id)
    return names


def _load_lines(
    hook: Hook | None, var: str, default: list[str], what: str, tile_shape: str
) -> list[str]:
    if hook is None:
        return [f"# {what} tile {tile_shape} (default strided load)"] + default
    lines = _hook_lines(hook, what)
    if var not in _assigned_names(lines, what):
        raise ValueError(f"{what} hook must assign the variable `{var}`:\n" + "\n".join(lines))
    return [f"# {what} tile {tile_shape} (prologue hook)"] + lines


def _validate(spec: GemmSpec) -> None:
    if not spec.name.isidentifier() or keyword.iskeyword(spec.name):
        raise ValueError(f"kernel name {spec.name!r} is not a Python identifier")
    if spec.n_b not in (1, 2):
        raise ValueError(f"n_b must be 1 or 2, got {spec.n_b}")
    if spec.epilogue is None:
        raise ValueError("GemmSpec.epilogue is required (it does the stores)")
    if spec.n_b == 1 and spec.load_b1 is not None:
        raise ValueError("load_b1 is only meaningful with n_b == 2")
    reserved = set(_standard_params(spec)) | set(_CONSTEXPRS) | set(_TEMPLATE_LOCALS)
    seen: set[str] = set()
    for e in spec.extra_params:
        n = _param_name(e)
        if not n.isidentifier() or keyword.iskeyword(n):
            raise ValueError(f"extra param {e!r} is not an identifier")
        if n in reserved:
            raise ValueError(f"extra param {n!r} collides with a template name")
        if n in seen:
            raise ValueError(f"duplicate extra param {n!r}")
        seen.add(n)


_BVar = tuple  # (var, ptr, stride_k, stride_n, stride_batch, base, hook)


def _b_vars(spec: GemmSpec) -> list[_BVar]:
    out = [("b", "b_ptr", "stride_bk", "stride_bn", "stride_bb", "b_base", spec.load_b)]
    if spec.n_b == 2:
        out.append(
            ("b1", "b1_ptr", "stride_b1k", "stride_b1n", "stride_b1b", "b1_base", spec.load_b1)
        )
    return out


def _header(spec: GemmSpec, cfg: GemmConfig | None, b_vars: list[_BVar]) -> list[str]:
    bt = "[b]" if spec.batched else ""
    if spec.n_b == 2:
        what = f"acc0 = A{bt} @ B{bt}, acc1 = A{bt} @ B1{bt}"
    else:
        what = f"acc = A{bt} @ B{bt}"
    head = ["# Generated by autofuse.gemm_template -- do not edit.", f"# kernel: {spec.name}"]
    head += [f"# {d}".rstrip() for d in spec.doc.strip().splitlines()]
    head += [
        f"# computes: {what} (fp32 accumulation over K), then the epilogue (which stores)",
        f"# grid: (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N){', batch' if spec.batched else ''})"
        ", GROUP_M-swizzled tile order",
        "# prologue: "
        + ", ".join(
            f"{v}={'hook' if h is not None else 'strided load'}"
            for v, h in [("a", spec.load_a)] + [(x[0], x[6]) for x in b_vars]
        ),
    ]
    if cfg is not None:
        head.append(f"# rendered for config: {cfg}")
    return head


_TILE_INDEX = [
    "num_pid_m = tl.cdiv(M, BLOCK_M)",
    "num_pid_n = tl.cdiv(N, BLOCK_N)",
    "num_pid_in_group = GROUP_M * num_pid_n",
    "group_id = pid // num_pid_in_group",
    "first_pid_m = group_id * GROUP_M",
    "group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)",
    "pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)",
    "pid_n = (pid % num_pid_in_group) // group_size_m",
    "",
    "# ---- tile indices and masks",
    "offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
    "offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
    "rm = offs_m[:, None]",
    "rn = offs_n[None, :]",
    "mask_m = offs_m < M",
    "mask_n = offs_n < N",
    "mask = (rm < M) & (rn < N)",
    "",
]


def _program_ids(spec: GemmSpec, persistent: int) -> list[str]:
    """Program id -> (pid_m, pid_n), grouped for L2 reuse, and the tile's indices and masks."""
    ids = ["# ---- program id -> (pid_m, pid_n): grouped ordering for L2 reuse"]
    ids.append("pid = tile" if persistent else "pid = tl.program_id(0)")
    if spec.batched:
        ids.append("pid_b = tl.program_id(1)")
    return ids + _TILE_INDEX


def _bases(spec: GemmSpec, b_vars: list[_BVar]) -> list[str]:
    """Operand base pointers (advanced to the program's batch), then the setup hook."""
    bases = [
        "# ---- operand base pointers" + (" (advanced to batch pid_b)" if spec.batched else "")
    ]
    if spec.batched:
        bases.append("a_base = a_ptr + pid_b.to(tl.int64) * stride_ab")
        for _, ptr, _, _, sb, base, _ in b_vars:
            bases.append(f"{base} = {ptr} + pid_b.to(tl.int64) * {sb}")
    else:
        bases.append("a_base = a_ptr")
        for _, ptr, _, _, _, base, _ in b_vars:
            bases.append(f"{base} = {ptr}")
    bases += [""]
    if spec.setup is not None:
        bases += ["# ---- setup (hook)"] + _hook_lines(spec.setup, "setup") + [""]
    return bases


def _k_loop_body(spec: GemmSpec, b_vars: list[_BVar], accs: list[str]) -> list[str]:
    """One K step: the operand tiles (strided loads or prologue hooks), then the dots."""
    loop = ["offs_k = k_iter * BLOCK_K + tl.arange(0, BLOCK_K)", "mask_k = offs_k < K"]
    a_load = [
        "a = tl.load(",
        "    a_base + rm * stride_am + offs_k[None, :] * stride_ak,",
        "    mask=mask_m[:, None] & mask_k[None, :],",
        "    other=0.0,",
        ")",
    ]
    loop += _load_lines(spec.load_a, "a", a_load, "A", "[BLOCK_M, BLOCK_K]")
    for var, _, sk, sn, _, base, hook in b_vars:
        b_load = [
            f"{var} = tl.load(",
            f"    {base} + offs_k[:, None] * {sk} + rn * {sn},",
            "    mask=mask_k[:, None] & mask_n[None, :],",
            "    other=0.0,",
            ")",
        ]
        name = "B" if var == "b" else "B1"
        loop += _load_lines(hook, var, b_load, name, "[BLOCK_K, BLOCK_N]")
    prec = f", input_precision={spec.input_precision!r}" if spec.input_precision else ""
    loop.append("# fp32 accumulation; operands go to tl.dot as loaded")
    for acc, (var, *_rest) in zip(accs, b_vars):
        loop.append(f"{acc} = tl.dot(a, {var}, {acc}{prec})")
    return loop


def _tile(spec: GemmSpec, b_vars: list[_BVar]) -> list[str]:
    """One output tile: zeroed accumulators, the K loop, the epilogue hook."""
    accs = ["acc0", "acc1"] if spec.n_b == 2 else ["acc"]
    tile = [f"{acc} = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)" for acc in accs]
    tile += ["", "# ---- main loop over K", "for k_iter in range(0, tl.cdiv(K, BLOCK_K)):"]
    tile += [_INDENT + x if x else x for x in _k_loop_body(spec, b_vars, accs)]
    tile += ["", f"# ---- epilogue (hook): {', '.join(accs)} fp32 [BLOCK_M, BLOCK_N] -> stores"]
    return tile + _hook_lines(spec.epilogue, "epilogue")


def _body(spec: GemmSpec, b_vars: list[_BVar], persistent: int) -> list[str]:
    ids, bases, tile = _program_ids(spec, persistent), _bases(spec, b_vars), _tile(spec, b_vars)
    if not persistent:
        return ids + bases + tile
    body = bases + [
        f"# ---- persistent: {persistent} programs, each walks the output tiles",
        f"# program_id, program_id + {persistent}, ... (setup is done once per program)",
        "num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)",
        f"for tile in tl.range(tl.program_id(0), num_tiles, {persistent}, flatten=True):",
    ]
    return body + [_INDENT + x if x else x for x in ids + tile]


def render(spec: GemmSpec, cfg: GemmConfig | None = None) -> str:
    """Full Python source of one ``@triton.jit`` kernel (importable on its own).

    Block sizes are constexpr *arguments*, so one source serves every config of a shape;
    ``cfg`` (optional) is recorded in the header comment, and its ``PERSISTENT`` count, when
    set, makes the kernel a loop over output tiles on that many programs.
    """
    _validate(spec)
    persistent = cfg.PERSISTENT if cfg is not None else 0
    if persistent and spec.batched:
        raise ValueError("PERSISTENT configs are for 2-D GEMMs (a batched grid has a batch axis)")
    b_vars = _b_vars(spec)
    params = _standard_params(spec) + list(spec.extra_params)
    params += [f"{c}: tl.constexpr" for c in _CONSTEXPRS]
    src = ["import triton", "import triton.language as tl", "", ""]
    src += _header(spec, cfg, b_vars)
    src += ["@triton.jit", f"def {spec.name}("]
    src += [f"{_INDENT}{p}," for p in params]
    src += ["):"]
    src += [_INDENT + x if x.strip() else "" for x in _body(spec, b_vars, persistent)]
    text = "\n".join(src) + "\n"
    try:
        compile(text, f"<autofuse kernel {spec.name}>", "exec")
    except SyntaxError as e:
        numbered = "\n".join(f"{i + 1:4d} {ln}" for i, ln in enumerate(text.splitlines()))
        raise ValueError(f"rendered kernel {spec.name} is invalid Python: {e}\n{numbered}") from e
    return text


# --------------------------------------------------------------------------------------
# launching


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def grid(spec: GemmSpec, cfg: GemmConfig, M: int, N: int, batch: int = 1) -> tuple[int, ...]:
    """Launch grid: ``(cdiv(M, BM) * cdiv(N, BN),)``, plus ``batch`` on axis 1 if batched."""
    tiles = _cdiv(M, cfg.BLOCK_M) * _cdiv(N, cfg.BLOCK_N)
    if cfg.PERSISTENT and not spec.batched and batch == 1:
        return (min(tiles, cfg.PERSISTENT),)
    if spec.batched:
        if batch > 65535:
            raise ValueError(f"batch {batch} exceeds the grid's axis-1 limit (65535)")
        return (tiles, batch)
    if batch != 1:
        raise ValueError("batch != 1 for a non-batched spec")
    return (tiles,)


def launch(kernel: Any, spec: GemmSpec, cfg: GemmConfig, batch: int = 1, **args: Any) -> Any:
    """Launch ``kernel`` with keyword ``args`` (every name of :func:`param_names`)."""
    names = param_names(spec)
    missing = [n for n in names if n not in args]
    unknown = [n for n in args if n not in names]
    if missing or unknown:
        raise TypeError(f"{spec.name}: missing args {missing}, unknown args {unknown}")
    g = grid(spec, cfg, int(args["M"]), int(args["N"]), batch)
    return kernel[g](**args, **cfg.constexprs())


# --------------------------------------------------------------------------------------
# loading generated source


def load_kernel(src: str, name: str) -> Any:
    """Import a rendered template (``kernels.common.loader``) and return ``module.<name>``."""
    return loader.load_kernel(src, name)
