"""Charts as inline SVG (no plotting library): horizontal bars and step lines, each value
drawn at its true length on a linear (bars) or log (lines) scale, with its figure beside it."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

_W, _LABEL, _ROW = 360, 220, 18  # bar area, label column, row height (px)
COLORS = ("#4878cf", "#6acc65", "#d65f5f", "#b47cc7", "#c4ad66", "#77bedb")


def bars(rows: Sequence[tuple[str, Sequence[float | None]]], series: Sequence[str],
         unit: str = "x", mark: float | None = 1.0) -> str:  # fmt: skip
    """One group of bars per row (``label``, one value per series); ``mark``: a reference
    line (1x: as fast as the baseline)."""
    vals = [v for _, vs in rows for v in vs if v]
    top = max([*vals, mark or 0.0, 1e-30])
    n = max(1, len(series))
    height = len(rows) * (n * _ROW + 6) + 24
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{_LABEL + _W + 80}' "
           f"height='{height}' font-family='sans-serif' font-size='11'>"]  # fmt: skip
    y = 4
    for label, vs in rows:
        out.append(f"<text x='0' y='{y + n * _ROW / 2 + 4}'>{html.escape(label)}</text>")
        for k, v in enumerate(vs):
            if v:
                w = max(1.0, _W * v / top)
                out.append(f"<rect x='{_LABEL}' y='{y + k * _ROW}' width='{w:.1f}' "
                           f"height='{_ROW - 3}' fill='{COLORS[k % len(COLORS)]}'/>"
                           f"<text x='{_LABEL + w + 4:.1f}' y='{y + k * _ROW + 12}'>"
                           f"{v:.3g}{unit}</text>")  # fmt: skip
        y += n * _ROW + 6
    if mark:
        x = _LABEL + _W * mark / top
        out.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='0' y2='{y}' stroke='#000'/>")
    out += _legend(series, y + 12)
    out.append("</svg>")
    return "".join(out)


def _legend(series: Sequence[str], y: float) -> list[str]:
    out, x = [], _LABEL
    for k, name in enumerate(series):
        out.append(f"<rect x='{x}' y='{y - 9}' width='10' height='10' "
                   f"fill='{COLORS[k % len(COLORS)]}'/><text x='{x + 14}' y='{y}'>"
                   f"{html.escape(name)}</text>")  # fmt: skip
        x += 14 + 7 * len(name) + 16
    return out


def steps(lines: dict[str, Sequence[tuple[int, float]]], unit: str = "µs") -> str:
    """Step lines (x: trial, y: value on a log scale), one per name."""
    pts = [p for ps in lines.values() for p in ps if p[1] > 0]
    if not pts:
        return ""
    x0, x1 = min(p[0] for p in pts), max(max(p[0] for p in pts), min(p[0] for p in pts) + 1)
    lo, hi = math.log10(min(p[1] for p in pts)), math.log10(max(p[1] for p in pts))
    hi = hi if hi > lo else lo + 1
    w, h, left = 480, 200, 60

    def xy(n: float, v: float) -> str:
        return (
            f"{left + w * (n - x0) / (x1 - x0):.1f},{10 + h * (hi - math.log10(v)) / (hi - lo):.1f}"
        )

    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{left + w + 20}' height='{h + 60}' "
           f"font-family='sans-serif' font-size='11'>",
           f"<text x='0' y='14'>{10**hi:.3g} {unit}</text>",
           f"<text x='0' y='{h + 10}'>{10**lo:.3g} {unit}</text>",
           f"<text x='{left}' y='{h + 26}'>trial {x0}</text>",
           f"<text x='{left + w - 50}' y='{h + 26}'>trial {x1}</text>"]  # fmt: skip
    for k, ps in enumerate(lines.values()):
        ps = [p for p in ps if p[1] > 0]
        if not ps:
            continue
        path = [xy(*ps[0])]
        for (_, v0), (n1, v1) in zip(ps, ps[1:]):
            path += [xy(n1, v0), xy(n1, v1)]
        color = COLORS[k % len(COLORS)]
        out.append(f"<polyline fill='none' stroke='{color}' stroke-width='1.5' "
                   f"points='{' '.join(path)}'/>")  # fmt: skip
    out += _legend(list(lines), h + 48)
    out.append("</svg>")
    return "".join(out)
