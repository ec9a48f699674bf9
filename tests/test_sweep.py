"""Stage C′ end to end against the real mock: the server's own cap, the gate, a failing level,
JUnit per level. Where the knee lands among levels the server serves alike or apart (a measured
ratio) is judged on the simulated server, a virtual clock (tests/stages/sweep/)."""

from __future__ import annotations

from pathlib import Path

from tests.mockserver import start_mock
from tests.tier_helpers import (
    FAST,
    assert_kept_or_client_bound,
    jsonl,
    junit_cases,
    open_gate,
    run_dir,
)

# short levels, two runs each: the windows of the defaults (15 s, 3 runs) are for users
LEVELS = "level_s = 0.1\nrepeats = 2\n"
SWEEP = FAST + f"[sweep]\nconcurrency = [1, 2, 4, 8]\n{LEVELS}"


def test_a_level_over_the_servers_cap_is_noted_and_never_the_knee(cli, isolated: Path) -> None:
    """The CLI end to end against a mock whose /props says 4 slots: the cap read and noted, 8
    (over it) measured but never the knee — so the knee is 2, the one level under the cap, as a
    rule, not a measured ratio — and the JSON, ledger, records, tables and JUnit that say so.
    The knee at the slot count with tight ranges is tests/stages/sweep/test_fast.py's
    test_the_knee_is_the_slot_count_with_tight_ranges; over the cap, test_verdicts.py's
    test_never_a_knee_above_the_cap_the_server_reported (a virtual clock)."""
    sweep = FAST + "[sweep]\nconcurrency = [2, 8]\nlevel_s = 0.05\nrepeats = 2\n"
    with start_mock(ttft_s=0.004, per_token_s=0.0005, slots=4, expose_props=True) as mock:
        open_gate(isolated, mock.base_url, sweep, stage="ladder")
        result = cli("sweep", "--json", "--junit", "sweep.xml", "--beyond-ladder")
    assert result.code == 0, result.err
    out = result.json
    assert out["recommended_concurrency"] == 2 and out["knee"]["concurrency"] == 2
    assert out["batch_size"] == 4  # the ladder's last passing tier
    assert [lv["concurrency"] for lv in out["levels"]] == [2, 8]
    assert out["server_cap"] == {"slots": 4, "source": "llama.cpp /props total_slots"}
    assert "concurrency 8 exceeds the server's own cap of 4" in result.err
    assert "recommended concurrency 2" in result.err
    ledger = jsonl(isolated / "runs/ledger.jsonl")[-1]
    assert ledger["stage"] == "sweep" and ledger["summary"]["recommended_concurrency"] == 2
    run = run_dir(isolated, out["run_id"])
    records = jsonl(run / "records.jsonl")
    for level in (2, 8):  # two runs a level, each ≥ 4×C requests
        runs = [r["round"] for r in records if r["concurrency"] == level]
        assert runs.count(1) >= 4 * level and runs.count(2) >= 4 * level
    assert all(lv["repeats"] >= 2 for lv in out["levels"])
    assert all(
        lv["items_per_s_min"] <= lv["items_per_s"] <= lv["items_per_s_max"] for lv in out["levels"]
    )
    assert out["knee"]["how_sure"].startswith("knee at 2; the best is the last level tried: 8")
    assert out["knee"]["how_sure"].endswith("— sure"), "the cap rules more in flight out"
    assert "how sure: knee at 2;" in result.err
    assert (run / "tiers.csv").read_text("utf-8").startswith("concurrency,batch_size,repeats,")
    suite, cases = junit_cases(isolated / "sweep.xml")
    assert [c.get("name") for c in cases] == [f"concurrency {c}" for c in (2, 8)]
    assert suite.get("failures") == "0"


def test_stops_at_the_first_failing_level(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.004, per_token_s=0.0005, slots=4, oom_at=6) as mock:
        open_gate(isolated, mock.base_url, SWEEP, stage="ladder")
        result = cli("sweep", "--json", "--beyond-ladder")
    assert result.code == 0, result.err
    out = result.json
    assert [lv["verdict"] for lv in out["levels"]] == ["pass", "pass", "pass", "fail"]
    # which level below the failing one is the knee is a measured ratio (2 read on a loaded
    # machine): test_fast.py's test_a_failing_run_ends_the_level_and_the_sweep judges it
    assert out["stopped_by"] == "failure" and out["recommended_concurrency"] in (1, 2, 4)
    # run 1's, or run 2's where a busy machine let run 1's early answers finish first
    incidents = list((run_dir(isolated, out["run_id"]) / "incidents").glob("c8-[12]-*.json"))
    assert len(incidents) == out["levels"][3]["errors"] > 0


