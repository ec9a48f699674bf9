"""The plots of the HTML report, as inline SVG: latency against throughput, throughput, peak
VRAM and memory pressure per tier; one line per run when two are compared."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from calibrate.io.tier_table.cells import numbers
from calibrate.io.tier_table.columns import Column as C
from calibrate.io.tier_table.row import TierRow
from calibrate.report.html.answer import setting_row
from calibrate.report.html.svg import Series, line_chart
from calibrate.report.run_view import RunView
from calibrate.stages.measure.tier import kept

# End-to-end latency p50/p90/p99 under either name a run wrote, then TTFT.
_LATENCY = (
    (C.LATENCY_P50_S, C.E2E_P50_S),
    (C.LATENCY_P90_S, C.E2E_P90_S),
    (C.LATENCY_P99_S, C.E2E_P99_S),
    (C.TTFT_P50_S,),
    (C.TTFT_P99_S,),
)


def first_column(rows: Sequence[TierRow], names: Sequence[C]) -> C | None:
    """The first of ``names`` that some row has a number in."""
    return next((n for n in names if any(n in numbers(r) for r in rows)), None)


def points(rows: Sequence[TierRow], x: C, y: C) -> tuple[tuple[float, float], ...]:
    out = []
    for row in rows:
        found = numbers(row)
        px, py = found.get(x), found.get(y)
        if px is not None and py is not None:
            out.append((px, py))
    return tuple(out)


def latency_columns(rows: Sequence[TierRow]) -> list[C]:
    """End-to-end latency p50/p90/p99 under whichever names the run wrote, then TTFT."""
    return [name for names in _LATENCY if (name := first_column(rows, names))]


def throughput_column(rows: Sequence[TierRow]) -> C:
    return first_column(rows, (C.ACHIEVED_RATE, C.ITEMS_PER_S)) or C.ITEMS_PER_S


def key_label(key: C) -> str:
    return {
        C.BATCH_SIZE: "batch size",
        C.CONCURRENCY: "concurrency",
        C.OFFERED_RATE: "offered rate (req/s)",
        C.AUTO_STEP: "auto step (0 = synchronous)",
        C.INPUT_TOKENS_TARGET: "input tokens",
    }.get(key, key)


def _series(label: str, view: RunView, x: C, y: C, **style: Any) -> Series:
    """One run's line of ``y`` against ``x``: failed tiers crossed, the setting ringed."""
    pts = points(view.rows, x, y)
    failed = frozenset(p for row in view.rows if not kept(row.verdict) for p in points([row], x, y))
    chosen = setting_row(view)
    at = points([chosen], x, y) if chosen is not None else ()
    return Series(label, pts, failed=failed, chosen=at[0] if at else None, **style)


def charts_for(labelled: Sequence[tuple[str, RunView]]) -> list[str]:
    """Latency vs throughput, throughput, peak VRAM and pressure per tier; with several runs,
    one line per run (prefixed with its label) on the same axes."""
    key = labelled[0][1].key
    log_x = key in (C.BATCH_SIZE, C.CONCURRENCY)
    every = [r for _, v in labelled for r in v.rows]
    x = throughput_column(every)
    lat = latency_columns(every)
    if len(labelled) > 1:  # two runs: p50 and p99 only, or the legend drowns the lines
        lat = [n for n in lat if "_p50_" in n or "_p99_" in n][:2] if lat else lat

    def tag(label: str, name: str) -> str:
        return f"{label}: {name}" if label else name

    def per_run(name: C, x_col: C, **style: Any) -> list[Series]:
        return [_series(tag(label, name), v, x_col, name, **style) for label, v in labelled]

    latency = [s for n in lat for s in per_run(n, x, in_given_order=True)]
    pressure = [
        s
        for n in (C.PRESSURE, C.PEAK_KV_USAGE)
        if first_column(every, (n,))
        for s in per_run(n, key)
    ]
    return [
        line_chart("latency vs throughput", x, "seconds", latency),
        line_chart("throughput", key_label(key), x, per_run(x, key), log_x=log_x),
        line_chart(
            "peak VRAM per tier", key_label(key), "MiB", per_run(C.PEAK_VRAM_MIB, key), log_x=log_x
        ),
        line_chart(
            "memory pressure per tier", key_label(key), "fraction (0–1)", pressure, log_x=log_x
        ),
    ]


def charts_pair(a: RunView, b: RunView) -> list[str]:
    return charts_for([("A", a), ("B", b)])
