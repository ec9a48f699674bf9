"""tiers.csv, plot.png and ``calibrate report RUN`` re-rendering a run with no server."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from tests.mockserver import start_mock
from tests.tier_helpers import FAST, open_gate, run_dir

SPEC_COLUMNS = {
    "batch_size",
    "concurrency",
    "rounds",
    "waves",
    "total_s",
    "per_item_s",
    "latency_mean_s",
    "latency_p50_s",
    "latency_p90_s",
    "latency_p99_s",
    "latency_max_s",
    "items_per_s",
    "output_tokens_per_s",
    "peak_vram_mib",
    "vram_idle_mib",
    "vram_total_mib",
    "pressure",
    "pressure_source",
    "errors",
    "error_kinds",
    "first_done_s",
    "last_done_s",
    "baseline_match",
    "verdict",
}


def _table(text: str) -> list[str]:
    """The box-drawn table lines of some stderr output."""
    return [line for line in text.splitlines() if line[:1] in "┏┃┡│└"]


def test_tiers_csv_and_report_reproduces_the_table(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.004, slots=4, oom_at=6) as mock:
        open_gate(isolated, mock.base_url)
        ladder = cli("ladder", "--json")
    assert ladder.code == 0, ladder.err
    run = run_dir(isolated, ladder.json["run_id"])
    with (run / "tiers.csv").open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["batch_size"]) for r in rows] == [1, 2, 4, 8]
    assert set(rows[0]) >= SPEC_COLUMNS
    assert rows[3]["verdict"] == "fail" and rows[3]["error_kinds"] == "oom:2"
    assert rows[0]["vram_source"] == "metrics" and float(rows[2]["peak_vram_mib"]) > 0
    assert (run / "plot.png").read_bytes()[:4] == b"\x89PNG"
    (run / "plot.png").unlink()
    report = cli("report", str(run))  # the mock is gone: no server needed
    assert report.code == 0, report.err
    table = _table(report.err)
    assert len(table) == 4 + 4 and table == _table(ladder.err)
    assert (run / "plot.png").exists()
    by_id = cli("report", run.name, "--json", "--no-plot")
    assert by_id.code == 0 and by_id.json["kind"] == "ladder" and len(by_id.json["rows"]) == 4


def test_without_matplotlib_there_is_no_plot_and_no_crash(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        open_gate(isolated, mock.base_url, FAST + "batch_sizes = [1, 2]\n")
        ladder = cli("ladder", "--json")
    assert ladder.code == 0, ladder.err
    run = run_dir(isolated, ladder.json["run_id"])
    assert (run / "tiers.csv").exists() and not (run / "plot.png").exists()
    assert "no plot: matplotlib missing" in ladder.err
    report = cli("report", str(run))
    assert report.code == 0 and "matplotlib is not installed" in report.err


def test_report_of_something_that_is_not_a_run(cli, isolated: Path) -> None:
    (isolated / "empty").mkdir()
    result = cli("report", "empty")
    assert result.code == 2 and "tiers.csv" in result.err and "Traceback" not in result.err


def test_a_narrow_terminal_drops_minor_columns_instead_of_cropping_cells() -> None:
    from rich.console import Console

    from calibrate.report import tier_table

    row = {
        "batch_size": 8,
        "concurrency": 1,
        "rounds": 2,
        "items": 16,
        "per_item_s": 0.0394,
        "latency_p50_s": 0.118,
        "latency_p90_s": 0.234,
        "latency_max_s": 0.234,
        "items_per_s": 25.38,
        "output_tokens_per_s": 1218,
        "peak_vram_mib": 53248,
        "pressure": 0.65,
        "pressure_source": "metrics",
        "errors": 2,
        "error_kinds": "oom:2",
        "baseline_match": 6,
        "baseline_items": 8,
        "verdict": "fail",
    }
    wide = tier_table([row], "ladder")
    narrow = tier_table([row], "ladder", width=80)
    assert len(narrow.columns) < len(wide.columns)
    names = [c.header for c in narrow.columns]
    assert {"batch", "s/item", "items/s", "peak MiB", "errors", "verdict"} <= set(names)
    console = Console(width=80, record=True, force_terminal=False)
    console.print(narrow)
    text = console.export_text()
    assert "…" not in text and "53248" in text and "oom:2" in text
