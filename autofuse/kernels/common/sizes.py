"""Runtime sizes: loop kernels (pointwise, reduction) that take their row count as an argument.

Inside :func:`runtime_sizes` (the backend turns it on while it compiles a graph whose sizes
Dynamo made symbolic), a loop kernel reads ``xnumel`` from its argument instead of baking it
in as a constant, always masks its rows against it, and picks its default launch config from
the size's bucket (each non-reduced dim rounded up to a power of two) rather than from the
exact size; a reduction reads its reduced extent ``rnumel`` from its argument too, its columns
always masked. Two shapes in one bucket whose other sizes (strides, the broadcast periods)
agree then generate the same kernel text, and the loader builds that kernel once
(``loader.kernels_built``); a size that shows up in the index arithmetic (a broadcast along
the dynamic dim, a transpose of it, the row stride of a reduction over it) generates its own
text, whose varying literals become arguments from a traced graph's second shape on
(``literals.py``); a mean over the dynamic dim divides by a float literal, and so keeps a
kernel per length. A shared kernel is correct at every size by construction: the only values
that differ between its callers are arguments.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

from autofuse.ir.graph import numel
from autofuse.kernels.common.base import GroupInfo, next_pow2

__all__ = [
    "config_extent",
    "config_xnumel",
    "runtime_bucket",
    "runtime_sizes",
    "runtime_sizes_on",
    "size_bucket",
]

_BUCKET: contextvars.ContextVar[Any] = contextvars.ContextVar("autofuse_bucket", default=None)


@contextlib.contextmanager
def runtime_sizes(bucket: Any = ()) -> Iterator[None]:
    """Loop kernels generated inside take their row count at run time (see the module);
    ``bucket``: the key of the shape bucket being compiled (plans made inside are shared by
    the shapes of that bucket), ``None`` turns runtime sizes off."""
    token = _BUCKET.set(bucket)
    try:
        yield
    finally:
        _BUCKET.reset(token)


def runtime_sizes_on() -> bool:
    return _BUCKET.get() is not None


def runtime_bucket() -> Any:
    """The bucket key :func:`runtime_sizes` was given (None: runtime sizes off)."""
    return _BUCKET.get()


def size_bucket(n: int, edges: Sequence[int] | None = None) -> int:
    """The bucket of a dynamic size: its upper edge, the first of ``edges`` (sorted) at or
    above ``n``, or by default the power of two at or above it (0 and 1 are buckets of their
    own); a size above the last edge is its own bucket."""
    if edges:
        return next((e for e in edges if e >= n), n)
    return n if n <= 1 else next_pow2(n)


def config_xnumel(info: GroupInfo) -> int:
    """The row count a default config is chosen for: the exact one, or with runtime sizes the
    bucket's (every non-reduced dim rounded up to a power of two)."""
    if _BUCKET.get() is None:
        return info.xnumel
    return numel(next_pow2(s) for i, s in enumerate(info.domain) if i not in info.reduce_dims)


def config_extent(n: int) -> int:
    """One extent a default config is chosen for: the exact one, or with runtime sizes its
    bucket's (rounded up to a power of two), for kinds that size tiles by each dim alone."""
    return n if _BUCKET.get() is None else next_pow2(n)
