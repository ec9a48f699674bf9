"""Runs written by an earlier calibrate still read, and today's stages still write every field
they held.

``tests/fixtures/runs-<commit>/`` are ladder and sweep runs written by that commit's calibrate
(``tests/fixtures/make_runs.sh``): 7dfc241, and 281c60c — the last main before tier rows were
typed. tiers.csv, tiers.jsonl, rounds.jsonl and summary.json are read by people's own scripts as
well as by ``report``, ``status`` and ``pin``: a column or field is never renamed or dropped.
"""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from calibrate.io.tier_table import read_table, write_tiers_csv
from calibrate.io.tier_table.cells import row_from_cells, row_json
from tests.helpers import FAKE_KEY
from tests.mockserver import start_mock_process

FIXTURES = Path(__file__).parent / "fixtures"
BEFORE = FIXTURES / "runs-281c60c"  # main just before rows were typed
RUNS = sorted(p for p in FIXTURES.glob("runs-*/*") if (p / "tiers.csv").is_file())


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def _names(value: Any, path: str = "") -> Iterator[str]:
    """Every field name a JSON value holds, as a path (``.tiers[].goodput_per_s``)."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield f"{path}.{key}"
            yield from _names(inner, f"{path}.{key}")
    elif isinstance(value, list):
        for inner in value:
            yield from _names(inner, f"{path}[]")


def _all_names(values: Iterable[Any]) -> set[str]:
    return {name for value in values for name in _names(value)}


@pytest.mark.parametrize("run", RUNS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_line_of_tiers_jsonl_reads_back_and_writes_again_unchanged(run: Path) -> None:
    """Every field with its value; a run of today's fields (``BEFORE``): the very same line."""
    for number, line in enumerate(_lines(run / "tiers.jsonl"), 1):
        back = row_json(row_from_cells(line))
        assert {k: back.get(k, "missing") for k in line} == line, f"tiers.jsonl:{number}"
        assert back == line or run.parent != BEFORE, f"tiers.jsonl:{number}"


