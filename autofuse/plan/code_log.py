"""``AUTOFUSE_LOGS=output_code``: each kernel of a plan printed with a readable copy's file
(the plan layer's part of the log; ``autofuse.logs`` holds the topics and the switch)."""

from __future__ import annotations

import sys
from typing import Any

from autofuse import logs
from autofuse.kernels.common.loader import kernel_file as readable_copy


def kernel_file(source: str, name: str) -> str:
    """A readable copy of ``source`` (the kernel runs from the verified text itself)."""
    try:
        return str(readable_copy(source, name))
    except OSError as e:
        return f"(no readable copy: {e})"


def output_code(plan: Any) -> None:
    """Print every kernel of ``plan`` with its file when AUTOFUSE_LOGS contains output_code
    (outside :func:`autofuse.logs.no_output_code`)."""
    if not logs.output_code_on():
        return
    out = sys.stderr
    print(f"===== autofuse output code: {plan.label} ({len(plan.kernels)} kernels) =====", file=out)
    for k in plan.kernels:
        print(f"# kernel {k.name}: {kernel_file(k.source, k.name)}", file=out)
        print(k.source, file=out)
    for lib in plan.library:
        print(f"# library: {plan.graph[lib.out].name}: {lib.describe(plan.graph)}", file=out)
    for fb in plan.fallbacks:
        print(f"# eager: {plan.graph[fb.node].name}: {fb.reason}", file=out)
