"""tune --rank-by usd_per_1m (or joules_per_token): the table shows what it ranks by — a $/1M
tok and a J/tok column where energy was measured — and tiers.csv never holds a "None"."""

from __future__ import annotations

import csv
import shlex
from pathlib import Path

from tests.report_helpers import table_lines
from tests.tune_helpers import MOCK, tune_config


def _tune(cli, root: Path, power: bool, *extra: str):  # type: ignore[no-untyped-def]
    gauges = " --power-w 100 --power-per-request-w 50" if power else ""
    command = shlex.join(MOCK) + " --port {port} --slots {slots}" + gauges
    tune_config(root, 'grid = ["slots=1,2"]\n', command=command)
    return cli("tune", *extra)


def test_a_tune_ranked_by_cost_shows_the_cost_and_energy_columns(cli, isolated: Path) -> None:
    result = _tune(cli, isolated, True, "--rank-by", "usd_per_1m", "--gpu-price-per-hour", "2.5")
    assert result.code == 0, result.err
    header, *rows = table_lines(result.err)
    assert "$/1M tok" in header and "J/tok" in header, result.err
    column = header.index("$/1M tok") + len("$/1M tok")
    assert all(row[column - 1].isdigit() for row in rows), result.err  # a figure in every row
    csv_path = next((isolated / "runs").glob("*-tune-*/tiers.csv"))
    with csv_path.open(encoding="utf-8") as handle:
        cells = [cell for row in csv.reader(handle) for cell in row]
    assert "None" not in cells
    # the point pin takes, and why: the ranking asked for, with the cost beside the front
    assert "pin takes c0" in result.err
    assert (
        "the fewest $ per 1M output tokens at its best level (--rank-by usd_per_1m)" in result.err
    )
    # the front's table only when more than one point is on it: c01 at concurrency 1 can give
    # each user as much as c02 at 2 (their tokens/s per user are that close on the mock)
    title = "Pareto front: tokens/s per user against tokens/s in all"
    if title in result.err:
        front = result.err.split(title)[1]
        assert "$/1M tok" in front.splitlines()[1] and "J/tok" in front.splitlines()[1], front


def test_without_energy_the_table_has_no_empty_cost_columns(cli, isolated: Path) -> None:
    result = _tune(cli, isolated, False)
    assert result.code == 0, result.err
    header = table_lines(result.err)[0]
    assert "$/1M" not in header and "J/tok" not in header, header


def test_the_report_of_a_tune_says_what_ranked_it(cli, isolated: Path) -> None:
    """A tune ranked by --rank-by usd_per_1m read back as "tune RUN (ranked by goodput)": a
    table in $ order under a title naming another figure."""
    result = _tune(cli, isolated, True, "--rank-by", "usd_per_1m", "--gpu-price-per-hour", "2.5")
    assert result.code == 0, result.err
    run = next((isolated / "runs").glob("*-tune-*"))
    shown = cli("report", run.name, "--html")
    assert shown.code == 0, shown.err
    assert f"tune {run.name} (ranked by usd_per_1m)" in shown.err
    assert "ranked by goodput" not in shown.err
    assert "(ranked by usd_per_1m)" in (run / "report.html").read_text("utf-8")
