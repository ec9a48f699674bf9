"""Re-render a ladder or sweep run's tier table and plot.png from its files (no server needed).

example: calibrate report runs/20261129T164129Z-ladder-a1b2c3
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from calibrate import report, tier_table
from calibrate.cli.common import add_command, load_config, output_for
from calibrate.errors import InputError


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "report", __doc__ or "", run, target=False)
    parser.add_argument("run_dir", metavar="RUN", help="a run folder (runs/<run_id>) or its id")
    parser.add_argument("--no-plot", action="store_true", help="do not write plot.png again")


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    path = Path(args.run_dir)
    runs_dir = load_config(args).runs_dir
    if not path.is_dir() and (runs_dir / args.run_dir).is_dir():
        path = runs_dir / args.run_dir
    csv_path = path / "tiers.csv"
    if not csv_path.exists():
        raise InputError(f"{csv_path} does not exist: {path} is not a finished ladder or sweep run",
                         f"List the runs with: ls {runs_dir}/   (report reads <run>/tiers.csv)")  # fmt: skip
    kind = report.run_kind(path)
    rows = tier_table.read_rows(csv_path)
    tier_table.check_rows(rows, kind, csv_path)
    try:
        table = report.tier_table(rows, kind, f"{kind} {path.name}", out.console.width)
    except (ValueError, TypeError) as exc:  # a cell that is not a number where one belongs
        raise InputError(f"{csv_path} has a value report cannot read ({exc})",
                         "Rerun the stage to write the table again.") from exc  # fmt: skip
    out.render(table)
    if rows and rows[0].get("vram_source") == "none":
        out.say("VRAM not measured")
    plot = None if args.no_plot else report.write_plot(rows, kind, path / "plot.png")
    if plot:
        out.say(f"plot: {plot}")
    elif not args.no_plot:
        out.say("no plot: matplotlib is not installed (pip install 'calibrate[plot]')")
    out.result({"run": str(path), "kind": kind, "rows": rows, "plot": str(plot) if plot else None})
    return 0
