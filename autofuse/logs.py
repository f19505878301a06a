"""Logging controlled by ``AUTOFUSE_LOGS`` (a comma-separated list, like ``TORCH_LOGS``; an
unknown topic raises, naming the valid ones).

- ``output_code``: print each kernel of a plan with a readable copy's file (when tuning,
  the final plan's only).
- ``search``: one line per trial of the search: number, time in µs or why it failed, params.
- ``cache``: plan cache hits and misses (and continued studies).
- ``+autofuse``: debug logging of the whole package; ``all``: every topic.

Times a person reads are in µs.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Iterator

from autofuse.settings import settings

log = logging.getLogger("autofuse")
_quiet = threading.local()


def enabled(topic: str) -> bool:
    topics = settings().logs
    return topic in topics or "all" in topics


def configure() -> None:
    if enabled("+autofuse") and not log.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("[autofuse] %(message)s"))
        log.addHandler(h)
        log.setLevel(logging.DEBUG)


def us(seconds: float | None) -> str:
    """A time in seconds as people read it here: ``12.3µs`` (``-`` for None)."""
    return "-" if seconds is None else f"{seconds * 1e6:.4g}µs"


def emit(topic: str, message: str) -> None:
    """Print ``message`` under ``[autofuse <topic>]`` when the topic is on."""
    if enabled(topic):
        print(f"[autofuse {topic}] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def no_output_code() -> Iterator[None]:
    """Plans built inside (the tuner's candidates) print no code."""
    before = getattr(_quiet, "on", False)
    _quiet.on = True
    try:
        yield
    finally:
        _quiet.on = before


def output_code_on() -> bool:
    """Whether a plan built now prints its code (``plan/code_log.py``): the topic is on and
    no :func:`no_output_code` is active."""
    return enabled("output_code") and not getattr(_quiet, "on", False)
