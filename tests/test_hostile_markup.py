"""Text calibrate did not write itself is shown as text, never read as rich markup.

rich reads ``[red]`` and ``[/]`` in a table's cells and title as markup, and a closing tag it
cannot match (``[/x]``) raises MarkupError. A tiers.csv cell, a run folder's name, a baseline's
path or a ``--grid`` value reaching a table could therefore restyle the report or end it in a
traceback. Every table here goes through the one renderer (``report.tables.grid``), which takes
its cells and titles as plain text.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from calibrate.report.tables.compare import compare_table
from calibrate.report.tables.grid import grid
from calibrate.stages.measure.compare_tiers import compare_tables
from tests.report_helpers import ladder_row, sweep_row, write_run

ODD = "[/x] [bold]loud[/bold] [link=http://evil]"


def _printed(table: object) -> str:
    console = Console(width=400, record=True, color_system=None)
    console.print(table)
    return console.export_text()


def test_the_one_renderer_prints_markup_in_cells_and_titles_as_it_is() -> None:
    rows = [{"name": ODD, "n": 1}]
    columns = [("name", lambda r: str(r["name"])), ("n", lambda r: str(r["n"]))]
    text = _printed(grid(columns, rows, ODD, left={"name"}, style=lambda n, r: None))
    assert text.count(ODD) == 2  # the title and the cell, every bracket kept


@pytest.mark.parametrize("kind", ["ladder", "sweep"])
def test_a_run_whose_cells_and_name_hold_markup_is_reported_as_written(
    cli, isolated: Path, kind: str
) -> None:
    row = ladder_row if kind == "ladder" else sweep_row
    rows = [row(1, 10.0), row(2, 12.0, verdict=f"pass {ODD}", error_kinds=ODD)]
    first = write_run(isolated, f"run-{kind}", kind, rows)  # type: ignore[arg-type]
    odd = write_run(isolated, f"{kind}-{ODD.replace('/', '_')}", kind, rows)  # type: ignore[arg-type]
    for args in ([str(first)], [str(first), str(odd)], [str(odd), "--wide"]):
        result = cli("report", *args)
        assert result.code == 0, (args, result.err)
        assert "Traceback" not in result.err
        assert "[/x]" in result.err, (args, result.err)


def test_a_baseline_whose_path_and_verdicts_hold_markup_is_compared_as_written() -> None:
    """``--compare``'s table: the baseline's own path and cells, the offending one marked."""
    base = [
        {"batch_size": "1", "verdict": "pass", "per_item_s": "0.1"},
        {"batch_size": "2", "verdict": f"pass {ODD}", "per_item_s": "0.1"},
    ]
    now = [
        {"batch_size": "1", "verdict": "pass", "per_item_s": "0.1"},
        {"batch_size": "2", "verdict": f"fail {ODD}", "per_item_s": "0.3"},
    ]
    cmp = compare_tables("ladder", base, now, baseline_path=f"baselines/{ODD}.csv")
    text = _printed(compare_table(cmp))
    assert f"baselines/{ODD}.csv" in text
    assert f"pass {ODD}" in text and f"fail {ODD}" in text
    assert "0.3 ✗" in text  # the marked cell keeps its mark