@pytest.mark.parametrize("run", RUNS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_round_keeps_every_field_and_value_it_was_written_with(run: Path) -> None:
    for number, line in enumerate(_lines(run / "rounds.jsonl"), 1):
        back = row_json(row_from_cells(line))
        assert {k: back.get(k, "missing") for k in line} == line, f"rounds.jsonl:{number}"


@pytest.mark.parametrize("run", [r for r in RUNS if r.parent == BEFORE], ids=lambda p: p.name)
def test_a_tiers_csv_is_written_again_byte_for_byte(run: Path, tmp_path: Path) -> None:
    table = read_table(run / "tiers.csv")
    source = table.rows[0].vram_source or ""
    again = write_tiers_csv(tmp_path / "tiers.csv", table.rows, table.kind, source)
    assert again.read_text("utf-8") == (run / "tiers.csv").read_text("utf-8")


@pytest.mark.parametrize("run", RUNS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_report_reads_a_run_written_before(cli: Any, isolated: Path, run: Path) -> None:
    copy = shutil.copytree(run, isolated / run.name)
    shown = cli("report", str(copy), "--json", "--html", "--no-plot")
    assert shown.code == 0, shown.err
    with (run / "tiers.csv").open(newline="", encoding="utf-8") as handle:
        assert len(shown.json["rows"]) == len(list(csv.DictReader(handle)))
    assert (copy / "report.html").is_file()


def _ledger_folder(root: Path) -> Path:
    """The fixture runs under ``root/runs/<run_id>`` with the ledger that wrote them; its
    target's server is never asked (status and pin read files)."""
    for run in sorted(p for p in BEFORE.iterdir() if p.is_dir()):
        run_id = json.loads((run / "manifest.json").read_text("utf-8"))["run_id"]
        shutil.copytree(run, root / "runs" / run_id)
    shutil.copy(BEFORE / "ledger.jsonl", root / "runs" / "ledger.jsonl")
    config = (BEFORE / "calibrate.toml").read_text("utf-8")
    (root / "calibrate.toml").write_text(config + '[server]\nmodel_path = "/models/m"\n', "utf-8")
    return root


def test_status_and_pin_read_a_ledger_written_before(cli: Any, isolated: Path) -> None:
    _ledger_folder(isolated)
    ledger = _lines(isolated / "runs" / "ledger.jsonl")
    sweep = next(e for e in reversed(ledger) if e["stage"] == "sweep")
    status = cli("status", "--json")
    assert status.code == 0, status.err
    setting = status.json["setting"]
    pinned = cli("pin", "--kind", "vllm", "--json")
    assert pinned.code == 0, pinned.err
    assert pinned.json["concurrency"] == setting["concurrency"]
    assert pinned.json["concurrency_from"] == f"sweep run {sweep['run_id']}"
    assert f"--max-num-seqs {setting['batch_size']}" in pinned.json["command"]


def _written(run: Path) -> dict[str, set[str]]:
    """The field names each of a run's files holds (a summary's tiers and levels: the rows)."""
    summary = json.loads((run / "summary.json").read_text("utf-8"))["summary"]
    with (run / "tiers.csv").open(newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle))
    return {
        "tiers.csv": set(header),
        "tiers.jsonl": _all_names(_lines(run / "tiers.jsonl")),
        "rounds.jsonl": _all_names(_lines(run / "rounds.jsonl")),
        "summary tiers": _all_names(summary.get("tiers") or summary.get("levels") or []),
    }


def test_todays_stages_write_every_field_the_runs_before_held(
    cli: Any, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ladder with SLOs and a price and a rate sweep, against the mock the fixtures were
    written with: every column and field of ``runs-281c60c`` is written again, same names."""
    monkeypatch.setenv("CALIBRATE_API_KEY", FAKE_KEY)
    flags = ["--slots", "4", "--ttft", "0.01", "--per-token", "0.002", "--metrics-style", "vllm"]
    flags += ["--power-w", "300", "--power-per-request-w", "20", "--kv-capacity-tokens", "4000"]
    tokens = ["--vram-source", "metrics", "--input-tokens", "64", "--output-tokens", "8"]
    mock = start_mock_process(*flags, "--on-kv-full", "preempt", "--oom-at", "8")
    try:
        config = (BEFORE / "calibrate.toml").read_text("utf-8").splitlines()
        lines = [f'base_url = "{mock.base_url}"' if x.startswith("base_url") else x for x in config]
        (isolated / "calibrate.toml").write_text("\n".join(lines) + "\n", "utf-8")
        for stage in ("single", "repro"):
            assert cli(stage).code == 0
        price = ["--slo", "ttft:0.5", "--gpu-price-per-hour", "2.5"]
        # a busy machine may leave either inconclusive (exit 1): its files are written all the same
        ladder = cli("ladder", "--json", *price, *tokens)
        assert ladder.code in (0, 1), ladder.err
        # its batch size given: a ladder with no passing tier (beside four CPU burners) sets none
        sweep = cli("sweep", "--json", "--force", "--batch-size", "4", "--rates", "8,inf", *tokens)
        assert sweep.code in (0, 1), sweep.err
    finally:
        mock.stop()
    for name, run_id in (
        ("ladder-slo", ladder.json["run_id"]),
        ("sweep-rates", sweep.json["run_id"]),
    ):
        before, now = _written(BEFORE / name), _written(isolated / "runs" / run_id)
        for what, names in before.items():
            assert names <= now[what], f"{name} {what} no longer writes {sorted(names - now[what])}"
    rates = _lines(isolated / "runs" / sweep.json["run_id"] / "tiers.jsonl")
    assert [r["offered_rate"] for r in rates] == [8.0, "inf"]  # JSON has no infinity
    assert [r["offered_rate"] for r in sweep.json["levels"]] == [8.0, "inf"]


def test_an_slo_runs_goodput_is_a_headline_metric_compared_higher_is_better(
    cli: Any, isolated: Path
) -> None:
    """``report A B`` of two runs under SLOs compares goodput beside items/s (it was once
    looked up as ``goodput``, a column no table has, and never shown)."""
    a = shutil.copytree(BEFORE / "ladder-slo", isolated / "a")
    b = shutil.copytree(FIXTURES / "runs-7dfc241" / "ladder-slo", isolated / "b")
    compared = cli("report", str(a), str(b), "--json")
    assert compared.code == 0, compared.err
    assert compared.json["metrics"][:2] == ["items_per_s", "goodput_per_s"]
    rows = compared.json["rows"]
    good = [row["deltas"]["goodput_per_s"]["better"] for row in rows]
    assert good == [row["deltas"]["items_per_s"]["better"] for row in rows]
    # batch 8: 24 % less goodput, as 24 % fewer items/s — shown, not called worse: one of the
    # runs measured it in one round, so there is no interval (report claims only what separates)
    changes = [row["deltas"]["goodput_per_s"]["change"] for row in rows]
    assert any(c is not None and c < -0.2 for c in changes), changes
    shown = cli("report", str(a), "--no-plot")
    spreads = shown.err.split("over the rounds")[1].splitlines()[1]
    assert "goodput" in spreads.split()
