"""How long a stage's log is (``make demo`` prints every stage, under 120 lines): a line per tier,
candidate or stage, not a line and a table row for each, nor a row per stage never run; a
table's header without a rule under it, one verdict line for a batch that went well."""

from __future__ import annotations

import re
from pathlib import Path

from tests.batch_helpers import write_tasks
from tests.helpers import write_config
from tests.mockserver import start_mock
from tests.report_helpers import TABLES_CONFIG, TABLES_MOCK, keyed_rows, table_lines
from tests.tier_helpers import open_gate

# VRAM source, plan, the table (header, 4 tiers), tables:, the queue warning, the setting, the
# machine's noise during it, the incidents, next; two more for a warning a busy CI box may add
# (calibrate the bottleneck).
LADDER_LINES = 13 + 2


def test_a_ladder_of_four_tiers_logs_each_tier_once_in_a_short_log(cli, isolated: Path) -> None:
    with start_mock(**TABLES_MOCK) as mock:
        open_gate(isolated, mock.base_url, TABLES_CONFIG)
        result = cli("ladder", "--json")
    assert result.code == 0, result.err
    # a tier run again to be told from another (a busy box) says so in a line of its own, and
    # so does one whose short answers a busy box's /metrics samples could not see run whole
    lines = [
        ln
        for ln in result.err.splitlines()
        if " again, round " not in ln and " at once is unknown " not in ln
    ]
    assert len(lines) <= LADDER_LINES, result.err
    assert "─" not in result.err  # no rule under the header in a log
    header = table_lines(result.err)[0]
    rows = keyed_rows(result.err, (1, 2, 4, 8))  # a note may come between two rows, as above
    assert "items/s" in header and [r.split()[0] for r in rows] == ["1", "2", "4", "8"], result.err
    # the setting, said once (batch 4, or batch 2 where 4 was within noise of it on a busy box)
    assert sum(ln.startswith("setting: batch ") for ln in lines) == 1, result.err
    assert not [ln for ln in lines if ln.startswith(("batch 1:", "batch 8:"))]
    # "last passing tier" has a line of its own only when it is not the setting: batch 4,
    # stopped by batch 8's OOM (the mock fails above 6 in flight), or batch 8 where a busy box
    # never had 7 of a wave in flight at once
    passing = [ln for ln in lines if ln.startswith("last passing")]
    assert len(passing) <= 1, result.err
    assert not passing or passing[0].startswith(
        (
            "last passing tier: batch 4, concurrency 4 (stopped by failure: batch 8:",
            "last passing tier: batch 8, concurrency 8 (every tier passed)",
        )
    ), result.err


def test_status_says_the_stages_not_run_in_one_line(cli, isolated: Path) -> None:
    (isolated / "calibrate.toml").write_text(
        '[target]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n', "utf-8"
    )
    result = cli("status")
    assert result.code == 0, result.err
    lines = result.err.splitlines()
    assert len(lines) == 3, result.err  # target and baseline, the stages not run, next
    assert lines[0].endswith("; baseline: none yet"), result.err
    assert (
        lines[1]
        == "  not run yet: single, repro, ladder, sweep, pin, verify, tune, rollback, batch"
    )


def test_status_names_the_baseline_on_the_target_line(cli, isolated: Path) -> None:
    (isolated / "calibrate.toml").write_text(
        '[target]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n', "utf-8"
    )
    (isolated / "baselines").mkdir()
    (isolated / "baselines" / "single.jsonl").write_text("{}\n", "utf-8")
    result = cli("status")
    assert result.code == 0, result.err
    first = result.err.splitlines()[0]
    assert first.startswith("target ") and first.endswith(
        ": m at http://127.0.0.1:9/v1; baseline: baselines/single.jsonl"
    ), result.err


def test_a_batch_that_went_well_says_so_in_one_line_and_a_rerun_in_three(
    cli, mock, isolated: Path
) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    tasks = write_tasks(isolated / "tasks.jsonl", 30)
    args = ("batch", "--input", str(tasks), "--out", "out.jsonl", "--final", "final.jsonl")
    first, again = cli(*args, "-c", "4"), cli(*args, "-c", "4")
    assert first.code == 0 and again.code == 0, first.err + again.err

    def said(err: str) -> list[str]:  # progress lines come as often as the clock says
        return [ln for ln in err.splitlines() if not ln.startswith("batch: ") or "total" in ln]

    plan, final, verdict = said(first.err)  # the counts, the rate and the file in one line
    assert plan.startswith("batch: 30 total, 0 already done, 30 to run (concurrency 4 from ")
    assert final.startswith("final: final.jsonl — 30 ids in input order: 30 ok, 0 failed")
    assert verdict.startswith("all 30 items ok: out.jsonl (30 run in ") and "items/s" in verdict
    plan, final, verdict = said(again.err)  # nothing run: no rate
    assert plan.startswith("batch: 30 total, 30 already done, 0 to run")
    assert verdict == "all 30 items ok: out.jsonl"


def test_a_tune_log_says_what_ranks_it_once_a_line_per_candidate_then_the_table(
    cli, isolated: Path
) -> None:
    import shlex

    from tests.tune_helpers import MOCK as ENGINE
    from tests.tune_helpers import tune_config

    command = shlex.join(ENGINE) + " --port {port} --slots {slots}"
    tune_config(isolated, 'grid = ["slots=1,2"]\n', command=command)
    result = cli("tune", "--json")
    assert result.code == 0, result.err
    lines = result.err.splitlines()
    assert lines[0].startswith("tune run ") and lines[0].endswith("; ranked by goodput (no SLOs)")
    assert sum("ranked by" in ln for ln in lines) == 1, result.err  # the table has no title
    assert [ln.split(":")[0] for ln in lines if re.match(r"c\d+ \(", ln)] == [
        "c01 (slots=1)",
        "c02 (slots=2)",
    ]
    front = [p for p in result.json["pareto"] if p["on_front"] or p["pinned"]]
    front_table = 1 + len(front) if len(front) > 1 else 0  # its header and rows
    ranked = table_lines(result.err.split("Pareto front:")[0])
    assert len(ranked) == 1 + 2 and "─" not in result.err
    # the start, the levels left out (none here), a line per candidate, the table, tables:,
    # the winner, what pin takes and why, next; the Pareto front's table (its title, header and
    # rows) only when more than one point is on it: c01 at concurrency 1 can give each user as
    # much as c02 at 2 (their tokens/s per user are that close on the mock)
    assert len(lines) <= 10 + (front_table + 1 if front_table else 0), result.err
    assert sum(ln.startswith("pin takes c02 (slots=2)") for ln in lines) == 1, result.err
