"""Re-render a run from its files, no server needed: its table, plot, HTML report or a comparison.

A ladder or sweep run's tier table and plot.png, a self-contained HTML report (--html), a
per-request timeline of one tier (--timeline), or two runs side by side with deltas per tier
(report RUN_A RUN_B).

example: calibrate report runs/20261129T164129Z-ladder-a1b2c3 --html --timeline 4
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from calibrate.cli.common import Output, add_command, add_wide, load_config, output_for
from calibrate.cli.views.tune import show_ranked
from calibrate.errors import InputError, UsageError
from calibrate.io import tier_table
from calibrate.io.output_paths import check_outputs, stage_files
from calibrate.io.store import write_atomic
from calibrate.report import tables as report
from calibrate.report import tune_report
from calibrate.report.compare import (
    compare_runs,
    confidence_json,
    noisy_lines,
    run_spreads,
)
from calibrate.report.html.compare import comparison_html
from calibrate.report.html.page import key_label, run_html
from calibrate.report.run_view import RunView, load_run, stage_notes
from calibrate.report.timeline import Timeline, read_timeline


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "report", __doc__ or "", run, target=False)
    parser.add_argument("run_dir", metavar="RUN", help="a run folder (runs/<run_id>) or its id")
    parser.add_argument(
        "run_b", metavar="RUN_B", nargs="?", help="a second run of the same kind: compare A → B"
    )
    parser.add_argument("--no-plot", action="store_true", help="do not write PNG plots again")
    parser.add_argument(
        "--html",
        metavar="PATH",
        nargs="?",
        const="",
        help="write one self-contained HTML report (default RUN/report.html)",
    )
    parser.add_argument(
        "--timeline",
        metavar="TIER",
        type=float,
        help="per-request timeline of one tier: its batch size (ladder) or concurrency (sweep)",
    )
    add_wide(parser)


def _resolve(name: str, runs_dir: Path) -> Path:
    path = Path(name)
    if not path.is_dir() and (runs_dir / name).is_dir():
        return runs_dir / name
    return path


def _load(path: Path) -> RunView:
    if not (path / "tiers.csv").exists():
        return load_run(path, "ladder")  # raises the "not a finished run" error
    kind = report.run_kind(path)
    view = load_run(path, kind)
    tier_table.check_rows(list(view.rows), kind, path / "tiers.csv")
    return view


def _write(path: Path, text: str) -> Path:
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise InputError(
            f"cannot write {path}: {exc.strerror or exc}", "Give a writable path: --html PATH"
        ) from exc
    return path


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    cfg = load_config(args)
    runs_dir = cfg.runs_dir
    first = _resolve(args.run_dir, runs_dir)
    if args.html:  # before anything is written: never over what report reads
        runs = [first, *([_resolve(args.run_b, runs_dir)] if args.run_b else [])]
        reads = [r for run in runs for r in report.run_inputs(run)]
        check_outputs(
            [("--html", Path(args.html))],
            [*reads, *stage_files(cfg.runs_dir, cfg.baselines_dir, cfg.source)],
        )
    if tune_report.is_tune_run(first):
        return _tune(out, first, args)
    view = _load(first)
    if args.run_b is not None:
        if args.timeline is not None:
            raise UsageError("--timeline draws one run: give one RUN with it")
        b = _load(_resolve(args.run_b, runs_dir))
        return _compare(out, view, b, args.html, cfg.confidence.level)
    return _one(out, view, args, cfg.confidence.level)


def _one(out: Output, view: RunView, args: argparse.Namespace, level: float) -> int:
    rows, kind, path = list(view.rows), view.kind, view.path
    try:
        table = report.tier_table(
            rows, kind, f"{kind} {path.name}", out.console.width, wide=out.wide
        )
    except (ValueError, TypeError) as exc:  # a cell that is not a number where one belongs
        raise InputError(
            f"{path / 'tiers.csv'} has a value report cannot read ({exc})",
            "Rerun the stage to write the table again.",
        ) from exc
    (out.render_wide if out.wide else out.render)(table)
    spreads = run_spreads(view, level)
    if any(s.n > 1 for metrics in spreads.values() for s in metrics.values()):
        spread = report.confidence_table(view, spreads, level, out.console.width, out.wide)
        (out.render_wide if out.wide else out.render)(spread)
    noisy = noisy_lines(view, spreads)
    for line in noisy:
        out.warn(line)
    notes = stage_notes(view.summary)
    for note in notes:
        out.warn(note)
    if rows and rows[0].get("vram_source") == "none":
        out.say("VRAM not measured")
    plot = None if args.no_plot else report.write_plot(rows, kind, path / "plot.png")
    if plot:
        out.say(f"plot: {plot}")
    elif not args.no_plot:
        out.say("no plot: matplotlib is not installed (pip install 'calibrate[plot]')")
    timeline: Timeline | None = None
    result: dict[str, Any] = {
        "run": str(path),
        "kind": kind,
        "rows": rows,
        "plot": str(plot) if plot else None,
        "notes": notes,
        "confidence": confidence_json(view, spreads, level),
        "noisy": noisy,
    }
    if args.timeline is not None:
        timeline, result["timeline"] = _timeline(out, view, args.timeline, args.no_plot)
    if args.html is not None:
        html = _write(
            Path(args.html) if args.html else path / "report.html", run_html(view, timeline)
        )
        out.say(f"HTML report: {html}")
        result["html"] = str(html)
    elif timeline is not None and not result["timeline"]["png"]:
        out.say("the timeline is drawn into the HTML report: add --html")
    out.result(result)
    return 0


def _timeline(
    out: Output, view: RunView, tier: float, no_plot: bool
) -> tuple[Timeline, dict[str, Any]]:
    """One tier's requests: drawn into the HTML report, and timeline-<tier>.png with matplotlib."""
    label = f"{key_label(view.key)} {tier:g}"
    timeline = read_timeline(view.path, view.key, tier, wave=view.kind == "ladder", label=label)
    png = None
    if not no_plot:
        title = f"{view.path.name}: {label}"
        png = report.write_timeline_png(timeline.bars, title, view.path / f"timeline-{tier:g}.png")
    out.say(f"timeline of {label}: {len(timeline.bars)} requests; times: {timeline.note}")
    if png:
        out.say(f"timeline plot: {png}")
    summary = {
        "tier": tier,
        "requests": len(timeline.bars),
        "times": timeline.source,
        "png": str(png) if png else None,
    }
    return timeline, summary


