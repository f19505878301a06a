"""Runtime sizes in a loop kernel's index arithmetic: literals that differ between the shapes of
one traced graph become kernel arguments.

A dynamic size that shows up in the index arithmetic (a transposed sequence dim: ``224 *
(xindex // 224) + 32 * ((xindex // 16) % 7)``) changes the kernel's text at every shape. While
a traced graph with runtime sizes compiles its shapes (``sizes.runtime_sizes`` with a bucket
that names its ``scope``), each loop kernel's integer literals in its plain statements (no
block shapes, no ``tl.arange``, no constant assignments) are compared with those of the same
kernel (same name, same text around them) at the scope's earlier shapes: the positions that
differed become arguments ``ks0, ks1...``, passed their values at this shape. The kernel's text
with those values in place is exactly the text generated at this shape, so the kernel is
correct by construction; its text, and the kernel built, is then shared by every later shape
whose literals differ at those positions alone. Literals equal at every shape stay constants.
A kind whose block shapes are all constexpr names (the GEMM template: ``offs_m[:, None]``) asks
for ``subscripts``: a line with a subscript is then eligible outside its brackets. A kind that
can render its kernel as at other sizes itself (the attention kind: its strides with the
sequence dims grown) makes the literals that differ arguments at the first shape already
(:func:`with_probe_arguments`); their names continue the ``ks`` numbering.
"""

from __future__ import annotations

import re
import threading
from dataclasses import replace

from autofuse.kernels.common.base import Kernel
from autofuse.kernels.common.sizes import runtime_bucket

__all__ = ["with_probe_arguments", "with_size_arguments"]

# a string (skipped) or an integer literal that is not part of a name or a float
_TOKEN = re.compile(r"""('[^']*'|"[^"]*")|(?<![\w.])(\d+)(?![\w.])""")
# statements whose integers may need to be compile-time constants: left as they are
_BLOCKED = ("[", "tl.arange", "tl.full", "tl.zeros", "tl.reshape", "tl.static_range", "range(",
            "tl.constexpr", "tl.broadcast_to", "tl.multiple_of", "tl.max_contiguous",
            "tl.max_constancy", "axis=")  # fmt: skip
_CONSTANTS = re.compile(r"^\s*\w+ = \d+(\s*;\s*\w+ = \d+)*\s*$")  # ``rnumel = 32``
_SEEN: dict[tuple, tuple[tuple[int, ...], frozenset[int]]] = {}  # -> (literals, varying)
_LOCK = threading.Lock()


def _literals(
    source: str, name: str, subscripts: bool = False
) -> tuple[list[tuple[int, int, int]], str]:
    """(the eligible literals of the kernel's body: (line, start, end) each, the source with
    them blanked): the lines after ``def <name>(``, their code before an inline comment;
    with ``subscripts``, a line with ``[`` too, its literals outside brackets."""
    lines, found, body = source.split("\n"), [], False
    blank = list(lines)
    for k, line in enumerate(lines):
        if not body:
            body = line.startswith(f"def {name}(")
            continue
        code = line.split("  # ", 1)[0]
        blocked = _BLOCKED[1:] if subscripts else _BLOCKED  # (_BLOCKED[0]: "[")
        if any(b in code for b in blocked) or _CONSTANTS.match(code):
            continue
        spans = [
            m.span(2)
            for m in _TOKEN.finditer(code)
            if m.group(2) and code[: m.start(2)].count("[") == code[: m.start(2)].count("]")
        ]
        found += [(k, a, b) for a, b in spans]
        for a, b in reversed(spans):
            blank[k] = blank[k][:a] + "#" + blank[k][b:]
    return found, "\n".join(line for line in blank if not line.lstrip().startswith("#"))


def with_size_arguments(kernel: Kernel, subscripts: bool = False) -> Kernel:
    """``kernel`` with the literals that differ between the shapes of its traced graph as
    arguments (see the module); as it is outside such a graph or where none differ."""
    scope = getattr(runtime_bucket(), "scope", None)
    if scope is None:
        return kernel
    found, skeleton = _literals(kernel.source, kernel.name, subscripts)
    values = _values(kernel.source, found)
    key = (scope, kernel.name, skeleton)
    with _LOCK:
        before, varying = _SEEN.get(key, (values, frozenset()))
        varying |= {i for i, (x, y) in enumerate(zip(before, values)) if x != y}
        _SEEN[key] = (values, varying)
    return _as_arguments(kernel, found, values, [[i] for i in sorted(varying)])


def with_probe_arguments(kernel: Kernel, probe: str, subscripts: bool = False) -> Kernel:
    """``kernel`` with the literals that differ in ``probe`` (its source generated as at other
    sizes, those the kernel takes at run time) as arguments from the first shape on: one a
    pair of values (a stride ``T * D`` read by several loads is one argument); as it is where
    the two texts differ elsewhere than in their literals."""
    found, skeleton = _literals(kernel.source, kernel.name, subscripts)
    other, other_skeleton = _literals(probe, kernel.name, subscripts)
    if skeleton != other_skeleton:
        return kernel
    pairs: dict[tuple[int, int], list[int]] = {}
    values = _values(kernel.source, found)
    for i, pair in enumerate(zip(values, _values(probe, other))):
        if pair[0] != pair[1]:
            pairs.setdefault(pair, []).append(i)
    return _as_arguments(kernel, found, values, list(pairs.values()))


def _values(source: str, found: list[tuple[int, int, int]]) -> tuple[int, ...]:
    lines = source.split("\n")
    return tuple(int(lines[k][a:b]) for k, a, b in found)


def _as_arguments(
    kernel: Kernel, found: list[tuple[int, int, int]], values: tuple[int, ...], groups
) -> Kernel:
    """``kernel`` with each group of its literals (positions in ``found``) one argument
    ``ks<j>``, numbered after those its signature has, passed first."""
    if not groups:
        return kernel
    lines = kernel.source.split("\n")
    sig = next(line for line in lines if line.startswith(f"def {kernel.name}("))
    first = len(re.findall(r"\bks\d+\b", sig))
    names = {i: f"ks{first + j}" for j, group in enumerate(groups) for i in group}
    for i in sorted(names, reverse=True):
        k, a, b = found[i]
        lines[k] = f"{lines[k][:a]}{names[i]}{lines[k][b:]}"
    params = ", ".join(f"ks{first + j}" for j in range(len(groups)))
    source = "\n".join(lines).replace(f"def {kernel.name}(", f"def {kernel.name}({params}, ", 1)
    extra = tuple(("int", values[group[0]]) for group in groups)
    return replace(kernel, source=source, layout=extra + kernel.layout)
