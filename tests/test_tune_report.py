"""Tune within the ladder's proven load, each candidate's own cap, and ``calibrate report``
of a tune run (issue 26)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from calibrate.io.tier_table.tune import TuneRow
from calibrate.report.tune_report import plot_svg
from tests.report_helpers import table_lines
from tests.tune_helpers import MOCK, tune_config

# the demo's engine: the cap is {batch_size}, and more than 6 requests at once run out of memory
OOM_COMMAND = shlex.join(MOCK) + " --port {port} --slots {batch_size} --oom-at 6"
# the cap is the user's own {slots}: calibrate never passes a cap to this command
SLOTS_COMMAND = shlex.join(MOCK) + " --port {port} --slots {slots} --seed {seed}"
# a server that drifts: every answer after the first {batch_size} is 4× slower, so each
# candidate's second run is far slower than its first — batch 12 stays fast a run longer and
# ranks first, and the runs are too wide to say batch 6 could not be 10 % better
DRIFTING = (
    shlex.join(MOCK)
    + " --port {port} --slots {batch_size} --slow-after {batch_size} --slow-after-factor 4"
)
ONE_LEVEL = (
    "[sweep]\nconcurrency = [1]\nlevel_s = 0.1\nrepeats = 2\n"
    "[ladder]\nsample_interval_s = 0.02\nmin_round_s = 0\n"
)


def _ranked(err: str) -> list[dict[str, str]]:
    """The rows of the ranked table in stderr, by column name."""
    lines = table_lines(err)
    header = re.split(r"\s{2,}", lines[0].strip())
    return [dict(zip(header, re.split(r"\s{2,}", row.strip()), strict=True)) for row in lines[1:]]


def _tune_run(isolated: Path) -> Path:
    return next((isolated / "runs").glob("*-tune-*"))


def test_candidates_are_measured_within_the_ladders_load_at_their_own_cap(
    cli, isolated: Path
) -> None:
    tune_config(
        isolated,
        'grid = ["batch_size=1,2,4"]\nconcurrency = [1, 2, 4, 8]\n',
        command=OOM_COMMAND,
    )
    result = cli("tune", "--json")
    assert result.code == 0, result.err
    err = " ".join(result.err.split())
    assert (
        "concurrency 8 skipped: the ladder passed with at most 4 requests in flight, and tune "
        "measures every candidate within that load (levels 1, 2, 4)" in err
    )
    rows = [json.loads(x) for x in (_tune_run(isolated) / "tiers.jsonl").read_text().splitlines()]
    assert sorted(r["cap"] for r in rows) == [1, 2, 4]  # each candidate's own cap
    assert all(r["errors"] == 0 and r["incidents"] == 0 for r in rows), rows
    assert all(r["best_concurrency"] <= 4 for r in rows)
    ranked = _ranked(result.err)
    assert len(ranked) == 3
    for row in ranked:
        assert row["cap"] == row["flags"].removeprefix("batch_size=")
    summary = json.loads((_tune_run(isolated) / "summary.json").read_text())["summary"]
    assert summary["levels"] == [1, 2, 4] and summary["skipped_levels"] == [8]


def test_report_renders_a_tune_run_and_a_command_that_caps_itself_shows_no_cap(
    cli, isolated: Path
) -> None:
    tune_config(isolated, 'grid = ["slots=1,4"]\n', command=SLOTS_COMMAND)
    # {seed} is no axis: the value server start --set kept fills it for every candidate
    started = cli("server", "start", "--set", "slots=2", "--set", "seed=3")
    assert started.code == 0, started.err
    tuned = cli("tune", "--json")
    assert tuned.code == 0, tuned.err
    # each candidate's server command: in runs/server.log (a log says one line per candidate)
    log = (isolated / "runs" / "server.log").read_text("utf-8").splitlines()
    starts = [line for line in log if line.startswith("=== ") and " start: " in line][1:]
    said = tuned.err.splitlines()
    assert not [ln for ln in said if ln.startswith("starting: ") or "restart and measure" in ln]
    assert len([ln for ln in said if ln.startswith(("c01 (", "c02 ("))]) == 2  # one per candidate
    assert len(starts) == 2 and all("--seed 3" in line for line in starts)
    assert any("--slots 1 --seed 3" in line for line in starts)
    assert [row["cap"] for row in _ranked(tuned.err)] == ["—", "—"]  # calibrate sets no cap here
    run = _tune_run(isolated)
    shown = cli("report", run.name, "--html", "--json")
    assert shown.code == 0, shown.err
    assert "rerun" not in shown.err.lower()
    winner = tuned.json["winner"]
    assert (
        shown.json["kind"] == "tune"
        and shown.json["winner"] == tuned.json["candidates"][0]["id"] == "c02"
    )
    assert "winner: c02 (slots=4)" in shown.err and "over the runner-up c01 (slots=1)" in shown.err
    assert winner["flags"] == {"slots": "4"}
    assert [row["id"] for row in _ranked(shown.err)] == ["c02", "c01"]
    html = (run / "report.html").read_text("utf-8")
    assert html.index("winner: c02") < html.index("<table")
    assert "data:image/svg+xml;base64," in html
    # a tune run has no tiers to draw or compare
    timeline = cli("report", run.name, "--timeline", "4")
    assert timeline.code == 2 and "--timeline is for ladder and sweep runs" in timeline.err
    # a damaged table is exit 2 naming the file, never a traceback
    (run / "tiers.jsonl").write_text('{"rank": 1}\n', "utf-8")
    damaged = cli("report", run.name)
    assert damaged.code == 2 and "tiers.jsonl:1 is not a tune table row" in damaged.err
    (run / "tiers.jsonl").unlink()
    gone = cli("report", run.name)
    assert gone.code == 2 and "no finished candidate" in gone.err


def test_the_report_status_and_pin_name_the_winner_the_tune_recorded_and_how_sure_it_was(
    cli, isolated: Path
) -> None:
    """A tune its noise left inconclusive (exit 1, no winner) read back as "winner: c02 …", and
    one whose --conservative took the second-ranked c01 as "winner: c02 …, -41% over the
    runner-up c01" — the first row, not what the tune recorded and pin takes (SPEC §5.14).

    And the winner --conservative took set the calibrated setting, and status and the pinned
    script said nothing of how sure it was — a ladder or a sweep taken so says "taken under
    noise" in both. (One pair of tunes for both: the second test ran the same tune again.)"""
    tune_config(
        isolated, 'grid = ["batch_size=6,12"]\n', command=DRIFTING, batch=16, levels=ONE_LEVEL
    )
    unsure = cli("tune", "--json")
    assert unsure.code == 1 and unsure.json["winner"] is None, unsure.err
    shown = cli("report", unsure.json["run_id"], "--json", "--html")
    assert shown.code == 0, shown.err
    assert shown.json["winner"] is None
    assert shown.json["inconclusive"].startswith("inconclusive: the runs cannot tell")
    assert "winner:" not in shown.err
    assert "tune inconclusive: the runs cannot tell" in " ".join(shown.err.split())
    html = (isolated / "runs" / unsure.json["run_id"] / "report.html").read_text("utf-8")
    assert "winner:" not in html and "tune inconclusive" in html
    taken = cli("tune", "--conservative", "--new", "--json")
    assert taken.code == 0, taken.err
    won, first = taken.json["winner"]["id"], taken.json["candidates"][0]["id"]
    shown = cli("report", taken.json["run_id"], "--json")
    assert shown.code == 0, shown.err
    assert shown.json["winner"] == won
    said = " ".join(shown.err.split())
    assert f"winner: {won} (" in said
    if won != first:  # the smaller cap, taken under noise: its margin is over the first
        assert f"over the runner-up {first} (" in said
    ledger = [json.loads(x) for x in (isolated / "runs/ledger.jsonl").read_text().splitlines()]
    assert ledger[-1]["summary"]["under_noise"]["taken_under_noise"] is True, taken.err
    won = taken.json["winner"]["id"]
    status = cli("status", "--json")
    assert status.code == 0, status.err
    line = next(x for x in status.json["why"] if x.startswith("tune: "))
    assert (
        line.startswith(f"tune: {won} (batch_size=")
        and "taken under noise (--conservative)" in line
    )
    assert "tune: " in status.err and "taken under noise" in " ".join(status.err.split())
    pinned = cli("pin")
    assert pinned.code == 0, pinned.err
    header = (isolated / "scripts/launch.sh").read_text("utf-8")
    assert f"# how sure: tune: {won} (batch_size=" in header, header


