"""The PNG plots of a run: ``plot.png`` (its tiers) and ``timeline-<tier>.png`` (one tier's
requests); matplotlib is imported lazily, and without it no PNG is written (the HTML report
draws its own SVG)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from calibrate.errors import InputError
from calibrate.io.atomic import write_atomic_with
from calibrate.io.tier_table import Kind
from calibrate.report.html.svg import Bar
from calibrate.report.tables.cells import context_axis

log = logging.getLogger("calibrate")
MAX_TIMELINE_S = 1e7  # 115 days: longer than any stage runs


def _pyplot(missing: str) -> Any:
    """matplotlib's pyplot on the Agg backend; None (``missing`` logged) when not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("matplotlib is not installed: no %s (pip install 'calibrate[plot]')", missing)
        return None
    return plt


def _save(fig: Any, path: Path) -> None:
    """Lay the figure out and write it to ``path`` atomically (its folder made if need be): a
    full disk leaves no empty or half-drawn PNG behind."""
    fig.tight_layout()
    write_atomic_with(path, lambda handle: fig.savefig(handle, dpi=100, format="png"))


def write_plot(rows: Sequence[Mapping[str, Any]], kind: Kind, path: Path) -> Path | None:
    """plot.png: per-item latency, throughput and peak VRAM; None when matplotlib is missing."""
    plt = _pyplot("plot.png")
    if plt is None:
        return None
    x_name = "batch_size" if kind == "ladder" else "concurrency"
    if kind == "ladder" and context_axis(rows):
        x_name = "input_tokens_target"  # bisected lengths come after longer ones: sort them
        rows = sorted(rows, key=lambda r: float(r[x_name]))
    xs = [round(float(r[x_name])) for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    try:
        series = [
            (
                "time per item, request latency (s)",
                ["per_item_s", "latency_p50_s", "latency_p90_s"],
            ),
            ("throughput (items/s)", ["items_per_s", "items_per_s_min", "items_per_s_max"]),
            ("peak VRAM (MiB)", ["peak_vram_mib"]),
        ]
        for ax, (title, keys) in zip(axes, series, strict=True):
            for key in keys:
                if all(r.get(key) is None for r in rows):
                    continue  # e.g. the range of a ladder, or per_item_s of an old table
                ys = [float("nan") if r.get(key) is None else float(r[key]) for r in rows]
                ax.plot(xs, ys, marker="o", label=key)
            ax.set_title(title)
            ax.set_xlabel(x_name)
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
            if len(ax.get_lines()) > 1:
                ax.legend(fontsize="small")
        fig.suptitle(f"calibrate {kind}: {path.parent.name}")
        _save(fig, path)
    finally:
        plt.close(fig)
    return path


def write_timeline_png(bars: Sequence[Bar], title: str, path: Path) -> Path | None:
    """timeline-<tier>.png: one bar per request (start → finish), TTFT ticks; None without
    matplotlib."""
    plt = _pyplot(path.name)
    if plt is None:
        return None
    ordered = sorted(bars, key=lambda b: (b.start_s, b.finish_s))
    for bar in ordered:
        times = (bar.start_s, bar.finish_s, bar.ttft_s or 0.0)
        if not all(math.isfinite(t) and abs(t) <= MAX_TIMELINE_S for t in times):
            raise InputError(
                f"{path.parent / 'records.jsonl'}: {bar.label} starts or ends "
                f"{max(abs(t) for t in times):g} s from the first one: not a time a stage "
                "records (a damaged file?)",
                "Rerun the stage, or draw the timeline without the plot: --no-plot.",
            )
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.12 * len(ordered) + 1.5)))
    try:
        for number, bar in enumerate(ordered):
            colour = "tab:blue" if bar.ok else "tab:red"
            ax.barh(number, bar.finish_s - bar.start_s, left=bar.start_s, height=0.7, color=colour)
            if bar.ttft_s is not None:
                ax.plot([bar.start_s + bar.ttft_s] * 2, [number - 0.4, number + 0.4], color="black")
        ax.invert_yaxis()
        ax.set_xlabel("seconds from the first request's start")
        ax.set_ylabel("requests, in start order")
        ax.set_title(title)
        _save(fig, path)
    finally:
        plt.close(fig)
    return path
