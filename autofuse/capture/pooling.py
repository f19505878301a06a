"""Pooling (and ``unfold``) as window offsets: ``max_pool{2,3}d_with_indices``, ``avg_pool{2,3}d`` and
``constant_pad_nd`` taken to pads (concatenated constant blocks), strided slices (one per window
offset) and pointwise maxima / sums, so a pool is generated and fuses with its neighbours (the
1-D pools reach these through their 2-D forms).

Eager's semantics, exactly: the output size (``ceil_mode`` windows start inside the input or
its left padding); max pooling's index is the first maximum in window order, a NaN taking the
place of any number (the last NaN of the window wins, as eager's ``val > max || isnan(val)``
scan gives) and a window of -inf its first element inside the input; average pooling divides by
the window's size clipped to the padded input (``count_include_pad``) or to the input, or by
``divisor_override``, and adds 16-bit inputs in float32 (a window of more than ``MAX_WINDOW``
offsets summed one dim at a time). A max pool window of more than ``MAX_WINDOW`` offsets stays
one eager op (a generated kernel of that many loads is not worth it).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

aten = torch.ops.aten
MAX_WINDOW = 64


def _list(v: Any, n: int, default: Any = None) -> list[int]:
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return list(default) if default is not None else [0] * n
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * n if len(v) == 1 else v


def _out_size(size: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    """Eager's pooling output size (``pooling_output_shape``)."""
    num = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil else 0)
    out = num // s + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pad_dim(x: torch.Tensor, dim: int, left: int, right: int, value: Any) -> torch.Tensor:
    """``x`` padded along ``dim`` (a negative amount crops), as a concatenation."""
    if left < 0:
        x = x.narrow(dim, -left, x.shape[dim] + left)
        left = 0
    if right < 0:
        x = x.narrow(dim, 0, x.shape[dim] + right)
        right = 0
    parts = []
    for amount in (left, right):
        shape = list(x.shape)
        shape[dim] = amount
        parts.append(torch.full(shape, value, dtype=x.dtype, device=x.device) if amount else None)
    blocks = [b for b in (parts[0], x, parts[1]) if b is not None]
    return torch.cat(blocks, dim) if len(blocks) > 1 else x


def constant_pad_nd(x: torch.Tensor, pad: list[int], value: float = 0.0) -> torch.Tensor:
    """``F.pad(x, pad, value=value)``: pairs of (left, right) from the last dim backwards."""
    if len(pad) % 2 or len(pad) // 2 > x.dim():
        return NotImplemented
    out = x
    for k in range(len(pad) // 2):
        dim = x.dim() - 1 - k
        out = _pad_dim(out, dim, pad[2 * k], pad[2 * k + 1], value)
    # eager's pad returns a new tensor: one made of crops alone (every amount <= 0) is a view of
    # ``x`` here, and an in-place op on it would write through to ``x``
    return out.clone() if all(p <= 0 for p in pad) else out


class _Windows:
    """The window offsets of a pool over the last ``n`` dims of ``x``."""

    def __init__(self, x, n, kernel, stride, padding, dilation, ceil_mode) -> None:
        self.n, self.lead = n, x.dim() - n
        self.size = list(x.shape[self.lead :])
        self.k = _list(kernel, n)
        self.s = _list(stride, n, self.k)
        self.p = _list(padding, n)
        self.d = _list(dilation, n, [1] * n)
        self.out = [
            _out_size(*a, ceil_mode) for a in zip(self.size, self.k, self.s, self.p, self.d)
        ]

    @property
    def count(self) -> int:
        return math.prod(self.k)

    def padded(self, x: torch.Tensor, value: Any) -> torch.Tensor:
        """``x`` padded so that every window lies inside it."""
        for i in range(self.n):
            need = (self.out[i] - 1) * self.s[i] + self.d[i] * (self.k[i] - 1) + 1
            x = _pad_dim(x, self.lead + i, self.p[i], need - self.size[i] - self.p[i], value)
        return x

    def offsets(self):
        return itertools.product(*(range(k) for k in self.k))

    def window(self, xp: torch.Tensor, off: tuple[int, ...]) -> torch.Tensor:
        for i, j in enumerate(off):
            xp = self.along(xp, i, j)
        return xp

    def along(self, xp: torch.Tensor, i: int, j: int) -> torch.Tensor:
        """The elements at offset ``j`` of spatial dim ``i`` of every window (a strided slice)."""
        start = j * self.d[i]
        end = start + (self.out[i] - 1) * self.s[i] + 1
        return aten.slice(xp, self.lead + i, start, end, self.s[i])

    def positions(self, i: int, j: int, device) -> torch.Tensor:
        """Input positions along spatial dim ``i`` at offset ``j``, shaped to broadcast."""
        pos = torch.arange(self.out[i], device=device) * self.s[i] + (j * self.d[i] - self.p[i])
        return pos.reshape([self.out[i] if a == i else 1 for a in range(self.n)])

    def inside(self, i: int, j: int) -> bool:
        """Whether offset ``j`` of dim ``i`` stays inside the input for every output."""
        first = j * self.d[i] - self.p[i]
        return first >= 0 and first + (self.out[i] - 1) * self.s[i] < self.size[i]


def _lowest(dtype: torch.dtype) -> Any:
    return -math.inf if dtype.is_floating_point else torch.iinfo(dtype).min


def _max_pool(x, n, kernel, stride, padding, dilation, ceil_mode):
    w = _Windows(x, n, kernel, stride, padding, dilation, ceil_mode)
    if w.count > MAX_WINDOW or x.dtype == torch.bool or x.is_complex():
        return NotImplemented
    xp = w.padded(x, _lowest(x.dtype))
    best = idx = seen = None
    for off in w.offsets():
        v = w.window(xp, off)
        flat, valid = None, None
        for i, j in enumerate(off):
            pos = w.positions(i, j, x.device)
            flat = pos if flat is None else flat * w.size[i] + pos
            if not w.inside(i, j):
                ok = (pos >= 0) & (pos < w.size[i])
                valid = ok if valid is None else valid & ok
        if best is None:  # the first offset: eager's starting point
            best, idx = v, torch.zeros_like(v, dtype=torch.int64) + flat
            seen = valid
            continue
        take = v > best
        if x.is_floating_point():
            take = take | torch.isnan(v)
        if seen is not None:
            take = take | torch.logical_not(seen)
        if valid is not None:
            take = take & valid
        if seen is not None:  # None: every window has taken an element inside the input
            seen = None if valid is None else seen | valid
        best = torch.where(take, v, best)
        idx = torch.where(take, flat, idx)
    return best, idx


def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, 2, kernel_size, stride, padding, dilation, ceil_mode)


