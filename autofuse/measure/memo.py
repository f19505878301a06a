"""Each structurally distinct candidate is measured once per study."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autofuse.measure.candidate import (
    Candidate,
    Measurement,
)

# ---------------------------------------------------------------------------------------------
# Memoization
# ---------------------------------------------------------------------------------------------


@dataclass
class Memo:
    """Measures each structurally distinct candidate once (by ``candidate.key``); failures are
    remembered too. ``calls``: inner measurements; ``hits``: answers from the memo."""

    inner: Any
    cache: dict[str, Measurement] = field(default_factory=dict)
    calls: int = 0
    hits: int = 0

    @property
    def source(self) -> str:
        return getattr(self.inner, "source", "measured")

    def measure(self, candidate: Candidate) -> Measurement:
        key = candidate.key
        hit = self.cache.get(key)
        if hit is not None:
            self.hits += 1
            return hit
        self.calls += 1
        m = self.inner.measure(candidate)
        self.cache[key] = m
        return m