def test_the_report_says_which_budget_left_candidates_untested(cli, isolated: Path) -> None:
    """tune --restarts 1 said "--restarts spent: 1 candidate(s) left untested", and its report
    "1 candidate(s) left untested (--budget-s spent)" — a budget the run was never given."""
    tune_config(isolated, 'grid = ["slots=1,2"]\n', command=SLOTS_COMMAND.replace("{seed}", "1"))
    cut = cli("tune", "--restarts", "1", "--json")
    assert cut.code == 0 and len(cut.json["untested"]) == 1, cut.err
    assert "--restarts spent: 1 candidate(s) left untested" in cut.err
    shown = cli("report", cut.json["run_id"], "--json")
    assert shown.json["notes"] == ["1 candidate(s) left untested (--restarts spent)"]
    assert "--budget-s" not in shown.err


def test_the_report_says_when_the_winners_lead_had_no_interval(cli, isolated: Path) -> None:
    """With one run a level the tune said "+96% over the runner-up c01 (slots=1) (one run each:
    no interval; …)", and its report "+96% over the runner-up c01 (slots=1)" — read as a lead
    the runs had tested."""
    tune_config(isolated, 'grid = ["slots=1,2"]\n', command=SLOTS_COMMAND.replace("{seed}", "1"))
    tuned = cli("tune", "--json")
    assert tuned.code == 0 and tuned.json["winner"]["significant"] is None, tuned.err
    assert "one run each: no interval" in " ".join(tuned.err.split())
    shown = cli("report", tuned.json["run_id"], "--html")
    said = " ".join(shown.err.split())
    assert "over the runner-up c0" in said, said
    assert "(no interval: fewer than two runs on a side, so not tested)" in said
    html = (isolated / "runs" / tuned.json["run_id"] / "report.html").read_text("utf-8")
    assert "no interval: fewer than two runs on a side" in html


