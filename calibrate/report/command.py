"""``calibrate report``: which report a run asks for, written (plot, timeline, HTML) and shown.

A tune run shows its ranked candidates; a ladder or sweep run its tier table, spreads and
notes (with ``--timeline``, one tier's requests); two runs are compared tier by tier. What is
shown goes through a ``Channel`` (the command's output); what is returned is the --json.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from calibrate.config import Config
from calibrate.errors import UsageError, unwritten
from calibrate.io.atomic import write_atomic
from calibrate.io.output_paths import check_outputs, check_writable, stage_files
from calibrate.report import tune_report
from calibrate.report.compare import compare_runs
from calibrate.report.html.charts import key_label
from calibrate.report.html.compare import comparison_html
from calibrate.report.html.page import run_html
from calibrate.report.plot import write_plot, write_timeline_png
from calibrate.report.replay import all_lines, prefix_cache_seen, replay_fit
from calibrate.report.run_view import (
    RunView,
    load_run,
    run_caveats,
    run_inputs,
    run_kind,
    run_object,
    stage_notes,
)
from calibrate.report.spreads import confidence_json, noisy_lines, run_spreads
from calibrate.report.tables.compare import runs_compare_table
from calibrate.report.tables.tiers import confidence_table, tier_table
from calibrate.report.tables.tune import front_rows, front_table, ranked_table
from calibrate.report.timeline import Timeline, read_timeline


class Channel(Protocol):
    """Where a report is shown: the command's output (rich on a TTY, plain lines otherwise)."""

    wide: bool

    def say(self, text: str, style: str | None = None) -> None: ...
    def warn(self, text: str) -> None: ...
    def ok(self, text: str) -> None: ...
    def fail(self, text: str) -> None: ...
    def render(self, renderable: Any) -> None: ...
    def render_wide(self, table: Any) -> None: ...
    def show_table(self, table_at: Callable[[int | None], Any], *, live: bool = True) -> None: ...


@dataclass(frozen=True)
class ReportRequest:
    """What ``report`` was asked: one run (or two), --html, --timeline, --no-plot."""

    run_dir: str
    run_b: str | None = None
    html: str | None = None  # "": the default path
    timeline: float | None = None
    no_plot: bool = False
    cache_dir: str = ""  # the cache calibrate names (matplotlib's), from the config


def _resolve(name: str, runs_dir: Path) -> Path:
    """A run folder, or a run id under runs/."""
    path = Path(name)
    if not path.is_dir() and (runs_dir / name).is_dir():
        return runs_dir / name
    return path


# the stages whose runs have no tier table to report: their verdict is their summary
NO_TABLE = ("single", "repro", "batch", "verify", "rollback", "pin")


def _load(path: Path) -> RunView:
    """A finished ladder or sweep run, its tier table checked."""
    if not (path / "tiers.csv").exists():
        _no_table(path)
        return load_run(path, "ladder")  # raises the "not a finished run" error
    return load_run(path, run_kind(path))


def _no_table(path: Path) -> None:
    """Exit 2 naming a run of a stage with no tier table (a batch, a verify, a rollback…) as
    what it is: "not a finished ladder or sweep run" read as though the run had not finished."""
    stage = run_object(path / "manifest.json").get("stage") if path.is_dir() else None
    if stage not in NO_TABLE:
        return
    summary = path / "summary.json"
    where = summary if summary.is_file() else path.parent / "ledger.jsonl"
    raise UsageError(
        f"{path} is a {stage} run: report reads ladder, sweep and tune runs (their tier tables)",
        f"Its result is in {where}; calibrate status shows the latest {stage} for this target",
    )


def _write(path: Path, text: str) -> Path:
    """An HTML report, atomically; one that cannot be written is ``unwritten`` (a full disk
    exit 1, a path that cannot be written exit 2), naming it, nothing of it left."""
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise unwritten(exc, "nothing of it was kept") from exc
    return path


def run_report(req: ReportRequest, cfg: Config, out: Channel, width: int) -> dict[str, Any]:
    """Which report the request asks for (a tune run's, one run's, two runs compared), written
    and shown; returns its --json."""
    runs_dir = cfg.runs_dir
    first = _resolve(req.run_dir, runs_dir)
    if req.html:  # before anything is shown or written: never over what report reads
        runs = [first, *([_resolve(req.run_b, runs_dir)] if req.run_b else [])]
        reads = [r for run in runs for r in run_inputs(run)]
        check_outputs(
            [("--html", Path(req.html))],
            [*reads, *stage_files(cfg.runs_dir, cfg.baselines_dir, cfg.source)],
        )
        check_writable(Path(req.html), "--html", "report.html")
    if tune_report.is_tune_run(first):
        return _tune(out, first, req)
    view = _load(first)
    if req.run_b is not None:
        if req.timeline is not None:
            raise UsageError("--timeline draws one run: give one RUN with it")
        b = _load(_resolve(req.run_b, runs_dir))
        return _compare(out, view, b, req.html, cfg.confidence.level, width)
    return _one(out, view, req, cfg.confidence.level, width)


def _table(out: Channel, table: Any) -> None:
    """A table at the width it needs with --wide, else fitted to the screen."""
    (out.render_wide if out.wide else out.render)(table)


