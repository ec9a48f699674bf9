"""Tier tables and plots: the only importer of rich tables; matplotlib lazily.

``tiers.csv`` is written and read back through ``io.tier_table`` and printed here, so
``calibrate report RUN`` prints exactly what the ladder or sweep printed when it finished.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from calibrate.errors import InputError
from calibrate.io.output_paths import Named
from calibrate.io.tier_table import Kind, kinds_text, read_rows, write_tiers_csv
from calibrate.numbers import finite
from calibrate.report.compare import (
    RunComparison,
    Spreads,
    headline,
    spread_text,
)
from calibrate.report.html.svg import Bar
from calibrate.report.progress import Plan, progress_bar
from calibrate.report.run_view import RunView
from calibrate.stages.measure.compare_tiers import TierComparison
from calibrate.stages.measure.confidence import percent

log = logging.getLogger("calibrate")
MAX_TIMELINE_S = 1e7  # 115 days: longer than any stage runs

# the table is read and written in io.tier_table; these names stay for the views
__all__ = ["Kind", "read_rows", "write_tiers_csv"]


RUN_INPUTS = ("tiers.csv", "manifest.json", "summary.json", "records.jsonl", "incidents.jsonl")


def run_inputs(run: Path) -> list[Named]:
    """The files of a run folder that report reads (an --html must not be one of them)."""
    return [(f"the run's {name}", run / name) for name in RUN_INPUTS]


def run_kind(run: Path) -> Kind:
    """From the manifest's stage; a folder without one is told by its columns."""
    try:
        manifest = json.loads((run / "manifest.json").read_text("utf-8"))
    except (OSError, ValueError):
        manifest = None
    stage = manifest.get("stage") if isinstance(manifest, dict) else None
    if stage in ("ladder", "sweep"):
        return "ladder" if stage == "ladder" else "sweep"
    return "sweep" if "gain" in read_rows(run / "tiers.csv")[0] else "ladder"


def _f(value: Any, fmt: str) -> str:
    return "—" if value is None or value == "" else format(float(value), fmt)


def _pressure(row: Mapping[str, Any]) -> str:
    if row.get("pressure") is None:
        return "not measured"
    return f"{float(row['pressure']):.0%} {row.get('pressure_source') or ''}".strip()


def _pressure_short(row: Mapping[str, Any]) -> str:
    """The default table's pressure: the figure alone (its source is said once, above)."""
    return "—" if row.get("pressure") is None else f"{float(row['pressure']):.0%}"


def _match(row: Mapping[str, Any]) -> str:
    if row.get("baseline_match") is None or not row.get("baseline_items"):
        return "—"
    return f"{int(row['baseline_match'])}/{int(row['baseline_items'])}"


def _in_tokens(row: Mapping[str, Any]) -> str:
    """``3000→3006`` (target → what the server counted), or the count alone when not sized."""
    actual = _f(row.get("input_tokens_mean"), ".0f")
    if row.get("input_tokens_target") in (None, ""):
        return actual
    return f"{_f(row.get('input_tokens_target'), '.0f')}→{actual}"


_TOKEN_CELLS: list[tuple[str, Callable[[Mapping[str, Any]], str]]] = [
    ("in tok", _in_tokens),
    ("out tok", lambda r: _f(r.get("output_tokens_mean"), ".0f")),
]


def _range(row: Mapping[str, Any]) -> str:
    """A level's lowest–highest throughput over its runs (a single run has no range)."""
    low, high = row.get("items_per_s_min"), row.get("items_per_s_max")
    if low is None or high is None:
        return "—"
    if row.get("repeats") == 1:
        return "one run"
    return f"{float(low):.2f}–{float(high):.2f}"


def _gain(row: Mapping[str, Any]) -> str:
    """``+85%``; in parentheses when it did not count (below gain_min, or within noise)."""
    if row.get("gain") is None:
        return "—"
    text = f"{float(row['gain']):+.0%}"
    return (
        f"({text})"
        if row.get("gain_counted") is not None and not _true(row["gain_counted"])
        else text
    )


