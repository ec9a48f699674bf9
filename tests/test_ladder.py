"""Stage C against the real mock over real HTTP: tiers, stop rules, incidents, records."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import FAKE_KEY, all_files_text, write_config
from tests.mockserver import start_mock
from tests.tier_helpers import DEFAULT_RISE, FAST, jsonl, open_gate, run_dir, setting_by_rule


def test_oom_at_tier_8_keeps_tier_4_with_incidents_and_no_key_on_disk(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALIBRATE_API_KEY", FAKE_KEY)
    with start_mock(ttft_s=0.002, per_token_s=0.004, slots=4, oom_at=6) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url, FAST)
        assert cli("single").code == 0
        assert cli("repro", "--runs", "1").code == 0
        result = cli("ladder", "--json")
    assert result.code == 0, result.err
    summary = result.json
    # wave mode: a batch of 4 is 4 requests in flight together (SPEC §5.0)
    # the setting is the smallest kept batch within noise of the fastest: 4 on four slots, or 2
    # when one wave each (FAST) left 4's gain inside the noise; the kept ceiling is 4 either way
    setting = summary["last_passing"]
    assert setting["batch_size"] in (2, 4) and setting["concurrency"] == setting["batch_size"]
    assert summary["max_in_flight"] == 4
    assert summary["stopped_by"] == "failure"
    assert [(t["batch_size"], t["verdict"]) for t in summary["tiers"]] == [
        (1, "pass"),
        (2, "pass"),
        (4, "pass"),
        (8, "fail"),
    ]
    assert "last passing tier" in result.err and "oom" in result.err
    assert "(stopped by failure: " in result.err
    run = run_dir(isolated, summary["run_id"])
    incidents = sorted((run / "incidents").glob("*.json"))
    # 8 sent at once with 6 allowed in flight: up to 2 fail (whichever arrive last; fewer when a
    # loaded machine lets an early one finish first), one bundle each, named <batch>-<round>-<item>
    assert 1 <= len(incidents) <= 2 and len(incidents) == summary["tiers"][-1]["errors"]
    # round 1's, or round 2's where a busy machine let round 1's early answers finish first
    assert all(re.fullmatch(r"8-[12]-[1-8]\.json", p.name) for p in incidents)
    for path in incidents:
        bundle = json.loads(path.read_text("utf-8"))
        assert bundle["error"]["kind"] == "oom" and bundle["error"]["status"] == 500
        assert "CUDA out of memory" in bundle["error"]["body"]
        assert bundle["request"]["body"]["messages"][0]["content"] == "用一句话说明什么是定长数组。"
        assert bundle["request"]["headers"]["Authorization"] == "[REDACTED]"
        assert bundle["batch_size"] == 8 and bundle["round"] == 1
        assert bundle["vram"]["round_peak"]["used_mib"] > bundle["vram"]["sampler"]["used_mib"] - 1
    records = jsonl(run / "records.jsonl")
    assert len(records) == 2 + 4 + 8 + 8  # tier 8 stops after its failing first round
    assert sum(1 for r in records if not r["ok"]) == len(incidents)  # one bundle per failure
    assert {r["batch_size"] for r in records} == {1, 2, 4, 8}
    assert len(jsonl(run / "rounds.jsonl")) == 7 and len(jsonl(run / "tiers.jsonl")) == 4
    ledger = jsonl(isolated / "runs/ledger.jsonl")[-1]
    assert ledger["stage"] == "ladder" and ledger["passed"] is True
    assert ledger["summary"]["last_passing"] == setting  # whichever of 2 or 4 it chose
    assert FAKE_KEY not in all_files_text(isolated / "runs")


def test_vram_limit_at_tier_4_stops_there_without_failures(cli, isolated: Path) -> None:
    # used = 5000 + in_flight × 1000 of 10000 MiB: 4 in flight is 90 % = the default vram_limit
    with start_mock(
        ttft_s=0.03,
        per_token_s=0.0005,
        vram_total_mib=10000,
        vram_base_mib=5000,
        vram_per_request_mib=1000,
    ) as mock:
        open_gate(isolated, mock.base_url)
        result = cli("ladder", "--json")
    assert result.code == 0, result.err
    out = result.json
    assert out["stopped_by"] == "vram" and out["highest_kept"] == 4
    assert [t["verdict"] for t in out["tiers"]] == ["pass", "pass", "stop: vram"]
    # the setting is the rule's over the rounds measured (one-wave rounds of ~50 ms: a hiccup
    # on a loaded machine may make batch 4's range reach batch 2's, and then 2 is the setting)
    assert out["last_passing"]["batch_size"] == setting_by_rule(run_dir(isolated, out["run_id"]))
    assert all(t["errors"] == 0 for t in out["tiers"])
    detail = out["tiers_detail"]
    assert detail[2]["pressure"] == pytest.approx(0.9) and detail[2]["pressure_source"] == "metrics"
    assert detail[1]["pressure"] == pytest.approx(0.7) and detail[2]["peak_vram_mib"] == 9000
    assert "VRAM source: metrics" in result.err


def test_latency_jump_at_batch_4_stops_by_latency(cli, isolated: Path) -> None:
    # ~150 ms answers (4× above batch 2): at ~50 ms one make test read the rounds' spread under
    # the suite's load as wide enough to hide the jump (stopped_by "completed")
    with start_mock(ttft_s=0.002, per_token_s=0.003, slow_above=2, slow_factor=4.0) as mock:
        open_gate(isolated, mock.base_url, DEFAULT_RISE)
        result = cli("ladder", "--json")
    assert result.code == 0, result.err
    assert result.json["stopped_by"] == "latency"
    # batch 4 costs ~2× batch 2 per item: the ladder stops there at the latest (earlier only
    # where a busy machine slowed batch 2 as much; the rule's thresholds: tests/stages/ladder)
    verdicts = [t["verdict"] for t in result.json["tiers"]]
    stop = verdicts.index("stop: latency")
    assert verdicts == ["pass"] * stop + ["stop: latency"] and 1 <= stop <= 2
    # the stopping tier is kept, but it is not the setting: a tier below it, by the rule
    stopped = result.json["tiers"][stop]["batch_size"]
    assert result.json["highest_kept"] == stopped
    assert result.json["last_passing"]["batch_size"] < stopped
    assert "s per item is" in result.err and "(limit 1.25×)" in result.err
    # one concurrency everywhere: the ladder's line says what status will (no sweep yet: 1) —
    # batch 2, or batch 1 where a loaded machine left batch 2's gain within its noise
    setting = result.json["last_passing"]["batch_size"]
    assert f"setting: batch {setting}, concurrency 1 (no sweep at this batch size yet) — " in (
        result.err
    )
    assert "batch 4 kept but" in result.err and "slower" in result.err
    # a quiet client over a few short rounds: measured, and not called the bottleneck
    assert result.json["selfload"]["bottleneck"] is False
    assert "calibrate itself is the bottleneck" not in result.err


def test_nondeterminism_above_2_is_reported_and_fails_only_with_require_match(
    cli, isolated: Path
) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005, nondeterministic_above=2) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url, FAST)
        assert cli("single").code == 0
        open_gate(isolated, mock.base_url)
        plain = cli("ladder", "--json")
        strict = cli("ladder", "--require-match")
    assert plain.code == 0, plain.err
    detail = {t["batch_size"]: t for t in plain.json["tiers_detail"]}
    assert detail[1]["baseline_match"] == detail[1]["rounds"]
    assert detail[2]["baseline_match"] == 2 * detail[2]["rounds"]
    # every round of B sends B items (more rounds where the setting needed them to tell tiers apart)
    assert detail[4]["baseline_match"] < detail[4]["baseline_items"] == 4 * detail[4]["rounds"]
    assert detail[8]["baseline_match"] < detail[8]["baseline_items"] == 8 * detail[8]["rounds"]
    four = detail[4]
    items = four["baseline_items"]
    assert (
        f"at batch 4: {four['baseline_match']} of {items} outputs match the baseline, "
        f"{items - four['baseline_match']} differ" in plain.err
    )
    assert "not batch-invariant" in plain.err
    assert strict.code == 1 and "--require-match" in strict.err


def test_outputs_that_differ_already_at_batch_1_are_not_blamed_on_the_batch(
    cli, isolated: Path
) -> None:
    """The server's answer changed since the baseline (another text seed: another build), the
    same at every batch: the ladder said "at batch 1: 0 of N outputs match the baseline …: this
    server is not batch-invariant" — one request at a time, nothing batched — at every tier."""
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url, FAST)
        assert cli("single").code == 0
    with start_mock(ttft_s=0.002, per_token_s=0.0005, text_seed=7, port=mock.port) as other:
        open_gate(isolated, other.base_url, FAST + "batch_sizes = [1, 2]\n")
        plain = cli("ladder", "--json")
        strict = cli("ladder", "--require-match")
    assert plain.code == 0, plain.err
    assert "not batch-invariant" not in plain.err
    assert "outputs differ from the single-call baseline at batch 1" in plain.err
    assert "one at a time, so not the batch" in plain.err
    assert "as they already did at batch 1" in plain.err
    assert all("not batch-invariant" not in n for n in plain.json["baseline_mismatch"])
    assert strict.code == 1 and "--require-match" in strict.err  # still a mismatch