def _one(
    out: Channel, view: RunView, req: ReportRequest, level: float, width: int
) -> dict[str, Any]:
    """One ladder or sweep run: its table, spreads, notes, plot, --timeline and --html."""
    rows, kind, path = view.rows, view.kind, view.path
    # a tier the run does not have is exit 2 before anything is shown or written
    timeline = _read_timeline(view, req.timeline) if req.timeline is not None else None
    _table(out, tier_table(rows, kind, f"{kind} {path.name}", width, wide=out.wide))
    spreads = run_spreads(view, level)
    if any(s.n > 1 for metrics in spreads.values() for s in metrics.values()):
        spread = confidence_table(view, spreads, level, width, out.wide)
        _table(out, spread)
    noisy = noisy_lines(view, spreads)
    for line in noisy:
        out.warn(line)
    notes = run_caveats(view) + stage_notes(view.summary)
    for note in notes:
        out.warn(note)
    if (seen := prefix_cache_seen(view.summary)) is not None:
        out.say(f"workload: {seen.describe()}")
    fit = replay_fit(view.summary, path)
    for line in all_lines(fit) if fit is not None else ():
        out.say(line)
    if rows and rows[0].vram_source == "none":
        out.say("VRAM not measured")
    try:
        plot = None if req.no_plot else write_plot(rows, kind, path / "plot.png", req.cache_dir)
    except OSError as exc:  # the table is shown; a full disk leaves no empty PNG behind
        raise unwritten(exc, "nothing of it was kept (the table above is the report)") from exc
    if plot:
        out.say(f"plot: {plot}")
    elif not req.no_plot:
        out.say("no plot: matplotlib is not installed (pip install 'calibrate[plot]')")
    result: dict[str, Any] = {
        "run": str(path),
        "kind": kind,
        "rows": view.rows_json(),
        "plot": str(plot) if plot else None,
        "notes": notes,
        "confidence": confidence_json(view, spreads, level),
        "noisy": noisy,
        "replay": fit.to_json() if fit is not None else None,
    }
    if timeline is not None and req.timeline is not None:
        result["timeline"] = _draw_timeline(out, view, timeline, req)
    if req.html is not None:
        html = _write(
            Path(req.html) if req.html else path / "report.html", run_html(view, timeline)
        )
        out.say(f"HTML report: {html}")
        result["html"] = str(html)
    elif timeline is not None and not result["timeline"]["png"]:
        out.say("the timeline is drawn into the HTML report: add --html")
    return result


def _read_timeline(view: RunView, tier: float) -> Timeline:
    """One tier's requests (exit 2 naming the tiers there are when the run has not this one)."""
    label = f"{key_label(view.key)} {tier:g}"
    return read_timeline(view.path, view.key, tier, wave=view.kind == "ladder", label=label)


def _draw_timeline(
    out: Channel, view: RunView, timeline: Timeline, req: ReportRequest
) -> dict[str, Any]:
    """The timeline drawn into the HTML report, and timeline-<tier>.png with matplotlib."""
    label = timeline.label
    png = None
    tier = req.timeline
    assert tier is not None
    if not req.no_plot:
        title = f"{view.path.name}: {label}"
        try:
            png = write_timeline_png(
                timeline.bars, title, view.path / f"timeline-{tier:g}.png", req.cache_dir
            )
        except OSError as exc:
            raise unwritten(exc, "nothing of it was kept") from exc
    out.say(f"timeline of {label}: {len(timeline.bars)} requests; times: {timeline.note}")
    if png:
        out.say(f"timeline plot: {png}")
    summary = {
        "tier": tier,
        "requests": len(timeline.bars),
        "times": timeline.source,
        "png": str(png) if png else None,
    }
    return summary


def _compare(
    out: Channel, a: RunView, b: RunView, html: str | None, level: float, width: int
) -> dict[str, Any]:
    """Two runs of the same kind, tier by tier (A → B), and --html."""
    cmp = compare_runs(a, b, level)
    if cmp.warning:
        out.warn(cmp.warning)
    table = runs_compare_table(cmp, width, out.wide)
    _table(out, table)
    for line in cmp.noisy:
        out.warn(line)
    result = cmp.to_json()
    if html is not None:
        path = _write(
            Path(html) if html else b.path / f"compare-{a.path.name}.html", comparison_html(cmp)
        )
        out.say(f"HTML comparison: {path}")
        result["html"] = str(path)
    return result


def _tune(out: Channel, path: Path, req: ReportRequest) -> dict[str, Any]:
    """A tune run: its ranked candidates, the winner and margin, --html; no second run."""
    if req.run_b is not None or req.timeline is not None:
        flag = "RUN_B" if req.run_b is not None else "--timeline"
        raise UsageError(
            f"{flag} is for ladder and sweep runs; {path.name} is a tune run",
            f"Show it alone: calibrate report {req.run_dir} [--html]",
        )
    view = tune_report.load_tune(path)
    title = f"tune {path.name} (ranked by {view.rank_by})"
    out.show_table(lambda width: ranked_table(view.rows, title, width), live=False)
    if windows := view.window_note():
        out.say(windows)
    for note in view.notes():
        out.warn(note)
    if view.winner is not None:
        out.ok(view.headline())
    else:
        out.fail(view.headline())
    if front_rows(view.front):
        front = "Pareto front: tokens/s per user against tokens/s in all"
        out.show_table(lambda width: front_table(view.front, front, width), live=False)
    if view.pinned_reason:
        out.say(view.pinned_reason)
    plot = path / "plot.svg"
    if plot.is_file():
        out.say(f"plot: {plot}")
    result: dict[str, Any] = {
        "run": str(path),
        "kind": "tune",
        "rows": [r.to_json() for r in view.rows],
        "winner": view.winner.id if view.winner else None,
        "inconclusive": view.inconclusive or None,
        "notes": view.notes(),
        "windows": view.window_note(),
        "pareto": [p.to_json() for p in view.front],
        "pinned_reason": view.pinned_reason or None,
    }
    if req.html is not None:
        html = _write(
            Path(req.html) if req.html else path / "report.html", tune_report.tune_html(view)
        )
        out.say(f"HTML report: {html}")
        result["html"] = str(html)
    return result
