"""The Triton functions some op renderings call (``OpDef.helper``): each a ``@triton.jit``
source emitted once per kernel that needs it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Helper:
    """A ``@triton.jit`` function a rendering calls; emitted once per kernel that needs it."""

    name: str
    source: str


TANH = Helper(
    "_af_tanh",
    """@triton.jit
def _af_tanh(x):
    # tanh from exp of a non-positive argument: no overflow, full relative precision
    t = tl.exp(-2.0 * tl.abs(x))
    y = (1.0 - t) / (1.0 + t)
    return tl.where(x < 0, -y, y)
""",
)
ROUND = Helper(
    "_af_round",
    """@triton.jit
def _af_round(x):
    # round half to even, as torch.round: |x| + 2**23 (2**52 in float64) is rounded to an
    # integer by the adder's own round-to-nearest-even (the constant is even), and from 2**23
    # (2**52) on every value is an integer already; NaN and inf are returned as they are
    if x.dtype == tl.float64:
        big = 4503599627370496.0
    else:
        big = 8388608.0
    a = tl.abs(x)
    r = (a + big) - big
    return tl.where(a < big, tl.where(x < 0, -r, r), x)
""",
)
LOG1P = Helper(
    "_af_log1p",
    """@triton.jit
def _af_log1p(x):
    # log(1 + x) without cancellation for small x: log(u) * x / (u - 1), u = 1 + x
    u = 1.0 + x
    small = tl.where(u == 1.0, x, tl.log(u) * (x / (u - 1.0)))
    return tl.where(tl.abs(x) < 0.5, small, tl.log(u))
""",
)
EXPM1 = Helper(
    "_af_expm1",
    """@triton.jit
def _af_expm1(x):
    # exp(x) - 1 without cancellation for small x: (u - 1) * x / log(u), u = exp(x)
    u = tl.exp(x)
    small = tl.where(u == 1.0, x, (u - 1.0) * (x / tl.log(u)))
    return tl.where(tl.abs(x) < 0.5, small, u - 1.0)
""",
)
HYPOT = Helper(
    "_af_hypot",
    """@triton.jit
def _af_hypot(a, b):
    # sqrt(a^2 + b^2) without overflow or underflow: hi * sqrt(1 + (lo / hi)^2); an infinite
    # operand gives inf even beside a NaN, as C's hypot and torch.hypot (two wheres, not an
    # `|` of the tests: one operand may be a scalar, and Triton's interpreter fails
    # `scalar | block` on bools)
    x = tl.abs(a)
    y = tl.abs(b)
    hi = tl.maximum(x, y, propagate_nan=tl.PropagateNan.ALL)
    lo = tl.minimum(x, y, propagate_nan=tl.PropagateNan.ALL)
    r = lo / tl.where(hi == 0.0, 1.0, hi)
    h = hi * tl.sqrt(1.0 + r * r)
    return tl.where(x == float("inf"), float("inf"), tl.where(y == float("inf"), float("inf"), h))
""",
)
IPOW = Helper(
    "_af_ipow",
    """@triton.jit
def _af_ipow(x, e: tl.constexpr):
    # x ** e for an integer x and a constant e >= 0 by repeated squaring, each product in x's
    # dtype: it wraps around exactly as torch's integer pow does
    r = x * 0 + 1
    b = x
    for i in tl.static_range(63):
        if (e >> i) & 1:
            r = r * b
        if (e >> (i + 1)) > 0:
            b = b * b
    return r
""",
)
PROD = Helper("_af_prod", "@triton.jit\ndef _af_prod(a, b):\n    return a * b\n")
MAX = Helper(
    "_af_max",
    "@triton.jit\ndef _af_max(a, b):\n"
    "    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)\n",
)
MIN = Helper(
    "_af_min",
    "@triton.jit\ndef _af_min(a, b):\n"
    "    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)\n",
)
