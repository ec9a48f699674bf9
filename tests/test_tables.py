"""What a user reads of a stage's tables: one table that fits 100 columns (the essential
columns), every column with --wide, and in a log that table a row as each tier finishes, never
the same numbers again in a second line kind."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from calibrate.io.tier_table.cells import row_from_cells
from calibrate.io.tier_table.row import TierRow
from calibrate.io.tier_table.tune import TuneRow
from calibrate.report.progress import live_rows
from calibrate.report.tables.tiers import tier_table
from tests.mockserver import start_mock
from tests.report_helpers import TABLES_CONFIG, TABLES_MOCK, keyed_rows, table_lines, tables
from tests.tier_helpers import open_gate, run_dir


def _table_lines(err: str) -> list[str]:
    return table_lines(err)


def _header(err: str, word: str = "items/s") -> str:
    return next(header for header, *_ in tables(err) if word in header)


def _wide_header(err: str) -> str:
    """--wide in a log: the live table's essential columns, then every column once at the end."""
    return tables(err)[-1][0]


def _rows(err: str, key: float) -> list[str]:
    return [r for r in _table_lines(err) if r.split() and r.split()[0] == f"{key:g}"]


TIER_LINE = re.compile(r"^(batch|conc|rate|input|sync|max)\b[^:]*: ")


def _wide_lines(err: str, limit: int = 100) -> list[str]:
    """Table lines and per-tier lines longer than ``limit`` (prose may wrap in the terminal)."""
    lines = [*_table_lines(err), *(ln for ln in err.splitlines() if TIER_LINE.match(ln))]
    return [line for line in lines if len(line) > limit]


