"""Logging controlled by ``AUTOFUSE_LOGS`` (a comma-separated list, like ``TORCH_LOGS``).

- ``output_code``: print the source of every generated kernel when a plan is built.
- ``search``: log each trial of the search.
- ``+autofuse``: debug logging of the whole package.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from autofuse.settings import settings

log = logging.getLogger("autofuse")


def enabled(topic: str) -> bool:
    topics = settings().logs
    return topic in topics or "all" in topics


def configure() -> None:
    if enabled("+autofuse") and not log.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("[autofuse] %(message)s"))
        log.addHandler(h)
        log.setLevel(logging.DEBUG)


def output_code(plan: Any) -> None:
    """Print every kernel of ``plan`` when AUTOFUSE_LOGS contains output_code."""
    if not enabled("output_code"):
        return
    out = sys.stderr
    print(f"===== autofuse output code: {plan.label} ({len(plan.kernels)} kernels) =====", file=out)
    for k in plan.kernels:
        print(k.source, file=out)
    for fb in plan.fallbacks:
        print(f"# eager: {plan.graph[fb.node].name}: {fb.reason}", file=out)