def _compare(out: Output, a: RunView, b: RunView, html: str | None, level: float) -> int:
    cmp = compare_runs(a, b, level)
    if cmp.warning:
        out.warn(cmp.warning)
    table = report.runs_compare_table(cmp, out.console.width, out.wide)
    (out.render_wide if out.wide else out.render)(table)
    for line in cmp.noisy:
        out.warn(line)
    result = cmp.to_json()
    if html is not None:
        path = _write(
            Path(html) if html else b.path / f"compare-{a.path.name}.html", comparison_html(cmp)
        )
        out.say(f"HTML comparison: {path}")
        result["html"] = str(path)
    out.result(result)
    return 0


def _tune(out: Output, path: Path, args: argparse.Namespace) -> int:
    """A tune run: its ranked candidates, the winner and margin, --html; no second run."""
    if args.run_b is not None or args.timeline is not None:
        flag = "RUN_B" if args.run_b is not None else "--timeline"
        raise UsageError(
            f"{flag} is for ladder and sweep runs; {path.name} is a tune run",
            f"Show it alone: calibrate report {args.run_dir} [--html]",
        )
    view = tune_report.load_tune(path)
    show_ranked(out, list(view.rows), f"tune {path.name} (ranked by goodput)")
    for note in view.notes():
        out.warn(note)
    if view.winner is not None:
        out.ok(view.headline())
    else:
        out.fail(view.headline())
    plot = path / "plot.svg"
    if plot.is_file():
        out.say(f"plot: {plot}")
    result: dict[str, Any] = {
        "run": str(path),
        "kind": "tune",
        "rows": list(view.rows),
        "winner": view.winner["id"] if view.winner else None,
        "notes": view.notes(),
    }
    if args.html is not None:
        html = _write(
            Path(args.html) if args.html else path / "report.html", tune_report.tune_html(view)
        )
        out.say(f"HTML report: {html}")
        result["html"] = str(html)
    out.result(result)
    return 0
