"""The one SVG plotter: line/scatter charts and a request timeline for the HTML report, the bar
chart of a tune's candidates (its plot.svg, a file of its own).

No dependency and no external reference: the output is an inline ``<svg>`` element whose text is
HTML-escaped, so a report renders the same with or without matplotlib, offline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf")
FAILED = "#d62728"  # a failed tier's cross and a failed request's bar
_LEFT_PX, _RIGHT_PX, _TOP_PX, _BOTTOM_PX = 64, 16, 30, 46


@dataclass(frozen=True)
class Series:
    """One line of a chart; points with a missing value are left out."""

    label: str
    points: tuple[tuple[float, float], ...]
    in_given_order: bool = False  # joined as given (tier order), not left to right
    failed: frozenset[tuple[float, float]] = frozenset()  # points of failed tiers: a red cross
    chosen: tuple[float, float] | None = None  # the setting the report recommends: a ring
    joined: bool = True  # False: points alone (a scatter), no line between them


@dataclass(frozen=True)
class Bar:
    """One request on the timeline: seconds from the first start of its tier."""

    label: str
    start_s: float
    finish_s: float
    ttft_s: float | None  # from the request's start
    ok: bool


@dataclass(frozen=True)
class BarValue:
    """One bar of a bar chart: its label, its length in the chart's unit, what follows it."""

    label: str
    value: float
    note: str


_BAR_PX, _BAR_GAP_PX, _BAR_LABEL_PX, _BAR_SPAN_PX = 22, 6, 300, 420


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high] (1, 2 or 5 times a power of ten apart)."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return [low] if math.isfinite(low) else [0.0]
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    ticks, value = [], first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < high:
        ticks.append(round(value, 12))
    return ticks


