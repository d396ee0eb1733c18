"""Inline SVG charts for the offline HTML reports (validate, plan): axes with ticks, units and
human-readable values (``8 GiB``, ``$84.8M``), legends and labels laid out so that nothing is
clipped or drawn over something else. No scripts, no external assets.

Text widths are estimated (``_text_w``: 0.62 em per character, wider than the average glyph
of the sans-serif fonts browsers use) so that layout never relies on a browser measuring text;
``tests/web/test_reports.py`` checks the result in Chromium.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

__all__ = [
    "PALETTE",
    "Series",
    "bar_chart",
    "fmt_bytes",
    "fmt_money",
    "fmt_num",
    "line_chart",
    "nice_ticks",
]

PALETTE = ("#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#827717", "#4e342e")
FONT = 11  # px, tick labels and legends
TITLE_FONT = 13
Fmt = Callable[[float], str]


def _text_w(text: str, size: float = FONT) -> float:
    return 0.62 * size * len(text)


def _trim(v: float, digits: int) -> str:
    s = f"{v:.{digits}f}"
    return s.rstrip("0").rstrip(".") if "." in s else s


def fmt_num(v: float) -> str:
    """A plain figure: ``1,235``, ``450``, ``12.5``, ``0.42``."""
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return _trim(v, 1)
    if a == 0:
        return "0"
    return _trim(v, 2)


def fmt_bytes(v: float) -> str:
    """Bytes in binary units: ``8 GiB``, ``1.5 MiB``, ``512 B``."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    a, i = abs(v), 0
    while a >= 1024 and i < len(units) - 1:
        a /= 1024
        i += 1
    return f"{'-' if v < 0 else ''}{_trim(a, 0 if a >= 100 else 1)} {units[i]}"


def fmt_money(v: float) -> str:
    """US dollars: ``$84.8M``, ``$1.2B``, ``$950k``, ``$12``."""
    a = abs(v)
    sign = "-" if v < 0 else ""
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            x = a / div
            return f"{sign}${_trim(x, 0 if x >= 100 else 1)}{suffix}"
    return f"{sign}${a:,.0f}"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 x 10^k steps) covering ``[lo, hi]``."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0, 1.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    while v < hi + step * 0.999:
        ticks.append(round(v, 12))
        v += step
    return ticks


@dataclass(frozen=True)
class Series:
    """One line: a name for the legend (and tooltip), its points, optional colour."""

    name: str
    xs: Sequence[float]
    ys: Sequence[float | None]
    color: str | None = None


def _svg_open(w: float, h: float, title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0f}" height="{h:.0f}" '
        f'viewBox="0 0 {w:.0f} {h:.0f}" role="img" aria-label="{escape(title)}" '
        f'font-family="sans-serif" class="chart">'
        f'<text x="4" y="{TITLE_FONT + 3}" font-size="{TITLE_FONT}" font-weight="bold">'
        f"{escape(title)}</text>"
    )


def _legend(items: list[tuple[str, str]], x0: float, y0: float, width: float) -> tuple[str, float]:
    """Legend entries flowed into rows below the plot; returns (svg, height used)."""
    parts: list[str] = []
    x, y = x0, y0
    row_h = FONT + 6
    for name, color in items:
        label = name if len(name) <= 40 else name[:39] + "…"
        item_w = 16 + _text_w(label) + 14
        if x > x0 and x + item_w > x0 + width:
            x, y = x0, y + row_h
        parts.append(
            f'<rect x="{x:.1f}" y="{y - FONT + 2:.1f}" width="10" height="10" fill="{color}"/>'
            f'<text x="{x + 14:.1f}" y="{y:.1f}" font-size="{FONT}">{escape(label)}</text>'
        )
        x += item_w
    return "".join(parts), (y - y0 + row_h) if items else 0.0


