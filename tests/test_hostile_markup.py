"""Text calibrate did not write itself is shown as text: never read as rich markup, never
obeyed as a terminal's control sequence, never what makes a --junit file unreadable.

rich reads ``[red]`` and ``[/]`` in a table's cells and title as markup, and a closing tag it
cannot match (``[/x]``) raises MarkupError. A tiers.csv cell, a run folder's name, a baseline's
path or a ``--grid`` value reaching a table could therefore restyle the report or end it in a
traceback. Every table here goes through the one renderer (``report.tables.grid``), which takes
its cells and titles as plain text; every human line goes through ``redact.printable``, and a
server's error message is made one line where it is read.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console

from calibrate.io.tier_table.cells import row_from_cells
from calibrate.report.tables.compare import compare_table
from calibrate.report.tables.grid import grid
from calibrate.stages.measure.tier_stage.compare_tiers import compare_tables
from tests.canned_server import CannedServer
from tests.helpers import CHAT_REPLY, write_config
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
    rows = [row(1, 10.0), row(2, 12.0, verdict=f"pass {ODD}", error_kinds={"[/x]": 2})]
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
        row_from_cells({"batch_size": 1, "verdict": "pass", "per_item_s": 0.1}),
        row_from_cells({"batch_size": 2, "verdict": f"pass {ODD}", "per_item_s": 0.1}),
    ]
    now = [
        row_from_cells({"batch_size": 1, "verdict": "pass", "per_item_s": 0.1}),
        row_from_cells({"batch_size": 2, "verdict": f"fail {ODD}", "per_item_s": 0.3}),
    ]
    cmp = compare_tables("ladder", base, now, baseline_path=f"baselines/{ODD}.csv")
    text = _printed(compare_table(cmp))
    assert f"baselines/{ODD}.csv" in text
    assert f"pass {ODD}" in text and f"fail {ODD}" in text
    assert "0.3 ✗" in text  # the marked cell keeps its mark


FORGED = "\x1b[1A\x1b[2K\x1b]0;pwned\x07\u202e\rboom\nsingle passed: the call answered"


def test_a_servers_error_message_cannot_move_the_cursor_or_write_a_line(
    cli, isolated: Path
) -> None:
    """A 500 whose message erases the line above, sets the title and starts a line of its own:
    shown escaped on the one line calibrate wrote, never obeyed."""
    body = json.dumps({"error": {"message": FORGED, "type": "x"}}).encode()
    models = (200, {}, b'{"data": [{"id": "internlm-s2"}]}')
    replies = {"/v1/models": models, "/v1/chat/completions": (500, {}, body)}
    with CannedServer(replies) as server:  # type: ignore[arg-type]
        write_config(isolated / "calibrate.toml", server.base_url)
        result = cli("single")
    assert result.code == 1, result.err
    assert not set(result.err) & {"\x1b", "\x07", "\r", "\u202e"}, repr(result.err)
    assert "\\x1b[1A\\x1b[2K" in result.err  # what the server sent, visible
    assert not any(line.startswith("single passed") for line in result.err.splitlines())


def test_every_table_cell_shows_control_characters_escaped() -> None:
    rows = [{"name": FORGED}]
    text = _printed(
        grid(
            [("name", lambda r: str(r["name"]))],
            rows,
            FORGED,
            left={"name"},
            style=lambda n, r: None,
        )
    )
    assert "\x1b" not in text and "\\x1b[1A" in text


@pytest.mark.parametrize("where", ["answer", "models"])
def test_a_model_name_with_a_line_break_stays_on_calibrates_line(
    cli, isolated: Path, where: str
) -> None:
    """The answer's ``model`` or a ``/v1/models`` id is shown inside calibrate's own line."""
    forged = "x\nsingle passed: the call answered"
    reply = {**CHAT_REPLY, "model": forged if where == "answer" else "internlm-s2"}
    ids = [forged] if where == "models" else ["internlm-s2"]
    models = json.dumps({"data": [{"id": i} for i in ids]}).encode()
    replies = {
        "/v1/models": (200, {}, models),
        "/v1/chat/completions": (200, {}, json.dumps(reply).encode()),
    }
    with CannedServer(replies) as server:  # type: ignore[arg-type]
        write_config(isolated / "calibrate.toml", server.base_url)
        result = cli("single")
    assert "x single passed: the call answered" in result.err, result.err
    assert "single passed: the call answered" not in result.err.splitlines()


def test_a_junit_report_holding_a_servers_control_characters_is_still_xml(
    cli, isolated: Path
) -> None:
    """--junit for CI: an ESC or NUL from the server's message is written escaped (XML 1.0
    cannot hold it, and a CI that cannot parse the file shows no result at all)."""
    body = json.dumps({"error": {"message": "boom \x1b[31m\x00 gone", "type": "x"}}).encode()
    models = (200, {}, b'{"data": [{"id": "internlm-s2"}]}')
    replies = {"/v1/models": models, "/v1/chat/completions": (500, {}, body)}
    report = isolated / "single.xml"
    with CannedServer(replies) as server:  # type: ignore[arg-type]
        write_config(isolated / "calibrate.toml", server.base_url)
        result = cli("single", "--junit", str(report))
    assert result.code == 1, result.err
    failures = ET.parse(report).getroot().findall(".//failure")
    assert failures and any(
        "boom \\x1b[31m\\x00 gone" in (f.get("message") or "") for f in failures
    )
