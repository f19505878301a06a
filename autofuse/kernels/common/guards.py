"""Bounds guards for generated kernels on a GPU (``AUTOFUSE_CHECK_BOUNDS=1``).

Triton's interpreter checks every access itself (``autofuse/bounds.py``); a compiled kernel
cannot, so the loader builds a guarded variant of its source instead, whatever kind of kernel
it is. Every ``tl.load`` / ``tl.store`` / ``tl.atomic_*`` whose pointer is a pointer argument
plus an offset (``in_ptr0 + (x0 + 8 * x1)``) gets a ``tl.device_assert`` before its statement:
the offset lies in ``[0, extent)`` on every lane its mask keeps, where ``extent`` is a new
argument (``<name>_af_extent``) holding the number of elements the tensor passed there spans.
:class:`GuardedKernel` computes the extents from the tensors at each launch and passes them by
keyword; the kernel is built in Triton's debug mode, so a failed guard traps with a message
naming the kernel, the line and the argument. Tensor descriptors (TMA) are bounded by the
hardware; an argument the kernel reassigns is left unguarded.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

_ACCESSES = {"load": 1, "store": 2}  # tl.<name> -> position of its mask argument
_ATOMICS = ("atomic_add", "atomic_max", "atomic_min", "atomic_and", "atomic_or", "atomic_xor")
_ATOMICS += ("atomic_xchg",)
SUFFIX = "_af_extent"


@dataclass(frozen=True)
class Guarded:
    """A kernel's guarded source and, per guarded pointer argument, its extent argument."""

    source: str
    extents: tuple[tuple[str, str], ...]


def _is_constexpr(arg: ast.arg) -> bool:
    return arg.annotation is not None and "constexpr" in ast.unparse(arg.annotation)


def _access(node: ast.AST) -> tuple[ast.expr, ast.expr | None, str] | None:
    """(pointer, mask or None, name) of a ``tl.load`` / ``tl.store`` / atomic call."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    f = node.func
    if not (isinstance(f.value, ast.Name) and f.value.id == "tl" and node.args):
        return None
    at = _ACCESSES.get(f.attr, 2 if f.attr in _ATOMICS else None)
    if at is None:
        return None
    kw = {k.arg: k.value for k in node.keywords}
    mask = node.args[at] if len(node.args) > at else kw.get("mask")
    if isinstance(mask, ast.Constant) and mask.value is None:
        mask = None
    return node.args[0], mask, f.attr


def _split(ptr: ast.expr, params: set[str]) -> tuple[str, ast.expr] | None:
    """``param + a + b`` -> (param, ``a + b``); None for any other pointer expression."""
    terms: list[ast.expr] = []
    stack = [ptr]
    while stack:
        e = stack.pop()
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Add):
            stack += [e.right, e.left]
        else:
            terms.append(e)
    roots = [t for t in terms if isinstance(t, ast.Name) and t.id in params]
    if len(roots) != 1 or len(terms) < 2:
        return None
    rest = [t for t in terms if t is not roots[0]]
    offset = rest[0]
    for t in rest[1:]:
        offset = ast.BinOp(offset, ast.Add(), t)
    return roots[0].id, offset


def _guard(access: tuple, params: set[str], kernel: str, line: int) -> tuple[str, ast.stmt] | None:
    ptr, mask, what = access
    split = _split(ptr, params)
    if split is None:
        return None
    name, off = split
    o = f"({ast.unparse(off)})"
    ok = f"(({o} >= 0) & ({o} < {name}{SUFFIX}))"
    if mask is not None:
        ok = f"({ok} | {inactive(ast.unparse(mask))})"
    msg = f"autofuse bounds: kernel {kernel} line {line}: tl.{what} outside argument {name}"
    return name, ast.parse(f"tl.device_assert({ok}, {msg!r})").body[0]


def inactive(mask: str) -> str:
    """The lanes ``mask`` leaves out, as a condition that stays boolean where ``mask`` folds to
    a Python bool (a mask of constant indices): ``~True`` is the integer -2, and a GPU build
    rejects an assert on an integer (the interpreter took it)."""
    return f"(({mask}) == 0)"


def _reassigned(fn: ast.FunctionDef) -> set[str]:
    out = set()
    for node in ast.walk(fn):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For)):
            targets = [node.target]
        for t in targets:
            out |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
    return out


class _Guards(ast.NodeTransformer):
    def __init__(self, params: set[str], kernel: str) -> None:
        self.params, self.kernel, self.used = params, kernel, set()

    def generic_visit(self, node: ast.AST) -> Any:
        for field in ("body", "orelse"):
            body = getattr(node, field, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                setattr(node, field, [s for stmt in body for s in self._stmt(stmt)])
        return node

    def _stmt(self, stmt: ast.stmt) -> list[ast.stmt]:
        self.generic_visit(stmt)
        if not isinstance(stmt, (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return)):
            return [stmt]
        out = []
        for node in ast.walk(stmt):
            access = _access(node)
            guard = access and _guard(access, self.params, self.kernel, stmt.lineno)
            if guard:
                self.used.add(guard[0])
                out.append(ast.copy_location(guard[1], stmt))
        return [*out, stmt]


def guard_source(source: str, name: str) -> Guarded:
    """``source`` with its kernel ``name``'s accesses guarded (unchanged where none can be)."""
    tree = ast.parse(source)
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if fn is None or fn.args.defaults or fn.args.vararg or fn.args.kwarg or fn.args.kwonlyargs:
        return Guarded(source, ())
    args = fn.args.args
    params = {a.arg for a in args if not _is_constexpr(a)} - _reassigned(fn)
    guards = _Guards(params, name)
    guards.generic_visit(fn)
    if not guards.used:
        return Guarded(source, ())
    used = [a.arg for a in args if a.arg in guards.used]
    last = max(i for i, a in enumerate(args) if not _is_constexpr(a))
    fn.args.args = [*args[: last + 1], *(ast.arg(p + SUFFIX) for p in used), *args[last + 1 :]]
    return Guarded(
        ast.unparse(ast.fix_missing_locations(tree)) + "\n", tuple((p, p + SUFFIX) for p in used)
    )


def span(value: Any) -> int:
    """The number of elements a tensor argument reaches from its first one (0 for none)."""
    t = getattr(value, "base", value) if not hasattr(value, "stride") else value
    if not hasattr(t, "stride") or t.numel() == 0:
        return 0
    return sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0) + 1


class GuardedKernel:
    """A guarded kernel launched as the unguarded one is: ``k[grid](*args, **meta)``; the
    extents are computed from the tensors and passed by keyword."""

    def __init__(self, fn: Any, extents: tuple[tuple[str, str], ...]) -> None:
        self.fn, self.extents = fn, extents
        fn.debug = True  # device asserts on
        hidden = {e for _, e in extents}
        self.arg_names = [n for n in fn.arg_names if n not in hidden]

    def __getitem__(self, grid: Any) -> Any:
        launch = self.fn[grid]

        def run(*args: Any, **kwargs: Any) -> Any:
            bound = dict(zip(self.arg_names, args)) | kwargs
            return launch(*args, **kwargs, **{e: span(bound.get(p)) for p, e in self.extents})

        return run

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fn, name)