def test_the_report_of_a_tune_run_says_when_the_winners_lead_is_not_significant() -> None:
    from calibrate.report.tune_report import TuneView

    rows = (
        TuneRow(1, "c02", "slots=4", "measured", goodput_per_s=10.6, best_concurrency=4),
        TuneRow(2, "c01", "slots=2", "measured", goodput_per_s=10.0, best_concurrency=2),
    )
    winner = {"flags": {"slots": "4"}, "batch_size": 4, "concurrency": 4}
    noisy = {"winner": winner, "margin": 0.06, "significant": False, "confidence": 0.95}
    clear = {**noisy, "significant": True}
    assert (
        TuneView(Path("."), rows, noisy, True)
        .headline()
        .endswith(
            "+6% over the runner-up c01 (slots=2), not significant at 95 % (the intervals overlap)"
        )
    )
    assert TuneView(Path("."), rows, clear, True).headline().endswith("c01 (slots=2)")
    # a sure lead the budget left no room to measure again in the other order: no claim, and why
    # (it read "no interval: fewer than two runs on a side" — three runs a side were there)
    unchecked = {**noisy, "significant": None, "unchecked": "--restarts spent"}
    assert (
        TuneView(Path("."), rows, unchecked, True)
        .headline()
        .endswith(
            "c01 (slots=2) (not measured again in the other order: --restarts spent, "
            "so not a claim)"
        )
    )


def test_plot_svg_is_a_bar_per_candidate_drawn_by_the_one_svg_plotter() -> None:
    """plot.svg (an image of its own, so with its namespace): bars in proportion to goodput,
    the winner first; a candidate that did not start has no bar, and says why; text escaped."""
    rows = [
        TuneRow(1, "c01", "--max-num-seqs 8", "measured", goodput_per_s=10.0, best_concurrency=8),
        TuneRow(2, "c02", "<b>x</b>", "measured", goodput_per_s=5.0, best_concurrency=4),
        TuneRow(3, "c03", "y", "did not start"),
        TuneRow(4, "c04", "z", "damaged", goodput_per_s=float("inf")),
    ]
    svg = plot_svg(rows, "tune <run>")
    assert svg.startswith('<svg class="chart" xmlns="http://www.w3.org/2000/svg"')
    widths = [float(w) for w in re.findall(r'<rect class="bar"[^>]* width="([0-9.]+)"', svg)]
    assert widths == [420.0, 210.0, 0.0, 0.0]
    assert "did not start" in svg and "10.00/s at c=8" in svg
    assert "&lt;b&gt;x&lt;/b&gt;" in svg and "<b>" not in svg and "tune &lt;run&gt;" in svg
