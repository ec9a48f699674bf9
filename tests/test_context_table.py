"""A context ladder's log table: its rows grow from 512 to the server's context, and every row
still fits its columns (a 1024→1024 used to spill past "in tok" and push the row right)."""

from __future__ import annotations

from pathlib import Path

from rich.cells import cell_len

from tests.mockserver import start_mock
from tests.workload_helpers import FAST_MOCK, calibrated


def test_every_row_of_a_context_ladder_fits_the_columns_its_header_set(cli, isolated: Path) -> None:
    with start_mock(**FAST_MOCK, max_model_len=16384) as mock:
        calibrated(cli, isolated, mock.base_url)
        result = cli("ladder", "--axis", "context")
    assert result.code == 0, result.err
    lines = result.err.splitlines()
    at = next(n for n, ln in enumerate(lines) if "in tok" in ln and ln.rstrip().endswith("verdict"))
    header = lines[at]
    rows = [ln for ln in lines[at + 1 :] if ln[:6].strip().isdigit()]
    assert [r.split()[0] for r in rows][:5] == ["512", "1024", "2048", "4096", "8192"]
    edge = header.index("in tok") + len("in tok")  # right-justified under its header
    for row in rows:
        assert cell_len(row) == cell_len(header) <= 100, f"{header}\n{row}"
        assert row[edge - 1].isdigit() and row[edge] == " ", f"{header}\n{row}"


def test_status_says_how_long_an_input_a_context_ladder_verified_without_a_batch_ladder(
    cli, isolated: Path
) -> None:
    """The docs promise status shows "inputs verified up to N tokens" after a context ladder;
    it used to say it only inside the calibrated setting, which a context ladder never sets."""
    with start_mock(**FAST_MOCK, max_model_len=8192) as mock:
        calibrated(cli, isolated, mock.base_url)
        context = cli("ladder", "--axis", "context", "--context-lengths", "512,3000", "--json")
        assert context.code == 0, context.err
        status = cli("status")
    verified = context.json["context_verified"]
    line = next(ln for ln in status.err.splitlines() if ln.startswith("  context "))
    assert f": inputs verified up to {verified:,} tokens (ladder --axis context)" in line, line
    assert "calibrated setting" not in status.err  # no batch ladder: no setting to carry it


def test_a_rate_sweeps_log_table_has_room_for_a_saturated_verdict() -> None:
    """make demo's sweep --auto: the first (synchronous) level says "pass", a later rate level
    "pass saturated" — it pushed its row to 104 columns."""
    import io

    from rich.console import Console

    from calibrate.io.tier_table.cells import row_from_cells
    from calibrate.report.progress import LogTable
    from tests.report_helpers import sweep_row

    stream = io.StringIO()
    table = LogTable(Console(file=stream, width=100, no_color=True), "sweep")
    extra = {"offered_rate": None, "items_per_s_min": 4.0, "items_per_s_max": 4.2}
    table.add(row_from_cells(sweep_row(1, 4.1, auto_step=1, ttft_p99_s=0.05, **extra)))
    saturated = {**extra, "offered_rate": 13.3, "saturated": True, "ttft_p99_s": 0.1}
    table.add(row_from_cells(sweep_row(4, 12.9, auto_step=3, **saturated)))
    header, *rows = stream.getvalue().splitlines()
    assert rows[-1].rstrip().endswith("pass saturated"), rows
    assert all(cell_len(row) <= 100 for row in [header, *rows]), stream.getvalue()
    assert all(len(row) == len(header) for row in rows), stream.getvalue()
