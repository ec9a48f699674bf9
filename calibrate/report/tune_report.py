"""A tune as a picture and a page: ``plot.svg`` (goodput per candidate as bars, drawn when the
tune ends), and ``calibrate report <tune run>`` — a finished (or interrupted) tune read back
from its files: the ranked candidates of ``tiers.jsonl``, the winner and its margin, the levels
skipped, the Pareto front of its summary (tokens/s per user against tokens/s in all) and the
point pin takes, and a self-contained HTML page with the goodput bars of ``plot.svg`` and the
front drawn by the one SVG plotter (no matplotlib needed)."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibrate.confidence import percent
from calibrate.errors import InputError
from calibrate.io.bounded import read_bounded
from calibrate.io.jsonl import load_jsonl_objects
from calibrate.io.store import read_object
from calibrate.numbers import finite
from calibrate.report.html.parts import page, table, text
from calibrate.report.html.svg import BarValue, Series, bar_chart, line_chart
from calibrate.report.tables.tune import LEFT, columns_of, front_columns, front_rows

HEADER_BYTES = 4096  # the first line of a tiers.csv, read no further
REQUIRED = ("rank", "id", "flags", "status", "cap", "errors", "incidents")


def plot_svg(table: Sequence[Mapping[str, Any]], title: str) -> str:
    """plot.svg: one bar per candidate, its goodput; a candidate that did not start says so."""
    bars = []
    for r in table:
        goodput = finite(r.get("goodput_per_s")) or 0.0
        note = f"{goodput:.2f}/s at c={r['best_concurrency']}" if goodput else str(r["status"])
        bars.append(BarValue(f"{r['id']} {r['flags']}"[:48], goodput, note))
    return bar_chart(title, bars, standalone=True)


def is_tune_run(path: Path) -> bool:
    """The manifest says ``tune`` (or, without one, its table has tune's first columns)."""
    if read_object(path / "manifest.json").get("stage") == "tune":
        return True
    try:
        with (path / "tiers.csv").open("rb") as handle:
            return handle.readline(HEADER_BYTES).startswith(b"rank,id,flags,status")
    except (OSError, UnicodeDecodeError):
        return False


@dataclass(frozen=True)
class TuneView:
    path: Path
    rows: tuple[dict[str, Any], ...]  # ranked, the cells of ``io.tier_table.TuneRow``
    summary: dict[str, Any]  # the ledger summary (summary.json), {} when the run has none
    passed: bool | None

    @property
    def winner(self) -> dict[str, Any] | None:
        """The first-ranked row, when it served a passing level."""
        top = self.rows[0] if self.rows else None
        return top if top is not None and _num(top.get("goodput_per_s")) else None

    def headline(self) -> str:
        win = self.winner
        if win is None:
            return "tune found no candidate that served a passing level"
        text = (
            f"winner: {win['id']} ({win['flags']}): {_num(win.get('goodput_per_s')):.2f} req/s "
            f"goodput at concurrency {win.get('best_concurrency')}"
        )
        margin = _num(self.summary.get("margin"))
        if margin is not None and len(self.rows) > 1:
            second = self.rows[1]
            text += f", {margin:+.0%} over the runner-up {second['id']} ({second['flags']})"
            level = _num(self.summary.get("confidence"))
            if self.summary.get("significant") is False and level is not None:
                text += f", not significant at {percent(level)} (the intervals overlap)"
        return text

    @property
    def front(self) -> list[dict[str, Any]]:
        """The summary's Pareto points (every candidate that served; ``on_front``, ``pinned``)."""
        points = self.summary.get("pareto")
        if not isinstance(points, list):
            return []
        return [p for p in points if isinstance(p, dict) and "total_tokens_per_s" in p]

    @property
    def pinned_reason(self) -> str:
        reason = self.summary.get("pinned_reason")
        return reason if isinstance(reason, str) else ""

    def notes(self) -> list[str]:
        out: list[str] = []
        skipped = self.summary.get("skipped_levels")
        if isinstance(skipped, list) and skipped:
            levels = ", ".join(str(v) for v in skipped)
            out.append(f"concurrency {levels} not measured: above what the ladder proved in flight")
        untested = self.summary.get("untested")
        if isinstance(untested, list) and untested:
            out.append(f"{len(untested)} candidate(s) left untested (--budget-s spent)")
        if self.passed is None:
            out.append("the run has no verdict: it was interrupted, or is still running")
        return out


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def load_tune(path: Path) -> TuneView:
    """Read one tune run folder; a missing or damaged table is exit 2 naming the file."""
    table = path / "tiers.jsonl"
    if not table.is_file():
        raise InputError(
            f"{table} does not exist: {path} is a tune run with no finished candidate",
            "Run the same calibrate tune command again to continue it.",
        )
    rows = [obj for _, obj in load_jsonl_objects(table, "tune table")]
    for n, row in enumerate(rows, 1):
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            raise InputError(
                f"{table}:{n} is not a tune table row: no {', '.join(missing)}",
                "A table written by calibrate tune is needed; rerun the tune to write it again.",
            )
    line = read_object(path / "summary.json")
    summary = line.get("summary") if isinstance(line.get("summary"), dict) else {}
    passed = line.get("passed") if isinstance(line.get("passed"), bool) else None
    return TuneView(path, tuple(rows), summary or {}, passed)


def front_svg(points: Sequence[Mapping[str, Any]]) -> str:
    """The front joined, the other candidates as dots, a ring on the pinned point."""

    def xy(p: Mapping[str, Any]) -> tuple[float, float]:
        return (
            _num(p.get("total_tokens_per_s")) or 0.0,
            _num(p.get("per_user_tokens_per_s")) or 0.0,
        )

    pinned = next((xy(p) for p in points if p.get("pinned")), None)
    on = tuple(xy(p) for p in points if p.get("on_front"))
    off = tuple(xy(p) for p in points if not p.get("on_front"))
    series = [Series("Pareto front", on, chosen=pinned if pinned in on else None)]
    if off:
        series.append(
            Series("other candidates", off, chosen=pinned if pinned in off else None, joined=False)
        )
    return line_chart(
        "Pareto front (ring: the point pin takes)",
        "tokens/s in all (goodput)",
        "tokens/s per user",
        series,
    )


def _front_html(view: TuneView) -> list[str]:
    points = view.front
    rows = front_rows(points)
    if not rows:
        return []
    columns = front_columns(rows)
    cells = [[cell(r) for _, cell in columns] for r in rows]
    reason = f'<p id="pinned">{text(view.pinned_reason)}</p>' if view.pinned_reason else ""
    return [
        '<h2 id="pareto-front">Pareto front</h2>',
        reason,
        f'<div class="chart">{front_svg(points)}</div>',
        table("pareto", [name for name, _ in columns], cells, text_columns=("id", "flags", "")),
    ]


def tune_html(view: TuneView) -> str:
    """One self-contained page: the verdict first, the goodput bars, then the table."""
    title = f"tune {view.path.name}"
    plot = ""
    svg = view.path / "plot.svg"
    if svg.is_file():  # as an image: nothing in the file can run in the page
        data = base64.b64encode(read_bounded(svg)).decode("ascii")
        plot = f'<p><img alt="goodput per candidate" src="data:image/svg+xml;base64,{data}"></p>'

    notes = "".join(f"<li>{text(n)}</li>" for n in view.notes())
    columns = columns_of(view.rows)
    cells = [[cell(r) for _, cell in columns] for r in view.rows]  # the terminal's cells
    return page(
        title,
        [
            f"<h1>{text(title)}</h1>",
            f'<p class="verdict" id="verdict-word"><strong>{text(view.headline())}</strong></p>',
            f'<ul id="notes">{notes}</ul>' if notes else "",
            plot,
            *_front_html(view),
            table("candidates", [name for name, _ in columns], cells, text_columns=LEFT),
        ],
    )