def _label(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"


class _Frame:
    """Data → pixel mapping of one chart's plotting area."""

    def __init__(
        self, width: int, height: int, xs: Sequence[float], ys: Sequence[float], log_x: bool
    ) -> None:
        self.width, self.height, self.log_x = width, height, log_x
        fx = [self._fx(x) for x in xs] or [0.0, 1.0]
        self.x_lo, self.x_hi = min(fx), max(fx)
        if self.x_hi == self.x_lo:
            self.x_lo, self.x_hi = self.x_lo - 1, self.x_hi + 1
        self.y_ticks = nice_ticks(min(0.0, *ys) if ys else 0.0, max(ys) if ys else 1.0)
        self.y_lo, self.y_hi = self.y_ticks[0], self.y_ticks[-1]
        if self.y_hi == self.y_lo:
            self.y_hi = self.y_lo + 1

    def _fx(self, x: float) -> float:
        return math.log2(x) if self.log_x and x > 0 else x

    def px(self, x: float) -> float:
        span = self.width - _LEFT_PX - _RIGHT_PX
        return _LEFT_PX + (self._fx(x) - self.x_lo) / (self.x_hi - self.x_lo) * span

    def py(self, y: float) -> float:
        span = self.height - _TOP_PX - _BOTTOM_PX
        return self.height - _BOTTOM_PX - (y - self.y_lo) / (self.y_hi - self.y_lo) * span


def _axes(
    frame: _Frame,
    x_ticks: Sequence[float],
    title: str,
    x_label: str,
    y_label: str,
    *,
    y_ticks: bool = True,
) -> list[str]:
    w, h = frame.width, frame.height
    bottom, right = h - _BOTTOM_PX, w - _RIGHT_PX
    out = [
        f'<text x="{w / 2:.1f}" y="18" text-anchor="middle" class="title">{escape(title)}</text>',
        f'<line x1="{_LEFT_PX}" y1="{bottom}" x2="{right}" y2="{bottom}" class="axis"/>',
        f'<line x1="{_LEFT_PX}" y1="{_TOP_PX}" x2="{_LEFT_PX}" y2="{bottom}" class="axis"/>',
    ]
    for tick in frame.y_ticks if y_ticks else []:
        y = frame.py(tick)
        out.append(f'<line x1="{_LEFT_PX}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" class="grid"/>')
        out.append(
            f'<text x="{_LEFT_PX - 4}" y="{y + 4:.1f}" text-anchor="end">{_label(tick)}</text>'
        )
    for tick in x_ticks:
        x = frame.px(tick)
        out.append(
            f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">{_label(tick)}</text>'
        )
    out.append(
        f'<text x="{(_LEFT_PX + right) / 2:.1f}" y="{h - 8}" text-anchor="middle">{escape(x_label)}</text>'
    )
    out.append(
        f'<text transform="translate(14,{(h - _BOTTOM_PX + _TOP_PX) / 2:.1f}) rotate(-90)" text-anchor="middle">{escape(y_label)}</text>'
    )
    return out


def _svg(
    width: int, height: int, title: str, body: Sequence[str], *, standalone: bool = False
) -> str:
    """The ``<svg>`` element; ``standalone``: a file of its own, with its namespace and font
    (an image needs them; inside the report the page's CSS gives the font)."""
    alone = (
        ' xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" font-size="12"'
        if standalone
        else ""
    )
    head = (
        f'<svg class="chart"{alone} width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
    )
    return head + "".join(body) + "</svg>" + ("\n" if standalone else "")


def bar_chart(title: str, bars: Sequence[BarValue], *, standalone: bool = False) -> str:
    """Horizontal bars, one a row, the largest value the full span, its note after it (tune's
    goodput per candidate, the winner first and green)."""
    top = max((b.value for b in bars if _drawn(b.value)), default=0.0) or 1.0
    width = _BAR_LABEL_PX + _BAR_SPAN_PX + 120
    height = 40 + len(bars) * (_BAR_PX + _BAR_GAP_PX)
    body = [f'<text x="8" y="20" font-weight="bold">{escape(title)}</text>']
    for n, bar in enumerate(bars):
        y = 32 + n * (_BAR_PX + _BAR_GAP_PX)
        length = _BAR_SPAN_PX * (bar.value if _drawn(bar.value) else 0.0) / top
        colour = COLOURS[2] if n == 0 else COLOURS[0]
        body += [
            f'<text x="8" y="{y + 15}">{escape(bar.label)}</text>',
            f'<rect class="bar" x="{_BAR_LABEL_PX}" y="{y}" width="{length:.1f}" '
            f'height="{_BAR_PX}" fill="{colour}"/>',
            f'<text x="{_BAR_LABEL_PX + length + 6:.1f}" y="{y + 15}">{escape(bar.note)}</text>',
        ]
    return _svg(width, height, title, body, standalone=standalone)


def _drawn(value: float) -> bool:
    """A length a bar can have: finite and above zero."""
    return math.isfinite(value) and value > 0


def _cross(x: float, y: float, label: str) -> str:
    """A failed tier's point: a red cross (not a dot in the series' colour)."""
    arms = " ".join(
        f'<line x1="{x - 6:.1f}" y1="{y + dy * -6:.1f}" x2="{x + 6:.1f}" y2="{y + dy * 6:.1f}"/>'
        for dy in (1, -1)
    )
    return (
        f'<g class="failed-point" stroke="{FAILED}" stroke-width="3">{arms}'
        f"<title>{escape(label)}</title></g>"
    )


def line_chart(
    title: str,
    x_label: str,
    y_label: str,
    series: Sequence[Series],
    *,
    log_x: bool = False,
    width: int = 600,
    height: int = 340,
) -> str:
    """Lines with point markers, one colour per series, a legend when there are several; a failed
    tier's point is a red cross, the recommended setting a ring."""
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points]
    frame = _Frame(width, height, xs, ys, log_x)
    x_ticks = sorted(set(xs)) if log_x else nice_ticks(frame.x_lo, frame.x_hi)
    body = _axes(
        frame,
        [t for t in x_ticks if frame.x_lo <= frame._fx(t) <= frame.x_hi],
        title,
        x_label,
        y_label,
    )
    if not xs:
        body.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle">no data</text>')
    for number, line in enumerate(series):
        colour = COLOURS[number % len(COLOURS)]
        points = list(line.points) if line.in_given_order else sorted(line.points)
        coords = " ".join(f"{frame.px(x):.1f},{frame.py(y):.1f}" for x, y in points)
        body.append(f'<g class="series" data-label="{escape(line.label)}">')
        if len(points) > 1 and line.joined:
            body.append(
                f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2"/>'
            )
        for x, y in points:
            px, py = frame.px(x), frame.py(y)
            tip = f"{line.label}: {_label(x)}, {_label(y)}"
            if (x, y) in line.failed:
                body.append(_cross(px, py, f"{tip} (failed)"))
                continue
            body.append(
                f'<circle cx="{px:.1f}" cy="{py:.1f}" r="4" fill="{colour}">'
                f"<title>{escape(tip)}</title></circle>"
            )
            if line.chosen == (x, y):
                body.append(
                    f'<circle class="chosen-point" cx="{px:.1f}" cy="{py:.1f}" r="9" '
                    f'fill="none" stroke="{colour}" stroke-width="2">'
                    f"<title>{escape(tip)} (the setting)</title></circle>"
                )
        body.append("</g>")
        if len(series) > 1:  # the legend goes under the chart, one line per series
            y = height + 14 * number
            body.append(
                f'<rect x="{_LEFT_PX}" y="{y}" width="10" height="10" fill="{colour}"/>'
                f'<text x="{_LEFT_PX + 14}" y="{y + 9}">{escape(line.label)}</text>'
            )
    if any(p in s.failed for s in series for p in s.points):
        body.append(
            f'<text class="failed-key" x="{width - _RIGHT_PX}" y="{height - 8}" '
            f'text-anchor="end" fill="{FAILED}">✕ failed tier</text>'
        )
    legend_px = 14 * len(series) + 6 if len(series) > 1 else 0
    return _svg(width, height + legend_px, title, body)


