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
for ``subscripts``: a line with a subscript is then eligible outside its brackets.
"""

from __future__ import annotations

import re
import threading
from dataclasses import replace

from autofuse.kernels.common.base import Kernel
from autofuse.kernels.common.sizes import runtime_bucket

__all__ = ["with_size_arguments"]

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
    lines = kernel.source.split("\n")
    values = tuple(int(lines[k][a:b]) for k, a, b in found)
    key = (scope, kernel.name, skeleton)
    with _LOCK:
        before, varying = _SEEN.get(key, (values, frozenset()))
        varying |= {i for i, (x, y) in enumerate(zip(before, values)) if x != y}
        _SEEN[key] = (values, varying)
    if not varying:
        return kernel
    for j, i in enumerate(sorted(varying, reverse=True)):
        k, a, b = found[i]
        lines[k] = f"{lines[k][:a]}ks{len(varying) - 1 - j}{lines[k][b:]}"
    names = ", ".join(f"ks{j}" for j in range(len(varying)))
    source = "\n".join(lines).replace(f"def {kernel.name}(", f"def {kernel.name}({names}, ", 1)
    extra = tuple(("int", values[i]) for i in sorted(varying))
    return replace(kernel, source=source, layout=extra + kernel.layout)
