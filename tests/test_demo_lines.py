"""How long a stage's log is (``make demo`` prints every stage): a line per tier, candidate or
stage, not a line and a table row for each, nor a row per stage never run."""

from __future__ import annotations

from pathlib import Path

from tests.mockserver import start_mock
from tests.report_helpers import table_lines
from tests.test_tables import FOUR, MOCK
from tests.tier_helpers import open_gate

# VRAM source, plan, the table (header, rule, 4 tiers), tables:, the queue warning, the setting,
# the incidents, next; two more for a warning a busy CI box may add (calibrate the bottleneck).
LADDER_LINES = 13 + 2


def test_a_ladder_of_four_tiers_logs_each_tier_once_in_a_short_log(cli, isolated: Path) -> None:
    with start_mock(**MOCK) as mock:
        open_gate(isolated, mock.base_url, FOUR)
        result = cli("ladder", "--json")
    assert result.code == 0, result.err
    lines = result.err.splitlines()
    assert len(lines) <= LADDER_LINES, result.err
    header, _, *rows = table_lines(result.err)
    assert "items/s" in header and [r.split()[0] for r in rows] == ["1", "2", "4", "8"]
    assert sum("batch 4" in ln for ln in lines) == 1, result.err  # the setting, said once
    assert not [ln for ln in lines if ln.startswith(("batch 1:", "batch 8:"))]
    # "last passing tier: batch 8" has a line of its own only when it is not the setting (the
    # mock's OOM above 6 in flight needs 7 requests at once, which a busy box may not send)
    passing = [ln for ln in lines if ln.startswith("last passing")]
    assert not passing or passing == [
        "last passing tier: batch 8, concurrency 8 (every tier passed)"
    ], result.err


def test_status_says_the_stages_not_run_in_one_line(cli, isolated: Path) -> None:
    (isolated / "calibrate.toml").write_text(
        '[target]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n', "utf-8"
    )
    result = cli("status")
    assert result.code == 0, result.err
    lines = result.err.splitlines()
    assert len(lines) == 4, result.err  # target, baseline, the stages not run, next
    assert (
        lines[2]
        == "  not run yet: single, repro, ladder, sweep, pin, verify, tune, rollback, batch"
    )