def timeline_chart(title: str, bars: Sequence[Bar], *, width: int = 1200) -> str:
    """One horizontal bar per request (start → finish), a tick at its first token, failures red.

    Requests are drawn in start order top to bottom, so waiting shows as a staircase.
    """
    count = len(bars)
    row_px = 12.0 if count <= 60 else (6.0 if count <= 300 else max(0.5, 1800 / count))
    height = _TOP_PX + _BOTTOM_PX + math.ceil(max(1, count) * row_px)
    ends = [b.finish_s for b in bars] or [1.0]
    frame = _Frame(width, height, [0.0, max(ends)], [0.0, float(max(1, len(bars)))], False)
    x_ticks = [t for t in nice_ticks(frame.x_lo, frame.x_hi) if t <= frame.x_hi]
    body = _axes(
        frame,
        x_ticks,
        title,
        "seconds from the first request's start",
        "requests, in start order",
        y_ticks=False,
    )
    bar_px = row_px - 3.0 if row_px > 4 else row_px * 0.8
    for number, bar in enumerate(sorted(bars, key=lambda b: (b.start_s, b.finish_s))):
        y = _TOP_PX + number * row_px + min(1.0, row_px / 4)
        x0, x1 = frame.px(bar.start_s), frame.px(bar.finish_s)
        tip = f"{bar.label}: {bar.start_s:.3f} → {bar.finish_s:.3f} s"
        if bar.ttft_s is not None:
            tip += f", first token after {bar.ttft_s:.3f} s"
        body.append(
            f'<rect class="bar{"" if bar.ok else " failed"}" x="{x0:.1f}" y="{y:.1f}" '
            f'width="{max(1.0, x1 - x0):.1f}" height="{bar_px:.1f}" '
            f'fill="{COLOURS[0] if bar.ok else FAILED}"><title>{escape(tip)}</title></rect>'
        )
        if bar.ttft_s is not None:
            xt = frame.px(bar.start_s + bar.ttft_s)
            body.append(
                f'<line class="ttft" x1="{xt:.1f}" y1="{y - 1:.1f}" x2="{xt:.1f}" '
                f'y2="{y + bar_px + 1:.1f}" stroke="#111" stroke-width="2"/>'
            )
    return _svg(width, height, title, body)
