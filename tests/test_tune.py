"""calibrate tune end to end against the mock as a managed custom engine: the memory step, a
candidate that does not start, pin of every tuned flag, the budget and resume, halving's rungs.
Which candidate wins and by how much is judged on the simulated server, a virtual clock
(tests/stages/tune/test_sim_tune.py): here no claim compares measured rates."""

from __future__ import annotations

import json
import re
from pathlib import Path

from calibrate.server import pids, process
from tests.tune_helpers import LEVELS, tune_config
from tests.tune_helpers import lines as jsonl

GRID = 'grid = ["slots=2,4", "kv_tokens=50000"]\nmemory_fractions = [0.9, 0.8]\n'
# one level a candidate: what is checked here is the CLI's, not how candidates compare
ONE_LEVEL = LEVELS.replace("[1, 2, 4]", "[1]")


def test_the_memory_step_then_the_winner_is_recorded_and_pinned_with_every_flag(
    cli, isolated: Path
) -> None:
    """The CLI end to end: the memory step on real server processes (0.9 dies like an OOM at
    load, its log's words kept), the grid at 0.8, the files, the ledger, and pin, status and
    ``server start`` taking every flag of whichever candidate won. Which one wins, at what
    concurrency and by how much (the ratios) is tests/stages/tune/test_sim_tune.py's
    test_the_memory_step_then_every_candidate_ranked_by_its_slots (a virtual clock)."""
    target = tune_config(isolated, GRID, levels=ONE_LEVEL)
    result = cli("tune", "--json")
    assert result.code == 0, result.err
    out = result.json
    # memory first: 0.9 does not fit (the mock dies like an OOM at load), 0.8 starts and serves
    memory = out["memory"]
    assert memory["key"] == "memory_fraction" and memory["fixed"] == "0.8"
    first, second = memory["probes"]
    assert first["fraction"] == "0.9" and first["started"] is False and first["exit_code"] == 1
    assert any("CUDA out of memory" in line for line in first["log_tail"])
    assert second == {**second, "fraction": "0.8", "started": True, "served": True}
    ranked = out["candidates"]
    assert sorted(c["flags"]["slots"] for c in ranked) == ["2", "4"]
    assert all(c["flags"]["memory_fraction"] == "0.8" and c["started"] for c in ranked)
    assert ranked[0]["goodput_per_s"] > 0 and ranked[0]["best_concurrency"] == 1
    assert ranked[0]["latency"]["p50_s"] > 0
    _peak_read_or_said_unread(ranked[0], result.err)
    winner = out["winner"]
    slots = winner["flags"]["slots"]
    assert winner["flags"] == {"slots": slots, "kv_tokens": "50000", "memory_fraction": "0.8"}
    assert winner["batch_size"] == 4 and winner["concurrency"] == 1
    won, other = (ranked[0]["id"], ranked[1]["id"])
    assert f"winner: {won} (slots={slots}, kv_tokens=50000, memory_fraction=0.8)" in result.err
    assert f"over the runner-up {other}" in result.err
    run = isolated / "runs" / out["run_id"]
    assert len(jsonl(run / "candidates.jsonl")) == 2
    assert (run / "tiers.csv").read_text("utf-8").startswith("rank,id,flags,status")
    assert "<svg" in (run / "plot.svg").read_text("utf-8")
    assert process.load(isolated / "runs") is None, "no server is left running"
    ledger = jsonl(isolated / "runs/ledger.jsonl")[-1]
    assert ledger["stage"] == "tune" and ledger["passed"] and ledger["target"] == target
    # pin writes every flag of the winner, and says which tune run chose them
    pin = cli("pin", "--json")
    assert pin.code == 0, pin.err
    script = (isolated / "scripts/launch.sh").read_text("utf-8")
    assert f"--slots {slots} --kv-capacity-tokens 50000" in script
    assert "--memory-fraction 0.8" in script
    assert f"# engine flags tuned by tune run {out['run_id']}: slots={slots}" in script
    assert "export BATCH_SIZE=4" in script and "export MAX_CONCURRENCY=1" in script
    status = cli("status", "--json")
    assert status.json["tuned"]["run_id"] == out["run_id"]
    assert f"tuned engine flags: slots={slots}, kv_tokens=50000" in status.err
    started = cli("server", "start", "--script", str(isolated / "scripts/launch.sh"), "--json")
    try:
        assert started.code == 0, started.err
        assert f"--slots {slots} --kv-capacity-tokens 50000" in pids.cmdline(started.json["pid"])
    finally:
        assert cli("server", "stop").code == 0


