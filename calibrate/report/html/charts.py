"""The plots of the HTML report, as inline SVG: latency against throughput, throughput, peak
VRAM and memory pressure per tier; one line per run when two are compared."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from calibrate.numbers import finite
from calibrate.report.html.answer import setting_row
from calibrate.report.html.svg import Series, line_chart
from calibrate.report.run_view import RunView
from calibrate.stages.measure.tiers import kept


def first_column(rows: Sequence[Mapping[str, Any]], names: Sequence[str]) -> str | None:
    """The first of ``names`` that some row has a number in."""
    return next((n for n in names if any(finite(r.get(n)) is not None for r in rows)), None)


def points(rows: Sequence[Mapping[str, Any]], x: str, y: str) -> tuple[tuple[float, float], ...]:
    out = []
    for row in rows:
        px, py = finite(row.get(x)), finite(row.get(y))
        if px is not None and py is not None:
            out.append((px, py))
    return tuple(out)


def latency_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """End-to-end latency p50/p90/p99 under whichever names the run wrote, then TTFT."""
    found = []
    for pct in ("p50", "p90", "p99"):
        name = first_column(rows, (f"latency_{pct}_s", f"e2e_{pct}_s", f"per_item_{pct}_s"))
        if name:
            found.append(name)
    return found + [n for n in ("ttft_p50_s", "ttft_p99_s") if first_column(rows, (n,))]


def throughput_column(rows: Sequence[Mapping[str, Any]]) -> str:
    return first_column(rows, ("achieved_rate", "items_per_s")) or "items_per_s"


def key_label(key: str) -> str:
    return {
        "batch_size": "batch size",
        "concurrency": "concurrency",
        "offered_rate": "offered rate (req/s)",
        "auto_step": "auto step (0 = synchronous)",
        "input_tokens_target": "input tokens",
    }.get(key, key)


def _series(label: str, view: RunView, x: str, y: str, **style: Any) -> Series:
    """One run's line of ``y`` against ``x``: failed tiers crossed, the setting ringed."""
    pts = points(view.rows, x, y)
    failed = frozenset(
        p for row in view.rows if not kept(row.get("verdict")) for p in points([row], x, y)
    )
    chosen = setting_row(view)
    at = points([chosen], x, y) if chosen is not None else ()
    return Series(label, pts, failed=failed, chosen=at[0] if at else None, **style)


def charts_for(labelled: Sequence[tuple[str, RunView]]) -> list[str]:
    """Latency vs throughput, throughput, peak VRAM and pressure per tier; with several runs,
    one line per run (prefixed with its label) on the same axes."""
    key = labelled[0][1].key
    log_x = key in ("batch_size", "concurrency")
    every = [r for _, v in labelled for r in v.rows]
    x = throughput_column(every)
    lat = latency_columns(every)
    if len(labelled) > 1:  # two runs: p50 and p99 only, or the legend drowns the lines
        lat = [n for n in lat if "_p50_" in n or "_p99_" in n][:2] if lat else lat

    def tag(label: str, name: str) -> str:
        return f"{label}: {name}" if label else name

    def per_run(name: str, x_col: str, **style: Any) -> list[Series]:
        return [_series(tag(label, name), v, x_col, name, **style) for label, v in labelled]

    latency = [s for n in lat for s in per_run(n, x, in_given_order=True)]
    pressure = [
        s
        for n in ("pressure", "peak_kv_usage")
        if first_column(every, (n,))
        for s in per_run(n, key)
    ]
    return [
        line_chart("latency vs throughput", x, "seconds", latency),
        line_chart("throughput", key_label(key), x, per_run(x, key), log_x=log_x),
        line_chart(
            "peak VRAM per tier", key_label(key), "MiB", per_run("peak_vram_mib", key), log_x=log_x
        ),
        line_chart(
            "memory pressure per tier", key_label(key), "fraction (0–1)", pressure, log_x=log_x
        ),
    ]


def charts_pair(a: RunView, b: RunView) -> list[str]:
    return charts_for([("A", a), ("B", b)])