def _log2_ticks(lo: float, hi: float, px: float, fmt: Fmt) -> list[float]:
    """Powers of two between lo and hi, thinned until their labels fit ``px``."""
    first, last = math.ceil(math.log2(lo)), math.floor(math.log2(hi))
    exps = list(range(first, last + 1)) or [first]
    step = 1
    while True:
        ticks = [2.0**e for e in exps[::step]]
        widest = max(_text_w(fmt(t)) for t in ticks)
        if len(ticks) <= 1 or px / max(len(ticks) - 1, 1) >= widest + 10:
            return ticks
        step += 1


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    x_fmt: Fmt = fmt_num,
    y_fmt: Fmt = fmt_num,
    x_log2: bool = False,
    markers: Sequence[tuple[float, str]] = (),
    width: float = 640,
    height: float = 240,
    legend: bool = True,
) -> str:
    """Lines over a shared x axis, with both axes ticked and labelled. ``x_log2`` spaces x by
    powers of two (message sizes). ``markers`` draw a dashed vertical line with a label (e.g.
    the break-even month). Empty series give an empty string: no empty charts."""
    pts_all = [
        (x, y)
        for s in series
        for x, y in zip(s.xs, s.ys, strict=False)
        if y is not None and math.isfinite(y) and (x > 0 or not x_log2)
    ]
    if not pts_all:
        return ""
    xs = [p[0] for p in pts_all]
    ymax = max(max(p[1] for p in pts_all), *(0.0,))
    ymin = min(0.0, min(p[1] for p in pts_all))
    yticks = nice_ticks(ymin, ymax or 1.0, 5)
    y_lo, y_hi = yticks[0], yticks[-1]
    tick_w = max(_text_w(y_fmt(t)) for t in yticks)
    left = 4 + FONT + 8 + tick_w + 6  # rotated y label, tick labels, gap
    right = 18
    top = TITLE_FONT + 16
    colors = [s.color or PALETTE[i % len(PALETTE)] for i, s in enumerate(series)]
    legend_items = [(s.name, c) for s, c in zip(series, colors, strict=True)] if legend else []
    legend_svg, legend_h = _legend(legend_items, left, 0, width - left - right)
    bottom = FONT + 8 + FONT + 10 + (legend_h + 6 if legend_items else 0)
    pw, ph = width - left - right, height - top - bottom
    x_lo, x_hi = min(xs), max(xs)
    if x_log2:
        lx_lo, lx_hi = math.log2(x_lo), math.log2(x_hi) if x_hi > x_lo else math.log2(x_lo) + 1
        xticks = _log2_ticks(x_lo, x_hi, pw, x_fmt)

        def sx(x: float) -> float:
            return left + pw * (math.log2(x) - lx_lo) / ((lx_hi - lx_lo) or 1.0)
    else:
        widest = max(_text_w(x_fmt(v)) for v in (x_lo, x_hi)) + 12
        xticks = nice_ticks(x_lo, x_hi, max(2, min(8, int(pw / widest))))
        xticks = [t for t in xticks if x_lo - 1e-9 <= t <= x_hi + 1e-9] or [x_lo]
        span = (x_hi - x_lo) or 1.0

        def sx(x: float) -> float:
            return left + pw * (x - x_lo) / span

    def sy(y: float) -> float:
        return top + ph - ph * (y - y_lo) / ((y_hi - y_lo) or 1.0)

    parts = [_svg_open(width, height, title)]
    for t in yticks:
        y = sy(t)
        parts.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="{FONT}" text-anchor="end">'
            f"{escape(y_fmt(t))}</text>"
        )
    for t in xticks:
        x = sx(t)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + ph}" y2="{top + ph + 4}" stroke="#888"/>'
            f'<text x="{x:.1f}" y="{top + ph + FONT + 6}" font-size="{FONT}" '
            f'text-anchor="middle">{escape(x_fmt(t))}</text>'
        )
    parts.append(
        f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + ph}" stroke="#888"/>'
        f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" stroke="#888"/>'
        f'<text x="{left + pw / 2:.1f}" y="{top + ph + 2 * FONT + 12}" font-size="{FONT}" '
        f'text-anchor="middle">{escape(x_label)}</text>'
        f'<text transform="translate({4 + FONT},{top + ph / 2:.1f}) rotate(-90)" '
        f'font-size="{FONT}" text-anchor="middle">{escape(y_label)}</text>'
    )
    for s, color in zip(series, colors, strict=True):
        pts = " ".join(
            f"{sx(x):.1f},{sy(y):.1f}"
            for x, y in zip(s.xs, s.ys, strict=False)
            if y is not None and math.isfinite(y) and (x > 0 or not x_log2)
        )
        if pts:
            parts.append(
                f'<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{pts}">'
                f"<title>{escape(s.name)}</title></polyline>"
            )
    for mx, mlabel in markers:
        if not (x_lo <= mx <= x_hi) or (x_log2 and mx <= 0):
            continue
        x = sx(mx)
        anchor, tx = ("start", x + 4) if x + 4 + _text_w(mlabel) <= left + pw else ("end", x - 4)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" stroke="#333" '
            f'stroke-dasharray="5 3" class="marker"/>'
            f'<text x="{tx:.1f}" y="{top + FONT + 2}" font-size="{FONT}" text-anchor="{anchor}" '
            f'class="marker-label">{escape(mlabel)}</text>'
        )
    if legend_items:
        ly = top + ph + 2 * FONT + 12 + FONT + 10
        parts.append(f'<g transform="translate(0,{ly:.1f})">{legend_svg}</g>')
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(
    title: str,
    items: Sequence[tuple[str, float, str | None]],
    *,
    value_label: str,
    value_fmt: Fmt = fmt_num,
    line: tuple[float, str] | None = None,
    width: float = 640,
) -> str:
    """Horizontal bars, one per item (label, value, colour), with a value axis (ticks and
    ``value_label``), the value at the end of each bar and an optional dashed reference line
    (e.g. the pass line). No items: an empty string."""
    items = [(lab, v, c) for lab, v, c in items if v is not None and math.isfinite(v)]
    if not items:
        return ""
    row = 16 if len(items) <= 32 else 12
    size = FONT if row == 16 else 9
    labels = [lab if len(lab) <= 28 else lab[:27] + "…" for lab, _, _ in items]
    label_w = max(_text_w(lab, size) for lab in labels) + 8
    vmax = max(max(v for _, v, _ in items), line[0] if line else 0.0, 0.0)
    ticks = nice_ticks(0.0, vmax or 1.0, 4)
    value_w = max(_text_w(value_fmt(v), size) for _, v, _ in items) + 8
    left, right = 4 + label_w, value_w + 8
    top = TITLE_FONT + 14 + (FONT + 6 if line else 0)
    pw = width - left - right
    bottom = FONT + 8 + FONT + 10
    height = top + row * len(items) + bottom

    def sx(v: float) -> float:
        return left + pw * v / (ticks[-1] or 1.0)

    parts = [_svg_open(width, height, title)]
    ph = row * len(items)
    for t in ticks:
        x = sx(t)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" stroke="#e4e4e4"/>'
            f'<text x="{x:.1f}" y="{top + ph + FONT + 6}" font-size="{FONT}" '
            f'text-anchor="middle">{escape(value_fmt(t))}</text>'
        )
    for i, ((full, v, color), lab) in enumerate(zip(items, labels, strict=True)):
        y = top + i * row
        bw = max(sx(v) - left, 1.0)
        parts.append(
            f'<text x="{left - 6}" y="{y + row - 4}" font-size="{size}" text-anchor="end">'
            f"{escape(lab)}<title>{escape(full)}</title></text>"
            f'<rect x="{left}" y="{y + 2}" width="{bw:.1f}" height="{row - 4}" '
            f'fill="{color or PALETTE[0]}"><title>{escape(full)}: {escape(value_fmt(v))}'
            f"</title></rect>"
            f'<text x="{left + bw + 4:.1f}" y="{y + row - 4}" font-size="{size}">'
            f"{escape(value_fmt(v))}</text>"
        )
    parts.append(
        f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + ph}" stroke="#888"/>'
        f'<text x="{left + pw / 2:.1f}" y="{top + ph + 2 * FONT + 12}" font-size="{FONT}" '
        f'text-anchor="middle">{escape(value_label)}</text>'
    )
    if line is not None:
        x = sx(line[0])
        text = f"{line[1]} {value_fmt(line[0])}"
        anchor = "start" if x + _text_w(text) <= width - 4 else "end"
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top - 4}" y2="{top + ph}" stroke="#c62828" '
            f'stroke-dasharray="4 3"/>'
            f'<text x="{x:.1f}" y="{top - 6}" font-size="{FONT}" fill="#c62828" '
            f'text-anchor="{anchor}">{escape(text)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
