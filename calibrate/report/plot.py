"""The PNG plots of a run: ``plot.png`` (its tiers) and ``timeline-<tier>.png`` (one tier's
requests); matplotlib is imported lazily, and without it no PNG is written (the HTML report
draws its own SVG)."""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from calibrate.errors import InputError
from calibrate.io.atomic import write_atomic_with
from calibrate.io.tier_table.cells import key_value
from calibrate.io.tier_table.columns import Column as C
from calibrate.io.tier_table.columns import Kind
from calibrate.io.tier_table.row import TierRow
from calibrate.report.html.svg import Bar
from calibrate.report.tables.cells import context_axis

log = logging.getLogger("calibrate")
MAX_TIMELINE_S = 1e7  # 115 days: longer than any stage runs


def _figures(missing: str, cache_dir: str) -> Callable[..., Any] | None:
    """A maker of matplotlib figures on the Agg canvas, ``figure(figsize=…)``; None
    (``missing`` logged) when matplotlib is not installed.

    Figures are made bare (``matplotlib.figure.Figure``), not through pyplot: no figure manager,
    no global state to close. Its config and font cache go to ``cache_dir``/matplotlib (the
    cache calibrate names), else to a temporary folder removed at exit — never to a HOME it
    would create or warn about — and its own warnings and log lines are not shown (``_quiet``)."""
    if "matplotlib" not in sys.modules and "MPLCONFIGDIR" not in os.environ:
        os.environ["MPLCONFIGDIR"] = _config_folder(cache_dir)
    logging.getLogger("matplotlib").setLevel(logging.ERROR)  # "building the font cache", …
    try:
        with _quiet():
            import matplotlib  # noqa: F401  (the package first: where it is missing, no more)
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure as MplFigure
    except ImportError:
        log.info("matplotlib is not installed: no %s (pip install 'calibrate[plot]')", missing)
        return None

    def figure(**kwargs: Any) -> Any:
        fig = MplFigure(**kwargs)
        FigureCanvasAgg(fig)
        return fig

    return figure


def _config_folder(cache_dir: str) -> str:
    """``cache_dir``/matplotlib where it can be made and written, else a temporary folder."""
    if cache_dir:
        folder = Path(cache_dir) / "matplotlib"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError:
            pass
        else:
            return str(folder)
    temporary = tempfile.mkdtemp(prefix="calibrate-matplotlib-")
    atexit.register(shutil.rmtree, temporary, ignore_errors=True)
    return temporary


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """While matplotlib loads and draws: its warnings are not the user's to read."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _save(fig: Any, path: Path) -> None:
    """Write the figure to ``path`` atomically (its folder made if need be): a full disk leaves
    no empty or half-drawn PNG behind."""
    write_atomic_with(path, lambda handle: fig.savefig(handle, dpi=100, format="png"))


def write_plot(rows: Sequence[TierRow], kind: Kind, path: Path, cache_dir: str = "") -> Path | None:
    """plot.png: per-item latency, throughput and peak VRAM; None when matplotlib is missing."""
    figure = _figures("plot.png", cache_dir)
    if figure is None:
        return None
    with _quiet():
        _draw_plot(figure, rows, kind, path)
    return path


Figure = Callable[[TierRow], float | int | None]
# Per panel: its title and its lines (a legend's name, the row's figure).
_PANELS: tuple[tuple[str, tuple[tuple[str, Figure], ...]], ...] = (
    (
        "time per item, request latency (s)",
        (
            (C.PER_ITEM_S, lambda r: r.per_item_s),
            (C.LATENCY_P50_S, lambda r: r.latency.p50_s),
            (C.LATENCY_P90_S, lambda r: r.latency.p90_s),
        ),
    ),
    (
        "throughput (items/s)",
        (
            (C.ITEMS_PER_S, lambda r: r.items_per_s),
            (C.ITEMS_PER_S_MIN, lambda r: r.sweep.items_per_s_min),
            (C.ITEMS_PER_S_MAX, lambda r: r.sweep.items_per_s_max),
        ),
    ),
    ("peak VRAM (MiB)", ((C.PEAK_VRAM_MIB, lambda r: r.memory.peak_vram_mib),)),
)


def _draw_plot(figure: Callable[..., Any], rows: Sequence[TierRow], kind: Kind, path: Path) -> None:
    x_name = C.BATCH_SIZE if kind == "ladder" else C.CONCURRENCY
    if kind == "ladder" and context_axis(rows):
        x_name = C.INPUT_TOKENS_TARGET  # bisected lengths come after longer ones: sort them
        rows = sorted(rows, key=lambda r: key_value(r, x_name) or 0.0)
    xs = [round(key_value(r, x_name) or 0.0) for r in rows]
    fig = figure(figsize=(13, 3.8))
    # fixed margins with room for five-digit ticks (MiB) beside each panel: tight_layout drew
    # the figure once more to measure it, 0.19 of the 0.48 s of CPU a plot took
    fig.subplots_adjust(left=0.055, right=0.99, bottom=0.14, top=0.83, wspace=0.25)
    for ax, (title, lines) in zip(fig.subplots(1, 3), _PANELS, strict=True):
        for name, value in lines:
            if all(value(r) is None for r in rows):
                continue  # e.g. the range of a ladder, or per_item_s of an old table
            ys = [float("nan") if (y := value(r)) is None else float(y) for r in rows]
            ax.plot(xs, ys, marker="o", label=name)
        ax.set_title(title)
        ax.set_xlabel(x_name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        if len(ax.get_lines()) > 1:
            ax.legend(fontsize="small")
    fig.suptitle(f"calibrate {kind}: {path.parent.name}")
    _save(fig, path)


def write_timeline_png(
    bars: Sequence[Bar], title: str, path: Path, cache_dir: str = ""
) -> Path | None:
    """timeline-<tier>.png: one bar per request (start → finish), TTFT ticks; None without
    matplotlib."""
    figure = _figures(path.name, cache_dir)
    if figure is None:
        return None
    with _quiet():
        _draw_timeline(figure, bars, title, path)
    return path


def _draw_timeline(figure: Callable[..., Any], bars: Sequence[Bar], title: str, path: Path) -> None:
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
    fig = figure(figsize=(10, max(2.5, 0.12 * len(ordered) + 1.5)))
    ax = fig.subplots()
    for number, bar in enumerate(ordered):
        colour = "tab:blue" if bar.ok else "tab:red"
        ax.barh(number, bar.finish_s - bar.start_s, left=bar.start_s, height=0.7, color=colour)
        if bar.ttft_s is not None:
            ax.plot([bar.start_s + bar.ttft_s] * 2, [number - 0.4, number + 0.4], color="black")
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the first request's start")
    ax.set_ylabel("requests, in start order")
    ax.set_title(title)
    fig.tight_layout()  # drawn when asked for (report --timeline), its height grows with it
    _save(fig, path)
