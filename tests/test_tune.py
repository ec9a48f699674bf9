"""calibrate tune against the mock as a managed custom engine: the best candidate, the memory
step, a candidate that does not start, pin of every tuned flag, the budget and resume."""

from __future__ import annotations

import json
import re
from pathlib import Path

from calibrate.server import pids, process
from tests.tune_helpers import SERVER_BOUND, tune_config
from tests.tune_helpers import lines as jsonl

GRID = 'grid = ["slots=1,2,4", "kv_tokens=50000"]\nmemory_fractions = [0.9, 0.8]\n'


def test_finds_the_best_candidate_after_the_memory_step_and_pins_every_flag(
    cli, isolated: Path
) -> None:
    target = tune_config(isolated, GRID, command=SERVER_BOUND)
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
    # then the grid, every candidate at 0.8; four slots win, the throughput ordered by slots
    ranked = out["candidates"]
    assert [c["flags"]["slots"] for c in ranked] == ["4", "2", "1"]
    assert all(c["flags"]["memory_fraction"] == "0.8" and c["started"] for c in ranked)
    assert ranked[0]["goodput_per_s"] > 1.5 * ranked[1]["goodput_per_s"]
    assert ranked[1]["goodput_per_s"] > 1.5 * ranked[2]["goodput_per_s"]
    # one slot: a second request in flight gains only the client's own gap between requests
    # (a few ms against ~100 ms answers; more on a busy machine), never a second slot's worth
    assert ranked[0]["best_concurrency"] == 4 and ranked[2]["best_concurrency"] <= 2
    assert ranked[0]["latency"]["p50_s"] > 0 and ranked[0]["peak_vram_mib"] is not None
    winner = out["winner"]
    assert winner["flags"] == {"slots": "4", "kv_tokens": "50000", "memory_fraction": "0.8"}
    assert winner["batch_size"] == 4 and winner["concurrency"] == 4 and winner["margin"] > 0.5
    assert "winner: c03 (slots=4, kv_tokens=50000, memory_fraction=0.8)" in result.err
    assert "over the runner-up c02" in result.err
    run = isolated / "runs" / out["run_id"]
    assert len(jsonl(run / "candidates.jsonl")) == 3
    assert (run / "tiers.csv").read_text("utf-8").startswith("rank,id,flags,status")
    assert "<svg" in (run / "plot.svg").read_text("utf-8")
    assert process.load(isolated / "runs") is None, "no server is left running"
    ledger = jsonl(isolated / "runs/ledger.jsonl")[-1]
    assert ledger["stage"] == "tune" and ledger["passed"] and ledger["target"] == target
    # pin writes every flag of the winner, and says which tune run chose them
    pin = cli("pin", "--json")
    assert pin.code == 0, pin.err
    script = (isolated / "scripts/launch.sh").read_text("utf-8")
    assert "--slots 4 --kv-capacity-tokens 50000" in script
    assert "--memory-fraction 0.8" in script
    assert f"# engine flags tuned by tune run {out['run_id']}: slots=4" in script
    assert "export BATCH_SIZE=4" in script and "export MAX_CONCURRENCY=4" in script
    status = cli("status", "--json")
    assert status.json["tuned"]["run_id"] == out["run_id"]
    assert "tuned engine flags: slots=4, kv_tokens=50000" in status.err
    started = cli("server", "start", "--script", str(isolated / "scripts/launch.sh"), "--json")
    try:
        assert started.code == 0, started.err
        assert "--slots 4 --kv-capacity-tokens 50000" in pids.cmdline(started.json["pid"])
    finally:
        assert cli("server", "stop").code == 0


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
    tune_config(isolated, 'grid = ["slots=1,2", "kv_tokens=50000", "memory_fraction=0.8"]\n')
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
    assert [c["flags"]["slots"] for c in again.json["candidates"]] == ["2", "1"]
    run = isolated / "runs" / cut.json["run_id"]
    assert [line["id"] for line in jsonl(run / "candidates.jsonl")] == ["c01", "c02"]
    third = cli("tune", "--json")  # finished: the same grid starts a new run
    assert third.code == 0 and third.json["run_id"] != cut.json["run_id"]
    assert "resuming" not in third.err


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
    assert not list((isolated / "runs").glob("*-tune-*")), "nothing written"


def test_halving_measures_the_better_half_again_at_a_longer_window(cli, isolated: Path) -> None:
    tune_config(isolated, 'grid = ["slots=1,2,4", "kv_tokens=50000", "memory_fraction=0.8"]\n')
    result = cli("tune", "--search", "halving", "--json")
    assert result.code == 0, result.err
    run = isolated / "runs" / result.json["run_id"]
    done = [
        (line["rung"], line["flags"]["slots"], line["window"])
        for line in jsonl(run / "candidates.jsonl")
    ]
    assert done[:3] == [(0, "1", 0.5), (0, "2", 0.5), (0, "4", 0.5)]
    assert sorted(done[3:]) == [(1, "2", 1.0), (1, "4", 1.0)]
    assert result.json["winner"]["flags"]["slots"] == "4"
    assert re.search(r"halving rung 1: c0[23], c0[23] at 1× the window", result.err)