def max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, 3, kernel_size, stride, padding, dilation, ceil_mode)


def _sum(parts) -> torch.Tensor:
    total = None
    for v in parts:
        total = v if total is None else total + v
    return total


def _divisor(w: _Windows, include_pad: bool, device) -> Any:
    """Per output position, the count eager divides a window's sum by (a number where every
    window has the same)."""
    total = None
    for i in range(w.n):
        start = [o * w.s[i] - w.p[i] for o in range(w.out[i])]
        end = [min(a + w.k[i], w.size[i] + w.p[i]) for a in start]
        if include_pad:
            counts = [b - a for a, b in zip(start, end)]
        else:
            counts = [min(b, w.size[i]) - max(a, 0) for a, b in zip(start, end)]
        if len(set(counts)) == 1:
            part: Any = counts[0]
        else:
            o = torch.arange(w.out[i], device=device) * w.s[i] - w.p[i]
            hi = torch.clamp(o + w.k[i], max=w.size[i] + w.p[i])
            part = (torch.clamp(hi, max=w.size[i]) - torch.clamp(o, min=0)) if not include_pad \
                else hi - o  # fmt: skip
            part = part.reshape([w.out[i] if a == i else 1 for a in range(w.n)])
        total = part if total is None else total * part
    return total


def _avg_pool(x, n, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    w = _Windows(x, n, kernel, stride, padding, 1, ceil_mode)
    if max(w.k) > MAX_WINDOW or not x.is_floating_point():
        return NotImplemented
    low = x.dtype in (torch.float16, torch.bfloat16)
    total = w.padded(x.float() if low else x, 0.0)
    if w.count <= MAX_WINDOW:  # one sum of every offset's slice
        total = _sum(w.window(total, off) for off in w.offsets())
    else:  # a sum over a box is separable: one dim at a time
        for i in range(n):
            total = _sum(w.along(total, i, j) for j in range(w.k[i]))
    div = divisor_override or _divisor(w, count_include_pad, x.device)
    out = total / div
    return out.to(x.dtype) if low else out


def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):  # fmt: skip
    return _avg_pool(x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)  # fmt: skip


def avg_pool3d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):  # fmt: skip
    return _avg_pool(x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)  # fmt: skip


def unfold(x: torch.Tensor, dim: int, size: int, step: int) -> torch.Tensor:
    """``x.unfold(dim, size, step)``: the windows' elements as strided slices stacked on a new
    last dim (a copy where eager gives a view: the captured graph holds no mutation)."""
    if x.dim() == 0 or size > MAX_WINDOW:
        return NotImplemented
    dim = dim % x.dim()
    n = (x.shape[dim] - size) // step + 1
    parts = [aten.slice(x, dim, j, j + (n - 1) * step + 1, step) for j in range(size)]
    return torch.stack(parts, dim=-1)


def pooling_decompositions() -> dict:
    return {
        aten.unfold.default: unfold,
        aten.max_pool2d_with_indices.default: max_pool2d_with_indices,
        aten.max_pool3d_with_indices.default: max_pool3d_with_indices,
        aten.avg_pool2d.default: avg_pool2d,
        aten.avg_pool3d.default: avg_pool3d,
        aten.constant_pad_nd.default: constant_pad_nd,
    }
