"""A tune as a picture and a page: ``plot.svg`` (goodput per candidate as bars, drawn when the
tune ends), and ``calibrate report <tune run>`` — a finished (or interrupted) tune read back
from its files: the ranked candidates of ``tiers.jsonl``, the winner and its margin, the levels
skipped, the Pareto front of its summary (tokens/s per user against tokens/s in all) and the
point pin takes, and a self-contained HTML page with the goodput bars of ``plot.svg`` and the
front drawn by the one SVG plotter (no matplotlib needed)."""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibrate.confidence import percent
from calibrate.errors import InputError
from calibrate.gpu.energy import RANK_BY
from calibrate.io.bounded import read_bounded
from calibrate.io.jsonl import load_jsonl_objects
from calibrate.io.store import read_object
from calibrate.io.tier_table.cell_values import CellError
from calibrate.io.tier_table.tune import NotARow, Point, TuneRow
from calibrate.io.tier_table.windows import across, note
from calibrate.numbers import finite
from calibrate.report.html.parts import page, table, text
from calibrate.report.html.svg import BarValue, Series, bar_chart, line_chart
from calibrate.report.tables.tune import LEFT, columns_of, front_columns, front_rows

HEADER_BYTES = 4096  # the first line of a tiers.csv, read no further


def plot_svg(table: Sequence[TuneRow], title: str) -> str:
    """plot.svg: one bar per candidate, its goodput; a candidate that did not start says so."""
    bars = []
    for r in table:
        goodput = finite(r.goodput_per_s) or 0.0
        note = f"{goodput:.2f}/s at c={r.best_concurrency}" if goodput else r.status
        bars.append(BarValue(f"{r.id} {r.flags}"[:48], goodput, note))
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
    rows: tuple[TuneRow, ...]  # ranked
    summary: dict[str, Any]  # the ledger summary (summary.json), {} when the run has none
    passed: bool | None

    def _row(self, wanted: str | None) -> TuneRow | None:
        return next((r for r in self.rows if wanted is not None and r.id == wanted), None)

    @property
    def winner(self) -> TuneRow | None:
        """The winner the tune recorded (the point pin takes), never merely the first row: a
        run its noise left inconclusive named none, and ``--conservative`` may have taken the
        second-ranked; None when the run recorded no winner (or has no verdict)."""
        won = self.summary.get("winner")
        if not isinstance(won, dict):
            return None
        pinned = next((p.id for p in self.front if p.pinned), None)
        flags = won.get("flags")
        said = {f"{k}={v}" for k, v in flags.items()} if isinstance(flags, dict) else None
        row = self._row(pinned) or next(
            (r for r in self.rows if said is not None and set(r.flags.split(", ")) == said), None
        )
        if row is None and pinned is None and said is None and self.rows:
            row = self.rows[0]  # a summary that named a winner by its cap and level alone
        return row if row is not None and row.goodput_per_s else None

    @property
    def runner_up(self) -> TuneRow | None:
        """The candidate the winner's margin is over, as the tune recorded it."""
        win, named = self.winner, self.summary.get("runner_up")
        if win is None:
            return None
        second = self._row(named.get("id")) if isinstance(named, dict) else None
        return second or next((r for r in self.rows if r.id != win.id), None)

    @property
    def inconclusive(self) -> str:
        """Why the run named no winner when its noise left the first two in doubt ("" else)."""
        said = self.summary.get("inconclusive")
        return said if isinstance(said, str) else ""

    def headline(self) -> str:
        win = self.winner
        if win is None or win.goodput_per_s is None:
            if self.inconclusive:
                return f"tune {self.inconclusive}"
            if "winner" not in self.summary:
                return "tune recorded no winner: the run has no verdict"
            return "tune found no candidate that served a passing level"
        text = (
            f"winner: {win.id} ({win.flags}): {win.goodput_per_s:.2f} req/s "
            f"goodput at concurrency {win.best_concurrency}"
        )
        margin = _num(self.summary.get("margin"))
        second = self.runner_up
        if margin is not None and second is not None:
            text += f", {margin:+.0%} over the runner-up {second.id} ({second.flags})"
            level = _num(self.summary.get("confidence"))
            if self.summary.get("significant") is False and level is not None:
                text += f", not significant at {percent(level)} (the intervals overlap)"
            elif (unchecked := self.summary.get("unchecked")) and isinstance(unchecked, str):
                text += f" (not measured again in the other order: {unchecked}, so not a claim)"
            elif self.summary.get("significant") is None:  # as the tune's line: not a claim
                text += " (no interval: fewer than two runs on a side, so not tested)"
            text += across(win.window, second.window)
        return text

    def window_note(self) -> str | None:
        """Under the table, where its rows were measured over more than one window."""
        return note([(r.id, r.window) for r in self.rows])

    @property
    def front(self) -> list[Point]:
        """The summary's Pareto points (every candidate that served; ``on_front``, ``pinned``)."""
        points = self.summary.get("pareto")
        if not isinstance(points, list):
            return []
        return [p for data in points if (p := Point.from_json(data)) is not None]

    @property
    def rank_by(self) -> str:
        """What ordered the table: the summary's ``rank_by`` (or, from a run that kept only its
        pin line, the ``--rank-by`` that line names); goodput for a run from before either."""
        said = self.summary.get("rank_by")
        if isinstance(said, str) and said in RANK_BY:
            return said
        named = re.search(r"\(--rank-by (\w+)\)", self.pinned_reason)
        return named.group(1) if named and named.group(1) in RANK_BY else "goodput"

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
            spent = self.summary.get("spent_by")  # --restarts or --budget-s, as the tune said
            spent = spent if spent in ("--restarts", "--budget-s") else "--budget-s"
            out.append(f"{len(untested)} candidate(s) left untested ({spent} spent)")
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
    rows = []
    for n, obj in enumerate((obj for _, obj in load_jsonl_objects(table, "tune table")), 1):
        try:
            rows.append(TuneRow.from_json(obj))
        except (NotARow, CellError) as exc:
            raise InputError(
                f"{table}:{n} is not a tune table row: {exc}",
                "A table written by calibrate tune is needed; rerun the tune to write it again.",
            ) from exc
    line = read_object(path / "summary.json")
    summary = line.get("summary") if isinstance(line.get("summary"), dict) else {}
    passed = line.get("passed") if isinstance(line.get("passed"), bool) else None
    return TuneView(path, tuple(rows), summary or {}, passed)


def front_svg(points: Sequence[Point]) -> str:
    """The front joined, the other candidates as dots, a ring on the pinned point."""

    def xy(p: Point) -> tuple[float, float]:
        return (p.total_tokens_per_s, p.per_user_tokens_per_s)

    pinned = next((xy(p) for p in points if p.pinned), None)
    on = tuple(xy(p) for p in points if p.on_front)
    off = tuple(xy(p) for p in points if not p.on_front)
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
    title = f"tune {view.path.name} (ranked by {view.rank_by})"
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
            f'<p id="windows">{text(said)}</p>' if (said := view.window_note()) else "",
        ],
    )
