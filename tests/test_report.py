"""tiers.csv, plot.png and ``calibrate report RUN`` re-rendering a run with no server."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from tests.helpers import write_config
from tests.mockserver import start_mock
from tests.report_helpers import ladder_row, sweep_row, table_lines, write_run
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
    """The table lines of some stderr output: header, rows."""
    return table_lines(text)


PLOT = "[report]\nplot = true\n"  # the default (tests.helpers.write_config draws none)


def test_tiers_csv_and_report_reproduces_the_table(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.004, slots=4, oom_at=6) as mock:
        open_gate(isolated, mock.base_url, FAST + PLOT)
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
    assert table[: 1 + 4] == _table(ladder.err)  # the ladder's own table, line for line
    # then each tier's repeated metrics over its 2 rounds: mean [95 % interval] and CV
    assert (
        len(table) == 2 * (1 + 4) and "over the rounds: mean [95 % interval] and CV" in report.err
    )
    assert (run / "plot.png").exists()
    by_id = cli("report", run.name, "--json", "--no-plot")
    assert by_id.code == 0 and by_id.json["kind"] == "ladder" and len(by_id.json["rows"]) == 4


def test_without_matplotlib_there_is_no_plot_and_no_crash(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        open_gate(isolated, mock.base_url, FAST + "batch_sizes = [1, 2]\n" + PLOT)
        ladder = cli("ladder", "--json")
    assert ladder.code == 0, ladder.err
    run = run_dir(isolated, ladder.json["run_id"])
    assert (run / "tiers.csv").exists() and not (run / "plot.png").exists()
    assert "no plot: matplotlib missing" in ladder.err
    report = cli("report", str(run))
    assert report.code == 0 and "matplotlib is not installed" in report.err


def test_report_plot_false_writes_the_tables_alone_and_report_draws_the_plot_later(
    cli, isolated: Path
) -> None:
    """[report] plot = false (a CI job that reads tables): the ladder and the sweep write no
    plot.png and say why; ``calibrate report RUN`` draws it when asked."""
    sweep = "[sweep]\nconcurrency = [1, 2]\nlevel_s = 0.1\nrepeats = 1\n"
    no_plot = FAST + "batch_sizes = [1, 2]\n" + sweep + "[report]\nplot = false\n"
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        open_gate(isolated, mock.base_url, no_plot)
        ladder = cli("ladder", "--json")
        sweep_run = cli("sweep", "--json")
    for result in (ladder, sweep_run):
        assert result.code == 0, result.err
        run = run_dir(isolated, result.json["run_id"])
        assert (run / "tiers.csv").exists() and not (run / "plot.png").exists()
        said = f"tables: runs/{run.name}/tiers.csv (no plot: [report] plot = false)"
        assert said in result.err
        assert cli("report", str(run)).code == 0
        assert (run / "plot.png").read_bytes()[:4] == b"\x89PNG"


def test_report_of_something_that_is_not_a_run(cli, isolated: Path) -> None:
    (isolated / "empty").mkdir()
    result = cli("report", "empty")
    assert result.code == 2 and "tiers.csv" in result.err and "Traceback" not in result.err


def test_a_narrow_terminal_drops_minor_columns_instead_of_cropping_cells() -> None:
    from rich.console import Console

    from calibrate.io.tier_table.cells import row_from_cells
    from calibrate.report.tables.tiers import tier_table

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
    wide = tier_table([row_from_cells(row)], "ladder", wide=True)
    narrow = tier_table([row_from_cells(row)], "ladder", width=80)
    assert len(narrow.columns) < len(wide.columns)
    names = [c.header for c in narrow.columns]
    assert {"batch", "s/item", "items/s", "peak MiB", "errors", "verdict"} <= set(names)
    console = Console(width=80, record=True, force_terminal=False)
    console.print(narrow)
    text = console.export_text()
    assert "…" not in text and "53248" in text and "oom:2" in text


# --- damaged run folders: a clear message naming the file, never a traceback ----------------


def _damaged(root: Path, case: str) -> Path:
    import json

    from tests.report_helpers import ladder_row, sweep_row, write_run

    rows = [ladder_row(1, 2.0), ladder_row(2, 3.0)]
    if case == "400-digit batch_size":
        return write_run(root, case.replace(" ", "-"), "ladder", [ladder_row(int("9" * 400), 2.0)])
    if case == "negative batch_size":
        return write_run(root, "neg", "ladder", [ladder_row(-4, 2.0), *rows])
    if case == "zero concurrency":
        return write_run(root, "zero", "sweep", [sweep_row(0, 2.0), sweep_row(2, 3.0)])
    if case == "1e300 items_per_s":
        return write_run(root, "huge", "ladder", [ladder_row(1, 1e300), ladder_row(2, 3.0)])
    run = write_run(root, "r", "ladder", rows)
    if case == "list-valued manifest.json":
        (run / "manifest.json").write_text("[1, 2, 3]", "utf-8")
    elif case == "list-valued summary.json":
        (run / "summary.json").write_text('[{"passed": true}]', "utf-8")
    elif case == "manifest stage a list":
        (run / "manifest.json").write_text(json.dumps({"stage": ["ladder"]}), "utf-8")
    elif case == "garbage summary.json":
        (run / "summary.json").write_text('{"passed": tru', "utf-8")
    return run


DAMAGED = {
    "400-digit batch_size": "batch_size is a number of 400 digits",
    "negative batch_size": "batch_size is -4, below 1",
    "zero concurrency": "concurrency is 0, below 1",
    "1e300 items_per_s": "items_per_s is 1e+300, out of range",
    "list-valued manifest.json": "manifest.json is not a JSON object",
    "list-valued summary.json": "summary.json is not a JSON object",
    "garbage summary.json": "summary.json is not a JSON object",
    "manifest stage a list": "",
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_a_damaged_run_folder_is_a_clear_message_or_a_report(
    cli, isolated: Path, case: str
) -> None:
    run = _damaged(isolated, case)
    for args in (["--html"], ["--html", "--timeline", "2"], [str(run)]):  # and compared with itself
        result = cli("report", str(run), *args)
        assert "Traceback" not in result.err, (args, result.err)
        if DAMAGED[case].endswith("not a JSON object"):  # a damaged folder: never "not recorded"
            assert result.code == 2, result.err
            assert f"{run / DAMAGED[case]}: the run folder is damaged" in result.err, result.err
        elif DAMAGED[case]:
            assert result.code == 2, result.err
            assert f"{run / 'tiers.csv'}:2: {DAMAGED[case]}" in result.err, result.err
            assert len(result.err.strip().splitlines()) == 2
        else:
            assert result.code in (0, 2), result.err
            if result.code == 2:
                assert str(run) in result.err


@pytest.mark.parametrize(
    "record",
    [
        {"batch_size": 2, "started_s": 1e308, "elapsed_s": 1.0},
        {"batch_size": 2, "started_s": 1e308, "elapsed_s": 1e308},
        {"batch_size": 2, "started_s": -1e308, "done_s": 1e308},
        {"batch_size": int("9" * 400), "started_s": 0.0, "elapsed_s": 1.0},
        {"batch_size": [2], "started_s": 0.0, "elapsed_s": 1.0},
    ],
)
def test_absurd_times_in_records_never_crash_the_timeline(
    cli, isolated: Path, record: dict
) -> None:
    import json

    from tests.report_helpers import ladder_row, write_run

    good = {"batch_size": 2, "started_s": 0.0, "elapsed_s": 1.0, "ok": True}
    run = write_run(isolated, "t", "ladder", [ladder_row(1, 2.0), ladder_row(2, 3.0)])
    (run / "records.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in (good, record)), "utf-8"
    )
    result = cli("report", str(run), "--html", "--timeline", "2")
    assert result.code in (0, 2), result.err
    assert "Traceback" not in result.err


def _with_rounds(root: Path, kind: str, key: str, rounds: dict[int, list[float]]) -> Path:
    row = ladder_row if kind == "ladder" else sweep_row
    rows = [row(k, sum(v) / len(v)) for k, v in rounds.items()]
    run = write_run(root, "r", "ladder" if kind == "ladder" else "sweep", rows)
    lines = [
        {key: k, "batch_size": k if key == "batch_size" else 4, "round": n, "items_per_s": v}
        for k, vs in rounds.items()
        for n, v in enumerate(vs, 1)
    ]
    (run / "rounds.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), "utf-8")
    return run


@pytest.mark.parametrize(
    ("kind", "key", "where", "more"),
    [
        ("ladder", "batch_size", "batch 2", "add rounds ([ladder] rounds)"),
        ("sweep", "concurrency", "concurrency 2", "add repeats ([sweep] repeats)"),
    ],
)
def test_report_of_one_run_gives_each_tiers_interval_and_calls_out_a_noisy_one(
    cli, isolated: Path, kind: str, key: str, where: str, more: str
) -> None:
    _with_rounds(isolated, kind, key, {1: [10.0, 10.2, 9.8], 2: [16.0, 20.0, 24.0], 4: [30.0]})
    result = cli("report", "runs/r", "--json", "--no-plot")
    assert result.code == 0, result.err
    confidence = result.json["confidence"]
    assert confidence["level"] == 0.95
    tiers = {t["key"]: t["metrics"]["items_per_s"] for t in confidence["tiers"]}
    assert tiers[1]["n"] == 3 and tiers[1]["mean"] == pytest.approx(10.0)
    assert tiers[1]["ci_low"] == pytest.approx(10 - 4.302653 * 0.2 / 3**0.5, abs=1e-5)
    assert tiers[1]["cv"] == pytest.approx(0.02)
    assert tiers[2]["cv"] == pytest.approx(0.2)
    assert tiers[4] == {
        "n": 1,
        "mean": 30.0,
        "sd": None,
        "ci_low": None,
        "ci_high": None,
        "cv": None,
        "level": 0.95,
    }
    said = f"noisy: items_per_s CV 20 % at {where} — {more}"
    assert result.json["noisy"] == [said] and f"warning: {said}" in result.err
    # the table of intervals under the tier table: mean [low, high] and CV per tier
    assert "mean [95 % interval] and CV" in result.err
    assert "10 [9.503, 10.5] CV 2 %" in result.err and "30 (one round)" in result.err


def test_a_run_without_rounds_has_no_interval_table_and_no_callout(cli, isolated: Path) -> None:
    write_run(isolated, "r", "ladder", [ladder_row(1, 4.0), ladder_row(2, 8.0)])
    result = cli("report", "runs/r", "--json", "--no-plot")
    assert result.code == 0, result.err
    assert result.json["confidence"]["tiers"] == [] and result.json["noisy"] == []
    assert "interval" not in result.err and "noisy" not in result.err


def test_report_of_a_run_without_tiers_names_its_stage(cli, mock, isolated: Path) -> None:
    """report on a single (batch, verify, rollback) run said "tiers.csv does not exist: RUN is
    not a finished ladder or sweep run" — as if the run had not finished; it names the stage
    and where its result is, exit 2, and a damaged manifest is named."""
    write_config(isolated / "calibrate.toml", mock.base_url)
    assert cli("single").code == 0
    run = next((isolated / "runs").glob("*-single-*"))
    result = cli("report", str(run))
    assert result.code == 2
    assert f"{run} is a single run: report reads ladder, sweep and tune runs" in result.err
    assert "not a finished" not in result.err and str(run / "summary.json") in result.err
    (run / "manifest.json").write_text("[1, 2", encoding="utf-8")
    damaged = cli("report", str(run))
    assert damaged.code == 2 and f"{run / 'manifest.json'} is not a JSON object" in damaged.err