_LADDER: list[tuple[str, Callable[[Mapping[str, Any]], str]]] = [
    ("batch", lambda r: str(int(r["batch_size"]))),
    ("conc", lambda r: str(int(r["concurrency"]))),
    ("rounds", lambda r: str(int(r["rounds"]))),
    ("waves", lambda r: _f(r.get("waves"), ".0f")),
    ("items", lambda r: str(int(r["items"]))),
    *_TOKEN_CELLS,
    ("s/item", lambda r: _f(r.get("per_item_s"), ".4f")),
    ("p50 s", lambda r: _f(r.get("latency_p50_s"), ".3f")),
    ("p90 s", lambda r: _f(r.get("latency_p90_s"), ".3f")),
    ("p99 s", lambda r: _f(r.get("latency_p99_s"), ".3f")),
    ("max s", lambda r: _f(r.get("latency_max_s"), ".3f")),
    ("ttft p50", lambda r: _f(r.get("ttft_p50_s"), ".3f")),
    ("ttft p99", lambda r: _f(r.get("ttft_p99_s"), ".3f")),
    ("tpot p99", lambda r: _f(r.get("tpot_p99_s"), ".4f")),
    ("itl p99", lambda r: _f(r.get("itl_p99_s"), ".4f")),
    ("items/s", lambda r: _f(r.get("items_per_s"), ".2f")),
    ("tok/s", lambda r: _f(r.get("output_tokens_per_s"), ".0f")),
    ("goodput", lambda r: _f(r.get("goodput_per_s"), ".2f")),
    ("J/tok", lambda r: _f(r.get("joules_per_output_token"), ".3g")),
    ("peak MiB", lambda r: _f(r.get("peak_vram_mib"), ".0f")),
    ("pressure", _pressure),
    ("queue", lambda r: _f(r.get("server_queue_max"), ".0f")),
    ("errors", lambda r: f"{int(r['errors'])} {kinds_text(r.get('error_kinds'))}".strip()),
    ("match", _match),
    ("verdict", lambda r: str(r["verdict"])),
]
_SWEEP: list[tuple[str, Callable[[Mapping[str, Any]], str]]] = [
    ("conc", lambda r: str(int(r["concurrency"]))),
    ("batch", lambda r: str(int(r["batch_size"]))),
    ("runs", lambda r: _f(r.get("repeats"), ".0f")),
    ("items", lambda r: str(int(r["items"]))),
    ("total s", lambda r: _f(r.get("total_s"), ".2f")),
    *_TOKEN_CELLS,
    ("offered", lambda r: _rate(r.get("offered_rate"), r)),
    ("achieved", lambda r: _f(r.get("achieved_rate"), ".2f")),
    ("items/s", lambda r: _f(r.get("items_per_s"), ".2f")),
    ("range", _range),
    ("gain", _gain),
    ("tok/s", lambda r: _f(r.get("output_tokens_per_s"), ".0f")),
    ("goodput", lambda r: _f(r.get("goodput_per_s"), ".2f")),
    ("J/tok", lambda r: _f(r.get("joules_per_output_token"), ".3g")),
    ("p50 s", lambda r: _f(r.get("latency_p50_s"), ".3f")),
    ("p90 s", lambda r: _f(r.get("latency_p90_s"), ".3f")),
    ("p99 s", lambda r: _f(r.get("latency_p99_s"), ".3f")),
    ("ttft p50", lambda r: _f(r.get("ttft_p50_s"), ".3f")),
    ("ttft p99", lambda r: _f(r.get("ttft_p99_s"), ".3f")),
    ("tpot p50", lambda r: _f(r.get("tpot_p50_s"), ".4f")),
    ("tpot p99", lambda r: _f(r.get("tpot_p99_s"), ".4f")),
    ("itl p99", lambda r: _f(r.get("itl_p99_s"), ".4f")),
    ("lag p99", lambda r: _f(r.get("send_lag_p99_s"), ".3f")),
    ("peak MiB", lambda r: _f(r.get("peak_vram_mib"), ".0f")),
    ("queue", lambda r: _f(r.get("server_queue_max"), ".0f")),
    ("errors", lambda r: f"{int(r['errors'])} {kinds_text(r.get('error_kinds'))}".strip()),
    ("verdict", lambda r: _level_verdict(r)),
]


def _level_verdict(row: Mapping[str, Any]) -> str:
    return (
        str(row["verdict"])
        + (" saturated" if _true(row.get("saturated")) else "")
        + (" (over server cap)" if _true(row.get("capped_by_server")) else "")
    )


def _rate(value: Any, row: Mapping[str, Any]) -> str:
    """An offered rate; ``inf`` for a rate level sent all at once; an auto sweep's closed-loop
    ends are ``sync`` and ``max``."""
    load = row.get("load")
    if load in ("synchronous", "maximum"):
        return "sync" if load == "synchronous" else "max"
    if value is None or value == "":
        return "inf" if row.get("achieved_rate") not in (None, "") else "—"
    return _f(value, "g")


