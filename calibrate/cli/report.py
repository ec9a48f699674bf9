"""Re-render a run from its files, no server needed: its table, plot, HTML report or a comparison.

A ladder or sweep run's tier table and plot.png, a self-contained HTML report (--html), a
per-request timeline of one tier (--timeline), or two runs side by side with deltas per tier
(report RUN_A RUN_B).

example: calibrate report runs/20261129T164129Z-ladder-a1b2c3 --html --timeline 4
"""

from __future__ import annotations

import argparse
from typing import Any

from calibrate.cli.flags import add_command, add_wide
from calibrate.cli.flags.resolve import load_config
from calibrate.cli.output import output_for
from calibrate.report.command import ReportRequest, run_report


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


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    cfg = load_config(args)
    req = ReportRequest(
        args.run_dir, args.run_b, args.html, args.timeline, args.no_plot, cfg.cache_dir
    )
    width = out.console.width
    out.result(run_report(req, cfg, out, width))
    return 0