def _peak_read_or_said_unread(candidate: dict[str, object], err: str) -> None:
    """The candidate's peak memory as read while it ran — or, where the sampler took no reading
    inside a run (a busy machine starves its thread), null and said so: never a number made up
    from the idle reading before the run or the one after it."""
    if candidate["peak_vram_mib"] is not None:
        return
    said = " ".join(err.split())
    assert f"{candidate['id']}: memory not read while it ran (the metrics sampler" in said, err


def test_a_candidate_whose_memory_was_never_read_says_so(cli, isolated: Path) -> None:
    """Samples 30 s apart, runs of a tenth of a second: the sampler reads nothing while a run
    is in flight. The peak was a bare null (a busy machine's starved sampler did the same to
    the test above); now the candidate's line says its memory was not read, and why."""
    levels = ONE_LEVEL.replace("sample_interval_s = 0.02", "sample_interval_s = 30")
    tune_config(
        isolated, 'grid = ["slots=2", "kv_tokens=50000", "memory_fraction=0.8"]\n', levels=levels
    )
    result = cli("tune", "--json")
    assert result.code == 0, result.err
    (only,) = result.json["candidates"]
    assert only["peak_vram_mib"] is None and only["vram_source"] == "metrics"
    assert "c01: memory not read while it ran" in " ".join(result.err.split())
    _peak_read_or_said_unread(only, result.err)


def test_a_candidate_that_does_not_start_is_recorded_and_tune_moves_on(cli, isolated: Path) -> None:
    tune_config(isolated, 'grid = ["slots=2", "kv_tokens=50000", "memory_fraction=0.9,0.7"]\n')
    result = cli("tune", "--json")
    assert result.code == 0, result.err
    out = result.json
    assert out["memory"]["key"] is None, "the grid itself tries fractions: no memory step"
    dead = next(c for c in out["candidates"] if c["flags"]["memory_fraction"] == "0.9")
    assert dead["started"] is False and dead["status"] == "did not start"
    assert dead["start_exit_code"] == 1 and dead["goodput_per_s"] is None
    assert any("CUDA out of memory" in line for line in dead["log_tail"])
    assert "did not start (exit code 1)" in result.err
    assert out["winner"]["flags"]["memory_fraction"] == "0.7"
    assert [c["rank"] for c in out["candidates"]] == [1, 2] and out["candidates"][1] == {
        **out["candidates"][1],
        "id": dead["id"],
    }
    run = isolated / "runs" / out["run_id"]
    (bundle,) = (run / "candidates").glob("*memory_fraction0.9/incidents/server.json")
    incident = json.loads(bundle.read_text("utf-8"))
    assert incident["error"]["kind"] == "oom" and incident["server"]["exit_code"] == 1


def test_budget_leaves_candidates_untested_and_a_rerun_resumes_them(cli, isolated: Path) -> None:
    """What the CLI says and records of a budget and a resumed run; which candidates a budget
    leaves on tune's clock is test_sim_tune.py's test_a_budget_leaves_candidates_untested_…"""
    grid = 'grid = ["slots=1,2", "kv_tokens=50000", "memory_fraction=0.8"]\n'
    tune_config(isolated, grid, levels=ONE_LEVEL)
    cut = cli("tune", "--budget-s", "0.3", "--json")  # checked before each start: one fits
    assert cut.code == 0, cut.err
    assert [c["id"] for c in cut.json["untested"]] == ["c02"] and cut.json["complete"] is False
    assert "1 candidate(s) left untested: c02" in cut.err
    assert jsonl(isolated / "runs/ledger.jsonl")[-1]["summary"]["complete"] is False
    again = cli("tune", "--json")
    assert again.code == 0, again.err
    assert (
        f"resuming tune run {cut.json['run_id']}: 1 of 2 candidates already measured" in again.err
    )
    assert again.json["run_id"] == cut.json["run_id"] and again.json["complete"] is True
    assert sorted(c["flags"]["slots"] for c in again.json["candidates"]) == ["1", "2"]
    run = isolated / "runs" / cut.json["run_id"]
    assert [line["id"] for line in jsonl(run / "candidates.jsonl")] == ["c01", "c02"]
    third = cli("tune", "--budget-s", "0.3", "--json")  # finished: the same grid starts anew
    assert third.code == 0 and third.json["run_id"] != cut.json["run_id"]
    assert "resuming" not in third.err and third.json["complete"] is False
    # [server] env is what every candidate runs with: a cut run resumed with other values mixed
    # candidates measured under both and pin wrote the new ones beside the old winner; so are the
    # runs a level may take, the interval it is judged on and the requests' deadline: a cut run
    # resumed under others mixed candidates judged by two rules. Each change meets the run its
    # budget cut just before (third, then each changed run, cut the same way for the next)
    toml = isolated / "calibrate.toml"
    cut_before = third
    changes = (
        ("[server]", 'env = { A = "1" }'),
        ("[sweep]", "max_repeats = 2"),
        ("[confidence]", "level = 0.9"),
    )
    for section, line in changes:
        text = toml.read_text("utf-8")
        text = text.replace(section, f"{section}\n{line}", 1) if section in text else text
        toml.write_text(text if line in text else f"{text}\n{section}\n{line}\n")
        changed = cli("tune", "--budget-s", "0.3", "--json")
        assert changed.code == 0 and "resuming" not in changed.err, (section, changed.err)
        assert changed.json["run_id"] != cut_before.json["run_id"]
        assert changed.json["complete"] is False, (section, changed.err)
        cut_before = changed


