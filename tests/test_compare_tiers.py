"""``--compare`` / ``--save-baseline``: regressions against a committed tier table."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from calibrate.errors import InputError
from calibrate.io.tier_table.cells import row_from_cells
from calibrate.io.tier_table.row import TierRow
from calibrate.stages.measure.tier_stage.compare_tiers import compare_tables, read_table
from tests.mockserver import start_mock
from tests.tier_helpers import assert_kept_or_client_bound, open_gate


def _rows(*tiers: tuple[int, str, float]) -> list[TierRow]:
    return [
        row_from_cells({"batch_size": str(b), "verdict": v, "per_item_s": str(s)}, text=True)
        for b, v, s in tiers
    ]


BASE = _rows((1, "pass", 0.10), (2, "pass", 0.10), (4, "pass", 0.12), (8, "fail", 0.30))


def test_equal_tables_pass() -> None:
    result = compare_tables("ladder", BASE, BASE, tolerance=0.2)
    assert result.passed and result.problems == ()
    assert [r.change for r in result.rows[:3]] == ["+0%", "+0%", "+0%"]


def test_lower_last_passing_tier_fails_naming_the_tier() -> None:
    now = _rows((1, "pass", 0.10), (2, "pass", 0.10), (4, "fail", 0.12))
    result = compare_tables("ladder", BASE, now)
    assert not result.passed
    assert result.problems[0] == "last passing batch_size is 2, lower than the baseline's 4"
    assert "batch_size 4 passed in the baseline and now fails (fail)" in result.problems
    assert result.last_passing.bad and result.rows[2].verdict.bad


def test_latency_beyond_tolerance_fails_within_passes() -> None:
    slower = _rows((1, "pass", 0.10), (2, "pass", 0.125), (4, "pass", 0.12), (8, "fail", 0.3))
    fails = compare_tables("ladder", BASE, slower, tolerance=0.2)
    assert not fails.passed and fails.rows[1].metric.bad and fails.rows[1].change == "+25%"
    assert "batch_size 2: per_item_s 0.125 is 25% higher" in fails.problems[0]
    assert compare_tables("ladder", BASE, slower, tolerance=0.3).passed
    a_bit = _rows((1, "pass", 0.11), (2, "pass", 0.10), (4, "pass", 0.12), (8, "fail", 0.3))
    assert compare_tables("ladder", BASE, a_bit, tolerance=0.2).passed


def test_an_slo_stop_is_not_kept_as_passing() -> None:
    now = _rows((1, "pass", 0.10), (2, "pass", 0.10), (4, "stop: slo", 0.12))
    result = compare_tables("ladder", BASE, now)
    assert result.problems[0] == "last passing batch_size is 2, lower than the baseline's 4"


def test_a_baseline_from_before_per_item_s_is_compared_on_request_latency(isolated: Path) -> None:
    """An old baselines/ladder.csv has per_item_mean_s (then: mean request latency) and no
    per_item_s; both tables still have mean request latency, now named latency_mean_s."""
    old = isolated / "ladder.csv"
    old.write_text("batch_size,verdict,per_item_mean_s\n1,pass,0.10\n2,pass,0.10\n", "utf-8")
    new = isolated / "tiers.csv"
    new.write_text(
        "batch_size,verdict,per_item_s,latency_mean_s\n1,pass,0.1,0.10\n2,pass,0.05,0.13\n", "utf-8"
    )
    result = compare_tables("ladder", read_table(old, "ladder"), read_table(new, "ladder"))
    assert result.metric_name == "latency_mean_s"
    assert "batch_size 2: latency_mean_s 0.13 is 30% higher" in result.problems[0]
    same = compare_tables("ladder", read_table(new, "ladder"), read_table(new, "ladder"))
    assert same.metric_name == "per_item_s" and same.passed


def test_sweep_throughput_drop_fails() -> None:
    base = [
        row_from_cells({"concurrency": 1, "verdict": "pass", "items_per_s": 10}),
        row_from_cells({"concurrency": 4, "verdict": "pass", "items_per_s": 40}),
    ]
    now = [
        row_from_cells({"concurrency": 1, "verdict": "pass", "items_per_s": 10}),
        row_from_cells({"concurrency": 4, "verdict": "pass", "items_per_s": 30}),
    ]
    result = compare_tables("sweep", base, now, tolerance=0.2)
    assert not result.passed and "concurrency 4: items_per_s 30 is 25% lower" in result.problems[0]


def test_wrong_table_is_an_input_error(isolated: Path) -> None:
    path = isolated / "x.csv"
    path.write_text("concurrency,items_per_s,verdict\n1,2,pass\n", "utf-8")
    with pytest.raises(InputError, match="no column 'batch_size'"):
        read_table(path, "ladder")


def _edit(path: Path, batch: int, **changes: str) -> None:
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        if int(row["batch_size"]) == batch:
            row.update(changes)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_cli_save_baseline_then_compare(cli, isolated: Path) -> None:
    """The flags end to end: what a changed verdict or last passing tier does to the exit code
    and the lines. A tier's rounds here are single waves of ~60 ms, which one 100 ms stall of a
    busy core makes twice as slow, so "no regression" is asked with a tolerance of 10 (a tier
    11× slower passes): the tolerance rule itself is the pure tests' above."""
    with start_mock(ttft_s=0.02, per_token_s=0.0005, slots=4, oom_at=6) as mock:
        open_gate(isolated, mock.base_url)
        saved = cli("ladder", "--save-baseline")
        assert saved.code == 0 and "baseline written: baselines/ladder.csv" in saved.err
        baseline = isolated / "baselines/ladder.csv"
        same = cli("ladder", "--compare", str(baseline), "--tolerance", "10")
        assert same.code == 0, same.err
        assert "no regression against" in same.err
        _edit(baseline, 8, verdict="pass")
        higher = cli("ladder", "--compare", str(baseline), "--json")
        again = cli("ladder", "--save-baseline")
    assert higher.code == 1
    assert "last passing batch_size is 4, lower than the baseline's 8" in higher.err
    assert "batch_size 8 passed in the baseline and now fails" in higher.err
    assert "✗" in higher.err  # the offending cells are marked in the side-by-side table
    assert higher.json["compare"]["passed"] is False and higher.json["passed"] is False
    assert again.code == 0 and "previous kept as" in again.err
    assert len(list((isolated / "baselines").glob("ladder.*.csv"))) == 1
    missing = cli("ladder", "--compare", "nope.csv")
    assert missing.code == 2 and "nope.csv" in missing.err