def test_prompt_list_mode_sends_one_completions_request_per_batch(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        open_gate(isolated, mock.base_url, FAST + 'mode = "prompt-list"\nbatch_sizes = [1, 4]\n')
        result = cli("ladder", "--json")
        requests_seen = mock.model.snapshot().requests_total
    assert result.code == 0, result.err
    assert [t["verdict"] for t in result.json["tiers"]] == ["pass", "pass"]
    rounds = sum(t["rounds"] for t in result.json["tiers_detail"])  # 2 a tier, or more to tell
    assert requests_seen == rounds + 1  # one request a round; the stream probe
    records = jsonl(run_dir(isolated, result.json["run_id"]) / "records.jsonl")
    per_round = {t["batch_size"]: t["rounds"] for t in result.json["tiers_detail"]}
    assert len(records) == per_round[1] + 4 * per_round[4]
    assert all(r["ok"] and r["text"] for r in records)


def test_tasks_file_inputs_and_vram_not_measured(cli, isolated: Path) -> None:
    tasks = isolated / "tasks.jsonl"
    tasks.write_text('{"id": 1, "text": "第一题"}\n{"id": 2, "text": "second"}\n', "utf-8")
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        open_gate(isolated, mock.base_url, FAST + "batch_sizes = [1, 2]\n")
        result = cli("ladder", "--tasks", str(tasks), "--vram-source", "none", "--json")
    assert result.code == 0, result.err
    assert "VRAM not measured" in result.err
    assert all(
        t["pressure"] is None and t["baseline_match"] is None for t in result.json["tiers_detail"]
    )
    prompts = {
        r["prompt"] for r in jsonl(run_dir(isolated, result.json["run_id"]) / "records.jsonl")
    }
    assert prompts == {"第一题", "second"}


def test_first_tier_failing_exits_1(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005, truncate_rate=1.0) as mock:
        open_gate(isolated, mock.base_url)
        result = cli("ladder", "--json")
    assert result.code == 1
    assert result.json["last_passing"] is None and result.json["stopped_by"] == "failure"
    assert "incomplete" in result.err and "ladder failed" in result.err


def test_gate_bad_tasks_and_no_server(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url)
        closed = cli("ladder")
    assert closed.code == 3 and "calibrate repro" in closed.err
    bad = isolated / "bad.jsonl"
    bad.write_text('{"id": 1, "text": "ok"}\n{"id": 2}\n', "utf-8")
    wrong = cli("ladder", "--force", "--tasks", str(bad))  # batch's input format, batch's words
    assert wrong.code == 2 and "bad.jsonl line 2: no 'text'" in wrong.err
    assert "Traceback" not in wrong.err
    assert not (isolated / "runs").exists()  # nothing written on a usage error
    gone = cli("ladder", "--force")  # the mock is stopped now
    assert gone.code == 4 and "make mock" in gone.err


def test_one_batch_at_a_time_records_requests_in_flight(cli, isolated: Path) -> None:
    """Batch size and concurrency stay two columns: B = 2 is 2 requests in flight in wave mode,
    and one request carrying 2 prompts in prompt-list mode. Answers of ~80 ms, several of the
    running count's 20 ms samples: a ~12 ms answer could run unseen on a busy machine, and a tier
    the server was never seen running whole is no setting (inconclusive, exit 1)."""
    with start_mock(ttft_s=0.02, per_token_s=0.003) as mock:
        open_gate(isolated, mock.base_url, FAST + "batch_sizes = [2]\n")
        wave = cli("ladder", "--json")
        extra = FAST + 'batch_sizes = [2]\nmode = "prompt-list"\n'
        write_config(isolated / "calibrate.toml", mock.base_url, extra)
        cli_list = cli("ladder", "--json")
    assert wave.code == 0, wave.err
    assert wave.json["last_passing"] == {"batch_size": 2, "concurrency": 2}
    records = jsonl(run_dir(isolated, wave.json["run_id"]) / "records.jsonl")
    assert len(records) == 2 * 2  # rounds × batch: one wave per round
    assert {(r["batch_size"], r["concurrency"]) for r in records} == {(2, 2)}
    assert cli_list.code == 0, cli_list.err
    assert cli_list.json["last_passing"] == {"batch_size": 2, "concurrency": 1}


def test_old_ladder_concurrency_key_is_refused_with_what_to_do(cli, isolated: Path) -> None:
    write_config(
        isolated / "calibrate.toml", "http://127.0.0.1:9/v1", "[ladder]\nconcurrency = 3\n"
    )
    result = cli("ladder")
    assert result.code == 2 and "ladder.concurrency" in result.err
    assert "one batch at a time" in result.err and "[sweep] concurrency" in result.err


def test_ctrl_c_mid_round_exits_130_at_once_with_the_rounds_so_far(isolated: Path) -> None:
    """Requests still on the wire must not hold the process for the client's timeout."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.mockserver import REPO

    # batch 1 and 2 answer at once; from batch 4 on every request takes 60 s
    with start_mock(ttft_s=0.002, per_token_s=0.0005, slow_above=2, slow_factor=100000.0) as mock:
        open_gate(isolated, mock.base_url)
        with subprocess.Popen(
            [sys.executable, "-m", "calibrate", "ladder"],
            cwd=isolated,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as proc:
            # Ctrl-C once batch 4's wave is in flight (the mock admitted a third at once): tiers
            # 1 and 2 are done by then however busy the machine (a fixed 0.5 s after the first
            # round was once still inside batch 2 beside four CPU burners). Its first two answer
            # at once, so the count of 3 lasts a moment: polling for it missed it beside two
            # burners, and the ladder ended on its own at the 30 s timeout; the admission is kept
            wave: list[int] = []
            admit = mock.model.admit
            mock.model.admit = lambda weight=1: _seen(admit(weight), wave)  # type: ignore[method-assign]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and max(wave, default=0) < 3:
                time.sleep(0.02)
            sent = time.monotonic()
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
            took_s = time.monotonic() - sent
    assert proc.returncode == 130, err
    assert took_s < 10, f"Ctrl-C took {took_s:.1f} s"
    assert "interrupted" in err and "calibrate ladder" in err
    (run,) = [p for p in (isolated / "runs").iterdir() if p.is_dir() and p.name != "locks"]
    assert len(jsonl(run / "rounds.jsonl")) >= 2
    entry = jsonl(isolated / "runs/ledger.jsonl")[-1]
    assert entry["stage"] == "ladder" and entry["run_id"] == run.name
    assert entry["passed"] is False and entry["interrupted"] is True
    kept = [t["batch_size"] for t in entry["summary"]["tiers"]]
    assert kept == [1, 2], "partial tiers kept for report"

    refused = subprocess.run(
        [sys.executable, "-m", "calibrate", "pin", "--kind", "vllm"],
        cwd=isolated,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode == 3, refused.stderr
    assert "was interrupted" in refused.stderr and "calibrate ladder" in refused.stderr


def test_asking_for_nvml_where_there_is_none_is_a_usage_error(cli, isolated: Path) -> None:
    """--vram-source nvml by name must not silently become "VRAM not measured" (no GPU here)."""
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        open_gate(isolated, mock.base_url)
        result = cli("ladder", "--vram-source", "nvml")
    assert result.code == 2 and "NVML is not available" in result.err
    assert "--vram-source auto" in result.err
    assert not list((isolated / "runs").glob("*-ladder-*")), "nothing sent, no run folder"


def _seen(admission: Any, in_flight: list[int]) -> Any:
    """The mock's admission, its in-flight count noted."""
    in_flight.append(admission.in_flight)
    return admission


def test_a_tier_whose_memory_the_sampler_never_read_has_no_peak(cli, isolated: Path) -> None:
    """Rounds of one ~20 ms wave with /metrics read every 50 ms: the sampler read batch 4
    only before it (idle) and after it (answers done), and the ladder said "peak 40960 MiB,
    pressure 50 %, pass" — the idle memory called the peak, and the VRAM rule passing a tier it
    never saw. Here the sampler reads once a minute: no tier is read while it runs (each would
    hold 90 % and more), and the ladder says the peak is unknown, never the idle 50 %."""
    once_a_minute = FAST.replace("sample_interval_s = 0.02", "sample_interval_s = 60")
    with start_mock(
        ttft_s=0.002,
        per_token_s=0.0002,
        vram_total_mib=10000,
        vram_base_mib=5000,
        vram_per_request_mib=1000,
    ) as mock:
        open_gate(isolated, mock.base_url, once_a_minute)
        result = cli("ladder", "--json")
    detail = result.json["tiers_detail"]
    assert [t["peak_vram_mib"] for t in detail] == [None] * len(detail), detail
    assert [t["pressure"] for t in detail] == [None] * len(detail)
    assert all(t["vram_idle_mib"] == 5000 for t in detail)  # the idle reading is still there
    assert "batch 1, 2, 4, 8: VRAM not read while they ran" in result.err
    assert "the VRAM rule did not judge them" in result.err