def _true(value: Any) -> bool:
    return value is True or str(value).lower() == "true"


def context_axis(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Rows of ``ladder --axis context``: keyed by input length, not batch size."""
    return any(r.get("axis") == "context" for r in rows)


# The default table (fits 100 columns): what a user needs to pick a setting. --wide, tiers.csv,
# the JSONL and the HTML report carry every column.
ESSENTIAL: dict[Kind, tuple[str, ...]] = {
    "ladder": (
        "input",
        "batch",
        "conc",
        "in tok",
        "items/s",
        "s/item",
        "p50 s",
        "p99 s",
        "ttft p99",
        "goodput",
        "J/tok",  # only when energy was measured (the column is left out otherwise)
        "peak MiB",
        "pressure",
        "errors",
        "verdict",
    ),
    "sweep": (
        "conc",
        "offered",
        "achieved",
        "items/s",
        "range",
        "gain",
        "goodput",
        "p50 s",
        "p99 s",
        "ttft p99",
        "J/tok",  # only when energy was measured (the column is left out otherwise)
        "peak MiB",
        "errors",
        "verdict",
    ),
}
_Cells = list[tuple[str, Callable[[Mapping[str, Any]], str]]]


def _columns(kind: Kind, rows: Sequence[Mapping[str, Any]] = (), wide: bool = True) -> _Cells:
    if kind == "sweep":
        columns = _SWEEP
    elif context_axis(rows):
        length = ("input", lambda r: _f(r.get("input_tokens_target"), ".0f"))
        columns = [length, *_LADDER]
    else:
        columns = _LADDER
    if wide:
        return columns
    short = [
        ("pressure", _pressure_short) if name == "pressure" else (name, cell)
        for name, cell in columns
    ]
    return [
        (name, cell)
        for name, cell in short
        if name in ESSENTIAL[kind] and (name != "in tok" or _sized(rows))
    ]


def _sized(rows: Sequence[Mapping[str, Any]]) -> bool:
    """A workload with an input-token target: ``in tok`` (target→counted) says it was met."""
    return any(r.get("input_tokens_target") not in (None, "") for r in rows)


# On a narrow terminal these go first (in this order), so the cells left stay readable.
_DROP_FIRST: dict[Kind, tuple[str, ...]] = {
    "ladder": (  # goodput is never dropped: under SLOs it is the tier's headline, as in a sweep
        "itl p99",
        "ttft p50",
        "rounds",
        "out tok",
        "waves",
        "tpot p99",
        "ttft p99",
        "max s",
        "p90 s",
        "items",
        "queue",
        "p99 s",
        "tok/s",
        "in tok",
        "p50 s",
        "conc",
        "match",
    ),
    "sweep": (
        "lag p99",
        "itl p99",
        "tpot p50",
        "ttft p50",
        "tpot p99",
        "achieved",
        "ttft p99",
        "p99 s",
        "items",
        "out tok",
        "runs",
        "batch",
        "total s",
        "queue",
        "tok/s",
        "in tok",
        "p90 s",
        "p50 s",
    ),
}
# Shown only when some row has a value (TTFT and TPOT need a streamed run).
_WHEN_MEASURED = (
    "ttft p99",
    "tpot p99",
    "ttft p50",
    "tpot p50",
    "itl p99",
    "goodput",
    "offered",
    "achieved",
    "lag p99",
    "J/tok",  # joules per output token: NVML or a DCGM exporter (SPEC §13)
)


def _fitting_columns(
    rows: Sequence[Mapping[str, Any]], kind: Kind, width: int | None, wide: bool = True
) -> _Cells:
    columns = [
        (name, cell)
        for name, cell in _columns(kind, rows, wide)
        if name not in _WHEN_MEASURED or any(cell(row) != "—" for row in rows)
    ]
    if width is None:
        return columns
    for name in _DROP_FIRST[kind]:
        if table_width(columns, rows) <= width:
            break
        columns = [c for c in columns if c[0] != name]
    return columns


def table_width(columns: _Cells, rows: Sequence[Mapping[str, Any]]) -> int:
    """The width of a ``compact`` table of these columns: each cell's widest text and two
    spaces between columns."""
    return -2 + sum(
        2 + max([len(name), *(len(cell(row)) for row in rows)]) for name, cell in columns
    )


def compact(title: str | None = None) -> Table:
    """A table without column rules, side edges or a bottom rule: a rule under the header, two
    spaces between columns; as wide as its cells, few lines."""
    return Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1, 0, 0),
        pad_edge=False,
    )


def tier_table(
    rows: Sequence[Mapping[str, Any]],
    kind: Kind,
    title: str | None = None,
    width: int | None = None,
    *,
    wide: bool = False,
) -> Table:
    """The tier (or level) table: the essential columns (every one with ``wide``); with
    ``width``, minor columns are left out until it fits."""
    columns = _fitting_columns(rows, kind, None if wide else width, wide)
    table = compact(title)
    for name, _ in columns:
        table.add_column(
            name,
            justify="left" if name in ("verdict", "errors", "pressure") else "right",
            overflow="fold",
        )
    for row in rows:
        style = (
            "red"
            if row.get("verdict") == "fail"
            else ("yellow" if str(row.get("verdict")).startswith("stop") else None)
        )
        table.add_row(*(cell(row) for _, cell in columns), style=style)
    return table


def plain_line(row: Mapping[str, Any], kind: Kind) -> str:
    """Every column of one tier as ``key=value`` (tests and --debug; logs get ``tier_line``)."""
    cells = [(name, cell(row)) for name, cell in _columns(kind, [row])]
    return "  ".join(
        f"{name.replace(' ', '_')}={text}"
        for name, text in cells
        if name not in _WHEN_MEASURED or text != "—"
    )


def tier_line(row: Mapping[str, Any], kind: Kind) -> str:
    """One short line per finished tier (level) for a log: the numbers that pick a setting,
    e.g. ``batch 4: 15.96 items/s, 0.0627 s/item, p99 0.253 s, 49152 MiB, 0 errors — pass``."""
    if kind == "sweep":
        rate = row.get("offered_rate")
        load = row.get("load")
        if load in ("synchronous", "maximum"):
            head = f"{_rate(rate, row)} (conc {int(row['concurrency'])})"
        elif rate not in (None, ""):
            head = f"rate {_rate(rate, row)} (conc {int(row['concurrency'])})"
        else:
            head = f"conc {int(row['concurrency'])}"
        spread = _range(row)
        figures = [
            f"{_f(row.get('items_per_s'), '.2f')} items/s"
            + (f" ({spread})" if spread not in ("—", "one run") else "")
        ]
        if row.get("gain") is not None:
            figures.append(f"gain {_gain(row)}")
    else:
        head = f"batch {int(row['batch_size'])}"
        if context_axis([row]):  # one batch size, said before the first tier
            head = f"input {_f(row.get('input_tokens_target'), '.0f')}"
        figures = [
            f"{_f(row.get('items_per_s'), '.2f')} items/s",
            f"{_f(row.get('per_item_s'), '.4f')} s/item",
        ]
    if row.get("goodput_per_s") not in (None, ""):
        figures.append(f"goodput {_f(row.get('goodput_per_s'), '.2f')}/s")
    if row.get("latency_p99_s") not in (None, ""):
        figures.append(f"p99 {_f(row.get('latency_p99_s'), '.3f')} s")
    if row.get("peak_vram_mib") not in (None, ""):
        figures.append(f"{_f(row.get('peak_vram_mib'), '.0f')} MiB")
    count = int(row.get("errors") or 0)
    kinds = kinds_text(row.get("error_kinds"))
    figures.append(f"{count} error{'' if count == 1 else 's'}" + (f" ({kinds})" if kinds else ""))
    verdict = _level_verdict(row) if kind == "sweep" else str(row["verdict"])
    return f"{head}: {', '.join(figures)} — {verdict}"


@contextmanager
def live_rows(
    console: Console,
    kind: Kind,
    title: str,
    live: bool,
    *,
    wide: bool = False,
    plan: Plan | None = None,
) -> Iterator[Callable[[Mapping[str, Any]], None]]:
    """On a TTY a table that grows as rows finish, a progress bar under it; in a log one short
    line per row (the table comes once, at the end: ``finish_tables``)."""
    rows: list[Mapping[str, Any]] = []
    if not live:
        yield lambda row: console.print(tier_line(row, kind), markup=False, highlight=False)
        return
    bar = progress_bar(console, plan) if plan is not None and plan.steps > 0 else None
    task = bar.add_task(kind, total=plan.steps) if bar is not None and plan is not None else None

    def view(done: bool = False) -> RenderableType:
        table = tier_table(rows, kind, title, console.width)
        return table if bar is None or done else Group(table, bar)

    # with --wide the table printed at the end has every column: this one goes when done
    with Live(view(), console=console, refresh_per_second=4, transient=wide) as display:

        def add(row: Mapping[str, Any]) -> None:
            rows.append(row)
            if bar is not None and task is not None:
                bar.advance(task)
            display.update(view())

        try:
            yield add
        finally:
            display.update(view(done=True))


def compare_table(cmp: TierComparison) -> Table:
    """Baseline, now and change side by side; offending cells marked."""
    table = compact(f"compared with {cmp.baseline_path} (tolerance {cmp.tolerance:.0%})")
    for name in (
        cmp.key_name,
        "verdict: baseline",
        "now",
        f"{cmp.metric_name}: baseline",
        "now",
        "change",
    ):
        table.add_column(name)

    def mark(text: str, bad: bool) -> str:
        return f"[bold red]{text} ✗[/]" if bad else text

    for row in cmp.rows:
        table.add_row(
            str(row.key),
            row.verdict.baseline,
            mark(row.verdict.now, row.verdict.bad),
            row.metric.baseline,
            mark(row.metric.now, row.metric.bad),
            row.change,
        )
    table.add_row(
        "last passing",
        cmp.last_passing.baseline,
        mark(cmp.last_passing.now, cmp.last_passing.bad),
        "",
        "",
        "",
    )
    return table


def write_plot(rows: Sequence[Mapping[str, Any]], kind: Kind, path: Path) -> Path | None:
    """plot.png: per-item latency, throughput and peak VRAM; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("matplotlib is not installed: no plot.png (pip install 'calibrate[plot]')")
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
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path


def table_cells(rows: Sequence[Mapping[str, Any]], kind: Kind) -> _Cells:
    """The terminal table's columns (all of them, as on a wide screen), for the HTML report."""
    return _fitting_columns(rows, kind, None)


def write_timeline_png(bars: Sequence[Bar], title: str, path: Path) -> Path | None:
    """timeline-<tier>.png: one bar per request (start → finish), TTFT ticks; None without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("matplotlib is not installed: no %s (pip install 'calibrate[plot]')", path.name)
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
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path


# report A B: a short header per metric, so none is cut ("items_per…") at 100 columns.
SHORT_NAMES = {
    "batch_size": "batch",
    "concurrency": "conc",
    "offered_rate": "rate",
    "auto_step": "step",
    "input_tokens_target": "input",
    "items_per_s": "items/s",
    "achieved_rate": "achieved",
    "goodput": "goodput",
    "goodput_per_s": "goodput",
    "output_tokens_per_s": "tok/s",
    "per_item_s": "s/item",
    "per_item_mean_s": "s/item",
    "latency_p50_s": "p50 s",
    "e2e_p50_s": "e2e p50",
    "per_item_p50_s": "p50 s",
    "latency_p99_s": "p99 s",
    "e2e_p99_s": "e2e p99",
    "per_item_p99_s": "p99 s",
    "ttft_p50_s": "ttft p50",
    "ttft_p99_s": "ttft p99",
    "tpot_p99_s": "tpot p99",
    "itl_p99_s": "itl p99",
    "peak_vram_mib": "peak MiB",
    "pressure": "pressure",
    "errors": "errors",
}


def short_name(column: str) -> str:
    return SHORT_NAMES.get(column, column.removesuffix("_s").replace("_", " "))


# The metrics the default ``report A B`` table shows first (a setting is picked on these);
# the others follow while the table fits. --wide: every one in the headline order.
_FIRST = (
    "items_per_s",
    "achieved_rate",
    "goodput",
    "latency_p99_s",
    "e2e_p99_s",
    "per_item_p99_s",
    "ttft_p99_s",
    "peak_vram_mib",
    "errors",
)


def _by_use(metrics: Sequence[str]) -> list[str]:
    return sorted(metrics, key=lambda m: _FIRST.index(m) if m in _FIRST else len(_FIRST))


def _short(value: float | None) -> str:
    """Three significant digits (the JSON and the HTML keep more): ``0.00823``, ``76.4``."""
    if value is None:
        return "—"
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _pair_cell(delta: Any, side: Mapping[str, Any] | None, metric: str) -> tuple[str, str]:
    """``8 → 6 (-25%)`` and its colour; ``(+27%, significant)`` when tested over the rounds
    (the caption says at what level)."""
    if delta is None:
        return _short(finite((side or {}).get(metric))), ""
    text = f"{_short(delta.a)} → {_short(delta.b)}"
    if delta.diff is not None:
        change = f"{delta.diff:+.4g}" if delta.change is None else f"{delta.change:+.0%}"
        if delta.significant is not None and delta.diff and not delta.inside_noise:
            change += ", significant" if delta.significant else ", not significant"
        text += f" ({change})"
    colour = "" if delta.better is None else ("green" if delta.better else "red")
    return text, colour


def runs_compare_table(cmp: RunComparison, width: int | None = 100, wide: bool = False) -> Table:
    """``report A B``: per tier, each headline metric as ``A → B (change)``; without ``wide``
    the metrics a setting is picked on come first and the rest are left out once the table
    would not fit ``width``."""
    metrics = list(cmp.metrics) if wide else _by_use(cmp.metrics)
    cells: list[list[tuple[str, str]]] = []
    for row in cmp.rows:
        side = row.a if row.a is not None else row.b
        line = [
            (f"{row.key:g}", ""),
            (str((row.a or {}).get("verdict") or "not run"), ""),
            (str((row.b or {}).get("verdict") or "not run"), ""),
        ]
        line += [_pair_cell(row.deltas.get(m), side, m) for m in metrics]
        cells.append(line)
    names = [short_name(cmp.key), "verdict A", "verdict B", *(short_name(m) for m in metrics)]
    widths = [max([len(n), *(len(c[i][0]) for c in cells)]) for i, n in enumerate(names)]
    shown = len(names)
    while (
        not wide and width is not None and shown > 4 and sum(widths[:shown]) + 2 * shown - 2 > width
    ):
        shown -= 1
    said = [
        f"significant at {percent(cmp.level)}"
        if any("significant" in text for line in cells for text, _ in line[3:shown])
        else "",
        "more metrics: --wide" if shown < len(names) else "",
    ]
    table = compact(f"A = {cmp.a.run_id}   B = {cmp.b.run_id}")
    table.caption, table.caption_justify = "; ".join(s for s in said if s) or None, "left"
    for name in names[:shown]:
        table.add_column(name, justify="left" if name.startswith("verdict") else "right")
    for line in cells:
        table.add_row(
            *(
                f"[{colour}]{escape(text)}[/]" if colour else escape(text)
                for text, colour in line[:shown]
            )
        )
    return table


CONFIDENCE_METRICS = 4  # headline metrics in the confidence table (the tier table has the rest)


def confidence_table(
    view: RunView, spreads: Spreads, level: float, width: int | None = None, wide: bool = False
) -> Table:
    """``report RUN``: each tier's headline metrics over its rounds (ladder) or repeats (sweep):
    mean [t-interval at ``level``] and CV; a CV over 10 % in yellow. Metrics are left out (last
    first) until it fits ``width`` unless ``wide``."""
    repeated = [
        m
        for m in headline(view)
        if any((s := spreads[k].get(m)) is not None and s.n > 1 for k in spreads)
    ][:CONFIDENCE_METRICS]
    keys = sorted(spreads)

    def texts(name: str) -> list[str]:
        return [spread_text(spreads[k].get(name)) for k in keys]

    def needed(metrics: list[str]) -> int:
        key_w = max([len(short_name(view.key)), *(len(f"{k:g}") for k in keys)])
        return key_w + 3 + sum(2 + max([len(short_name(m)), *map(len, texts(m))]) for m in metrics)

    while not wide and width is not None and len(repeated) > 1 and needed(repeated) > width:
        # tokens/s follows items/s: it goes first, then the last metric
        if "output_tokens_per_s" in repeated:
            repeated.remove("output_tokens_per_s")
        else:
            repeated.pop()
    table = compact(
        f"over the {'rounds' if view.kind == 'ladder' else 'repeats'}: mean "
        f"[{percent(level)} interval] and CV"
    )
    for name in (short_name(view.key), "n", *map(short_name, repeated)):
        table.add_column(name, justify="right")
    for key in keys:
        metrics = spreads[key]
        n = max((s.n for s in metrics.values()), default=0)
        cells = [f"{key:g}", str(n)]
        for name in repeated:
            found = metrics.get(name)
            text = escape(spread_text(found))
            cells.append(f"[yellow]{text}[/]" if found is not None and found.noisy else text)
        table.add_row(*cells)
    return table