def test_never_more_in_flight_than_the_ladder_proved_on_an_unmanaged_server(
    cli, isolated: Path
) -> None:
    """SPEC §5.0: the ladder passed 4 in flight; 8 and 16 would be load it never proved."""
    config = FAST + f"[sweep]\nconcurrency = [1, 2, 4, 8, 16]\n{LEVELS}"
    with start_mock(ttft_s=0.004, per_token_s=0.0005, slots=4) as mock:
        open_gate(isolated, mock.base_url, config, stage="ladder")
        result = cli("sweep", "--json")
    assert result.code == 0, result.err
    assert [lv["concurrency"] for lv in result.json["levels"]] == [1, 2, 4]
    assert result.json["levels_skipped"] == [8, 16] and result.json["beyond_ladder"] is False
    assert "concurrency 8, 16 skipped" in result.err and "--beyond-ladder" in result.err
    # the best at the top says why nothing above it was measured, not that more may help
    assert "may still rise above it" not in result.err
    if "the best is the last level tried" in result.err:
        assert "the last level tried: 8, 16 not sent, above what the ladder proved" in result.err
    records = jsonl(run_dir(isolated, result.json["run_id"]) / "records.jsonl")
    assert max(r["concurrency"] for r in records) == 4
    assert result.json["ladder_run_id"] == "test-ladder"