def test_needs_a_managed_server_and_a_passing_ladder(cli, isolated: Path) -> None:
    (isolated / "calibrate.toml").write_text(
        '[target]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n', "utf-8"
    )
    gated = cli("tune")
    assert gated.code == 3 and "calibrate ladder" in gated.err
    forced = cli("tune", "--force")
    assert forced.code == 2 and "[server]" in forced.err and "kind" in forced.err
    tune_config(isolated, 'grid = ["nope=1,2"]\n')
    bad = cli("tune")
    assert bad.code == 2 and "no {nope} placeholder" in bad.err and "slots" in bad.err
    # the target elsewhere than the port tune starts its candidates on: each would be measured
    # on that other server (a winner drawn from one server's noise); exit 2, nothing started
    config = isolated / "calibrate.toml"
    config.write_text(
        re.sub(r"(base_url = \"http://127\.0\.0\.1:)\d+", r"\g<1>9", config.read_text())
    )
    elsewhere = cli("tune")
    assert elsewhere.code == 2, elsewhere.err
    said = " ".join(elsewhere.err.split())
    assert "but the target is http://127.0.0.1:9/v1: its measurements would not be of" in said
    assert not (isolated / "runs/server.json").exists()
    assert not list((isolated / "runs").glob("*-tune-*")), "nothing written"


def test_halving_measures_the_better_half_again_and_its_table_says_each_rows_window(
    cli, isolated: Path
) -> None:
    """``--search halving`` through the CLI: three candidates at half the window, two of them
    again at the full window, each line in candidates.jsonl and the rung said. That the two are
    the better half, and the winner, is test_sim_tune.py's test_halving_measures_…

    Before, the halving's table ranked c02, c03 (measured over the full window) above c01
    (over half of it) with no window column: rows of two windows read as equals. Now the table,
    on the terminal and in ``report``'s text, JSON and HTML, gives each row's window and says
    that a longer window ranks first whatever the figures. (One tune for both: each ran its own,
    five engine starts apiece.)"""
    grid = 'grid = ["slots=1,2,4", "kv_tokens=50000", "memory_fraction=0.8"]\n'
    tune_config(isolated, grid, levels=ONE_LEVEL)
    result = cli("tune", "--search", "halving", "--json")
    assert result.code == 0, result.err
    run = isolated / "runs" / result.json["run_id"]
    done = [
        (line["rung"], line["flags"]["slots"], line["window"])
        for line in jsonl(run / "candidates.jsonl")
    ]
    assert done[:3] == [(0, "1", 0.5), (0, "2", 0.5), (0, "4", 0.5)]
    again = [(rung, window) for rung, _, window in done[3:]]
    assert again == [(1, 1.0), (1, 1.0)] and len({slots for _, slots, _ in done[3:]}) == 2
    assert result.json["winner"]["flags"]["slots"] in {slots for _, slots, _ in done[3:]}
    assert re.search(r"halving rung 1: c0[123], c0[123] at 1× the window", result.err)
    # the table: each row's window, the longer first
    header = next(line for line in result.err.splitlines() if line.startswith("rank"))
    assert header.split()[:3] == ["rank", "window", "id"], header
    rows = [line.split() for line in result.err.splitlines() if re.match(r" +\d+ ", line)]
    assert [row[1] for row in rows] == ["1×", "1×", "0.5×"], rows
    said = " ".join(result.err.split())
    dropped = next(row[2] for row in rows if row[1] == "0.5×")
    assert f"windows differ: {dropped} over 0.5×; " in said
    assert "a longer window (a later halving rung) ranks first whatever the figures" in said
    report = cli("report", str(run), "--json", "--html")
    assert report.code == 0, report.err
    assert [r["window"] for r in report.json["rows"]] == [1.0, 1.0, 0.5]
    assert report.json["windows"].startswith(f"windows differ: {dropped} over 0.5×; ")
    assert "window" in report.err.splitlines()[1] and "windows differ" in report.err
    page = Path(report.json["html"]).read_text("utf-8")
    assert "<th>window</th>" in page.replace(' class="num"', "") and 'id="windows"' in page
    assert "window" in (run / "tiers.csv").read_text("utf-8").splitlines()[0].split(",")