# Measuring flags wrong in their value, not their form. {same}: a table of the stage's own kind,
# {other}: the other kind's, {empty}: a header without rows, {binary}: not text at all.
MISTAKES = {
    "slo that is not NAME:SECONDS": ["--slo", "garbage"],
    "slo of no seconds": ["--slo", "ttft:abc"],
    "compare: no rows": ["--compare", "{empty}"],
    "compare: not text": ["--compare", "{binary}"],
    "compare: the other kind's table": ["--compare", "{other}"],
    "tolerance below 0": ["--compare", "{same}", "--tolerance", "-0.1"],
    "tolerance nan": ["--compare", "{same}", "--tolerance", "nan"],
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_wrong_measuring_flag_is_exit_2_before_anything_is_sent(
    cli: Any, isolated: Path, mistake: str
) -> None:
    """Each is said before the first request, never at the end of a ladder or sweep that ran
    for minutes (the --slo and --compare tables were once read only after the last tier)."""
    tables = {
        "ladder": isolated / "ladder.csv",
        "sweep": isolated / "sweep.csv",
        "empty": isolated / "empty.csv",
        "binary": isolated / "binary.csv",
    }
    tables["ladder"].write_text("batch_size,per_item_s,verdict\n1,0.1,pass\n", "utf-8")
    tables["sweep"].write_text("concurrency,items_per_s,verdict\n1,4.0,pass\n", "utf-8")
    tables["empty"].write_text("batch_size,per_item_s,verdict\n", "utf-8")
    tables["binary"].write_bytes(b"\xff\xfe\x00garbage\n")
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as server:
        open_gate(isolated, server.base_url)
        before = sorted((isolated / "runs").iterdir())
        ledger = (isolated / "runs" / "ledger.jsonl").read_bytes()
        for stage, other in (("ladder", "sweep"), ("sweep", "ladder")):
            names = {k: str(v) for k, v in tables.items()} | {
                "same": str(tables[stage]),
                "other": str(tables[other]),
            }
            result = cli(stage, *(w.format(**names) for w in MISTAKES[mistake]))
            assert result.code == 2, (stage, result.err)
            assert result.err.startswith("error: ") and "Traceback" not in result.err, result.err
        sent = server.model.snapshot().requests_total
    assert sent == 0, f"{sent} request(s) sent before the mistake was said"
    assert sorted((isolated / "runs").iterdir()) == before, "no run folder for a rejected input"
    assert (isolated / "runs" / "ledger.jsonl").read_bytes() == ledger, "nothing recorded"


def test_a_sweep_is_compared_level_for_level_never_across_load_modes(cli, isolated: Path) -> None:
    """A rate sweep's rows all sit at a few in-flight counts: compared by concurrency with a
    concurrency sweep's table, ``--rates 10,20 --compare`` read "regression: concurrency 4:
    items_per_s 20.01 is 46 % lower than the baseline's 36.8" — 20 req/s offered against 4 in
    flight, two configurations — and failed the sweep; and two rates at one count kept only
    the last. Levels are matched as ``report A B`` matches them (concurrency, offered rate,
    auto step), and tables of two load modes are not compared, said so."""
    sweep = "[sweep]\nlevel_s = 0.2\nrepeats = 1\n"
    with start_mock(ttft_s=0.01, per_token_s=0.002, slots=4) as mock:
        open_gate(isolated, mock.base_url, sweep, stage="ladder")
        saved = cli(
            "sweep", "--concurrency", "1,2,4", "--save-baseline", "--conservative", "--json"
        )
        assert_kept_or_client_bound(saved, "C ≥ ")
        baseline = str(isolated / "baselines/sweep.csv")
        # constant arrivals: how a rate is judged is not this test's (a Poisson level 5 %
        # under capacity may read unsure on a busy box, and the sweep then ends inconclusive)
        at = ("--rates", "10,20", "--arrival", "constant")
        rates = cli("sweep", *at, "--compare", baseline, "--json")
        rated = cli("sweep", *at, "--save-baseline", "--json")
        same = cli("sweep", *at, "--compare", baseline, "--tolerance", "10", "--json")
    assert "regression" not in rates.err, rates.err  # not compared is no regression
    assert f"not compared with {baseline}: " in rates.err, rates.err
    assert rates.code == 1 and rates.json["compare"]["passed"] is False
    assert rates.json["compare"]["problems"] == []
    why = rates.json["compare"]["not_compared"]
    assert "keyed by concurrency" in why and "offered_rate" in why
    # the comparison is the subject: a loaded machine may end a sweep "the client was the limit"
    assert_kept_or_client_bound(rated, "rate ≥ ", rates=True)
    assert_kept_or_client_bound(same, "rate ≥ ", rates=True)
    lines = [line.split() for line in same.err.splitlines()]
    assert [row[0] for row in lines if row[:1] in (["10"], ["20"])][-2:] == ["10", "20"], same.err