@pytest.fixture
def columns_100(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")


def _ladder(cli, isolated: Path, *flags: str):  # type: ignore[no-untyped-def]
    with start_mock(**TABLES_MOCK) as mock:
        open_gate(isolated, mock.base_url, TABLES_CONFIG)
        result = cli("ladder", "--json", *flags)
    assert result.code == 0, result.err
    return result


def test_a_ladder_in_a_log_fits_100_columns_and_shows_each_tier_once(
    cli, isolated: Path, columns_100: None
) -> None:
    result = _ladder(cli, isolated, "--input-tokens", "64", "--output-tokens", "8")
    assert not _wide_lines(result.err), _wide_lines(result.err)
    tiers = [t["batch_size"] for t in result.json["tiers_detail"]]
    assert tiers == [1, 2, 4, 8]
    lines = result.err.splitlines()
    assert len(_table_lines(result.err)) == 1 + len(tiers)  # one table, a row as each finished
    for batch in tiers:  # one row each, no second line about it
        assert not [ln for ln in lines if ln.startswith(f"batch {batch}: ")], lines
        (row,) = _rows(result.err, batch)
        assert row.rstrip().endswith(
            ("pass", "fail", "stop: cap", "stop: latency", "stop: vram", "stop: preempt")
        )
    assert not [ln for ln in lines if "=" in ln and "s/item=" in ln]  # no key=value line
    header = _header(result.err)
    for name in ("batch", "conc", "in tok", "items/s", "s/item", "p99 s", "peak MiB", "verdict"):
        assert name in header, header
    assert "64→" in result.err  # the input-token target and what the server counted
    assert "p90 s" not in header and "tok/s" not in header and "…" not in result.err


def test_wide_shows_every_column_and_the_default_keeps_them_in_the_csv(
    cli, isolated: Path, columns_100: None
) -> None:
    wide = _ladder(cli, isolated, "--wide")
    header = _wide_header(wide.err)
    for name in ("rounds", "waves", "items", "p90 s", "max s", "tok/s", "queue", "match"):
        assert name in header, header
    assert "metrics" in wide.err.split(header)[1]  # pressure with its source
    assert max(len(ln) for ln in _table_lines(wide.err)) > 100  # not squeezed into 100
    assert "…" not in wide.err
    narrow = _ladder(cli, isolated)
    csv_header = (run_dir(isolated, narrow.json["run_id"]) / "tiers.csv").read_text().split("\n")[0]
    assert "latency_p90_s" in csv_header and "output_tokens_per_s" in csv_header


def test_a_sweep_in_a_log_fits_100_columns_one_line_per_level(
    cli, isolated: Path, columns_100: None
) -> None:
    with start_mock(**TABLES_MOCK) as mock:
        open_gate(isolated, mock.base_url, TABLES_CONFIG, stage="ladder")
        result = cli("sweep", "--json", "--beyond-ladder")
        wide = cli("sweep", "--json", "--beyond-ladder", "--wide")
    assert result.code == 0 and wide.code == 0, result.err + wide.err
    assert not _wide_lines(result.err), _wide_lines(result.err)
    # one table (one header), a row as each level finished; a noisy level's further runs may be
    # noted between two rows
    assert len(tables(result.err)) == 1, result.err
    assert len(keyed_rows(result.err, (1, 2, 4))) == 3, result.err
    header = _header(result.err)
    assert "range" in header and "gain" in header and "tok/s" not in header
    wide_header = _wide_header(wide.err)
    assert "tok/s" in wide_header and "total s" in wide_header and "runs" in wide_header


def test_report_a_b_headers_are_whole_at_100_columns(
    cli, isolated: Path, columns_100: None
) -> None:
    a = _ladder(cli, isolated)
    b = _ladder(cli, isolated)
    result = cli("report", a.json["run_id"], b.json["run_id"])
    assert result.code == 0, result.err
    assert not _wide_lines(result.err), _wide_lines(result.err)
    table = "\n".join(_table_lines(result.err))
    assert "…" not in table and "items_per" not in table, table
    header = _header(result.err, "verdict A")
    assert header.split()[0] == "batch" and "items/s" in header
    assert "more metrics: --wide" in result.err  # the metrics left out: where to see them
    wide = cli("report", a.json["run_id"], b.json["run_id"], "--wide")
    wide_header = _header(wide.err, "verdict A")
    assert len(wide_header.split("  ")) > len(header.split("  "))
    assert "more metrics" not in wide.err
    one = cli("report", a.json["run_id"])  # one run: its table and the spread over rounds
    assert one.code == 0 and not _wide_lines(one.err), _wide_lines(one.err)
    assert "over the rounds" in one.err


@pytest.mark.parametrize("width", [80, 100, 120])
def test_the_default_table_fits_the_terminal(width: int) -> None:
    rows = [
        {
            "batch_size": b,
            "concurrency": b,
            "rounds": 2,
            "items": 16 * b,
            "per_item_s": 0.0394 / b,
            "latency_p50_s": 0.118,
            "latency_p99_s": 0.234,
            "ttft_p99_s": 0.051,
            "items_per_s": 25.38 * b,
            "goodput_per_s": 20.1 * b,
            "peak_vram_mib": 53248,
            "pressure": 0.65,
            "pressure_source": "metrics",
            "errors": 2 if b == 16 else 0,
            "error_kinds": "oom:2 timeout:1" if b == 16 else "",
            "verdict": "stop: latency" if b == 16 else "pass",
        }
        for b in (1, 2, 4, 8, 16)
    ]
    console = Console(width=width, record=True, file=io.StringIO(), force_terminal=False)
    console.print(tier_table([row_from_cells(r) for r in rows], "ladder", "ladder run", width))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= width, text
    assert "…" not in text and "stop: latency" in text and "batch" in text


def test_a_tune_table_fits_100_columns_in_a_log() -> None:
    from calibrate.cli.output import Output
    from calibrate.cli.views.tune import show_ranked

    rows = [
        {
            "rank": n,
            "id": f"c0{n}",
            "flags": f"max_num_seqs={8 * n} max_num_batched_tokens={4096 * n}",
            "status": "measured",
            "cap": 8 * n,
            "best_concurrency": 4,
            "goodput_per_s": 14.76 / n,
            "items_per_s": 15.97 / n,
            "output_tokens_per_s": 767,
            "p50_s": 0.247,
            "p90_s": 0.271,
            "peak_vram_mib": 49152,
            "peak_kv_usage": 0.2,
            "errors": 0,
            "incidents": 0,
        }
        for n in (1, 2, 3)
    ]
    ranked = [TuneRow.from_json(r) for r in rows]
    for wide in (False, True):
        stream = io.StringIO()
        out = Output(False, stream, wide=wide)
        out.console.width = 100
        show_ranked(out, ranked, "tune run (ranked by goodput)")
        text = stream.getvalue()
        assert "rank=" not in text and "c03" in text  # a table, not key=value lines
        if wide:
            assert "incidents" in text and max(map(len, text.splitlines())) > 100
        else:
            assert max(map(len, text.splitlines())) <= 100, text
            assert "goodput/s" in text and "incidents" not in text


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _row(batch: int) -> TierRow:
    return row_from_cells(
        {
            "batch_size": batch,
            "concurrency": batch,
            "rounds": 2,
            "items": 8,
            "errors": 0,
            "items_per_s": 10.0 * batch,
            "per_item_s": 0.1 / batch,
            "latency_p99_s": 0.2,
            "verdict": "pass",
        }
    )


def test_a_terminal_gets_a_progress_bar_with_eta_and_a_log_never_does() -> None:
    from calibrate.report.progress import Plan

    terminal = _Terminal()
    console = Console(file=terminal, force_terminal=True, width=100)
    with live_rows(console, "ladder", "ladder run", True, plan=Plan(4, 30.0)) as show:
        show(_row(1))
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal.getvalue())
    assert "ETA 2:00" in shown  # 4 tiers × 30 s planned, before the first one finished
    assert "tiers" in shown and "items/s" in shown
    log = io.StringIO()
    console = Console(file=log, force_terminal=False, width=100)
    with live_rows(console, "ladder", "ladder run", False, plan=Plan(4, 30.0)) as show:
        show(_row(1))
        show(_row(2))
    assert "ETA" not in log.getvalue() and "━" not in log.getvalue()
    header, *rows = log.getvalue().splitlines()  # the table, a row at a time: no title, no rule
    assert header.split() == [
        "batch",
        "conc",
        "s/item",
        "p50",
        "s",
        "p99",
        "s",
        "items/s",
        "peak",
        "MiB",
        "pressure",
        "errors",
        "verdict",
    ]
    assert [row.split() for row in rows] == [
        ["1", "1", "0.1000", "—", "0.200", "10.00", "—", "—", "0", "pass"],
        ["2", "2", "0.0500", "—", "0.200", "20.00", "—", "—", "0", "pass"],
    ]
    for row, figure in zip(rows, ("10.00", "20.00"), strict=True):  # the columns line up
        assert row.index("pass") == header.index("verdict")  # text to the left
        assert row.index(figure) + len(figure) == header.index("items/s") + len("items/s")


def test_tune_and_report_of_it_fit_100_columns_and_wide_shows_every_column(
    cli, isolated: Path, columns_100: None
) -> None:
    import shlex

    from tests.tune_helpers import MOCK, tune_config

    command = shlex.join(MOCK) + " --port {port} --slots {slots}"
    tune_config(isolated, 'grid = ["slots=1,2"]\n', command=command)
    tuned = cli("tune", "--json")
    assert tuned.code == 0, tuned.err
    table = _table_lines(tuned.err)
    assert len(table) == 1 + 2 and not _wide_lines(tuned.err), tuned.err
    assert "rank=" not in tuned.err and "goodput/s" in table[0] and "incidents" not in table[0]
    run = tuned.json["run_id"]
    shown = cli("report", run)
    assert shown.code == 0 and _table_lines(shown.err) == table, shown.err
    wide = cli("report", run, "--wide")
    assert wide.code == 0 and "incidents" in _table_lines(wide.err)[0], wide.err