def test_gate_needs_a_passing_ladder(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        open_gate(isolated, mock.base_url, SWEEP, stage="repro")
        result = cli("sweep")
    assert result.code == 3 and "calibrate ladder" in result.err
    gone = cli("sweep", "--force", "--batch-size", "2")  # the mock is stopped now
    assert gone.code == 4 and "connection refused" in gone.err


def test_a_managed_server_is_restarted_at_cap_b_before_the_sweep(cli, isolated: Path) -> None:
    """SPEC §5.0: with the engine capped at B the extra requests queue in the server, so every
    level is safe; calibrate restarts the server it manages at B first."""
    import json

    from tests.fakes import free_port, managed_config, mock_command, passing_ladder

    port = free_port()
    extra = f"[sweep]\nconcurrency = [1, 2, 8]\n{LEVELS}{FAST}"
    managed_config(isolated, port, mock_command(), extra=extra)
    try:
        started = cli("server", "start", "--batch-size", "1", "--concurrency", "1", "--json")
        assert started.code == 0, started.err
        single = cli("single", "--json")
        assert single.code == 0, single.err
        passing_ladder(isolated, single.json["record"]["target"], batch_size=4)
        result = cli("sweep", "--json")
        record = json.loads((isolated / "runs/server.json").read_text("utf-8"))
    finally:
        cli("server", "stop")
    assert result.code == 0, result.err
    assert "restarting the managed server at cap 4" in result.err
    assert record["pid"] != started.json["pid"] and record["batch_size"] == 4
    assert [lv["concurrency"] for lv in result.json["levels"]] == [1, 2, 8], "nothing skipped"
    assert result.json["levels_skipped"] == []


def test_a_synthetic_workloads_levels_say_their_gain_and_the_knee(cli, isolated: Path) -> None:
    """SPEC §5.6 through the CLI: with a synthetic workload of forced 20-token answers, each
    level's gain_counted is in the JSON (the first level never counts), the knee is said and
    recorded. That over 1…16 on 4 slots the knee is 4, each level judged against the best so
    far, is tests/stages/sweep/test_sim_levels.py's test of the same name (a virtual clock)."""
    sweep = FAST + "[sweep]\nconcurrency = [1, 2]\nlevel_s = 0.05\nrepeats = 2\n"
    with start_mock(ttft_s=0.004, per_token_s=0.0005, slots=4) as mock:
        open_gate(isolated, mock.base_url, sweep, stage="ladder")
        result = cli(
            "sweep", "--json", "--beyond-ladder", "--input-tokens", "100", "--output-tokens", "20"
        )
    assert result.code == 0, result.err
    out = result.json
    levels = out["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 2] and levels[0]["gain_counted"] is False
    assert all(lv["repeats"] >= 2 for lv in levels)
    want = out["recommended_concurrency"]
    assert want in (1, 2)
    # a knee the runs leave in doubt is FAST's conservative answer, said as taken under noise
    if out["under_noise"]:
        assert f"concurrency {want}, the conservative answer, taken under noise" in result.err
    else:
        assert f"recommended concurrency {want}" in result.err
    records = jsonl(run_dir(isolated, out["run_id"]) / "records.jsonl")
    assert {r["usage"]["completion_tokens"] for r in records if r["ok"]} == {20}, "forced"


def test_stalls_at_the_keepalive_timeout_are_named_with_the_flag(cli, isolated: Path) -> None:
    """A server whose answers take a tenth of a second but some wait ≈5 s first (the shape of
    llama.cpp's HTTP threads held by kept-alive connections): the sweep names it and the flag.
    The mock draws which requests are slow from its seed: seed 17 makes the 7th, 11th, 15th and
    18th the slow ones (the first is the stream probe's), and the level sends at least 16 — four
    stalls of ≈5 s beside a median of ~0.08 s, however busy the machine. (Seed 0's first slow
    request was the 21st: a busy machine sent fewer and saw no stall.)"""
    sweep = FAST + "[sweep]\nconcurrency = [4]\nlevel_s = 0.6\nrepeats = 1\n"
    with start_mock(
        ttft_s=0.05,
        per_token_s=0.0005,
        slots=4,
        slow_rate=0.25,
        slow_s=5.0,
        seed=17,
        expose_props=True,
    ) as mock:
        open_gate(isolated, mock.base_url, sweep, stage="ladder")
        result = cli("sweep", "--json", "--beyond-ladder")
    # the stall is named whatever the verdict: beside two CPU-burning processes calibrate's
    # threads waited to run and the level was rightly its client's limit, not the server's
    assert_kept_or_client_bound(result, "C ≥ 4")
    notes = [line for line in result.err.splitlines() if "stalls of ≈5 s" in line]
    assert len(notes) == 1, result.err
    assert "concurrency 4:" in notes[0] and "while the median was" in notes[0]
    assert "llama.cpp's HTTP threads are held by kept-alive connections" in notes[0]
    assert notes[0].endswith("start it with --threads-http 6")


def test_a_client_bound_sweep_is_inconclusive_exit_1_and_says_what_to_do(
    cli, isolated: Path, monkeypatch
) -> None:
    """calibrate's own self-check reads every window as CPU-bound (a fake monitor that burns
    nothing but reports 0.97 cores): no level is recommended, the sweep is not passed (exit 1)
    and it says at which concurrency and what to do."""
    from calibrate.gpu.selfload import SelfLoadMonitor
    from calibrate.stages.measure import tier_run

    class Busy(SelfLoadMonitor):
        def _run(self) -> None:
            while not self._stop.wait(0.02):
                self.observe(1.0, 0.97, 0.0)

    monkeypatch.setattr(tier_run, "SelfLoadMonitor", Busy)
    with start_mock(ttft_s=0.004, per_token_s=0.0005, slots=4) as mock:
        open_gate(isolated, mock.base_url, SWEEP, stage="ladder")
        result = cli("sweep", "--json", "--beyond-ladder", "--junit", "sweep.xml")
    assert result.code == 1, result.err
    out = result.json
    assert out["passed"] is False and out["recommended_concurrency"] is None
    assert out["inconclusive"].startswith("inconclusive: the client was the limit at C ≥ 1")
    assert "sweep inconclusive: the client was the limit at C ≥ 1" in result.err
    assert (
        "what to do: send from more processes with --workers N (or auto), or run calibrate from a faster client machine"
        in result.err
    )
    assert "recommended concurrency" not in result.err
    assert all(lv["client_bound"] for lv in out["levels_detail"])
    suite, cases = junit_cases(isolated / "sweep.xml")
    assert suite.get("failures") == "1", "CI shows the sweep as not passed"
    assert cases[-1].get("name") == "calibrate was not the limit"
