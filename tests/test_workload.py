"""The workload (SPEC §5.11) against the mock over real HTTP: memory that grows with tokens is
found by a workload-shaped ladder and missed by the fixed prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.mockserver import start_mock
from tests.tier_helpers import jsonl, open_gate, run_dir
from tests.workload_helpers import FAST_MOCK, LADDER, SEEN_MOCK, calibrated, tiers

KV_20K = {**FAST_MOCK, "kv_capacity_tokens": 20_000}


def test_fixed_prompt_misses_the_kv_limit_a_3000_token_workload_finds(cli, isolated: Path) -> None:
    # answers of 200 ms, so the 8 requests of a wave are resident together on a loaded machine
    with start_mock(**{**KV_20K, "per_token_s": 0.001}, on_kv_full="oom") as mock:
        calibrated(cli, isolated, mock.base_url)
        fixed = cli("ladder", "--json")
        shaped = cli("ladder", "--input-tokens", "3000", "--output-tokens", "200", "--json")
    # the fixed prompt's 20-odd tokens fit 8 times over: every tier passes, the limit is unseen
    assert fixed.code == 0, fixed.err
    assert [t["verdict"] for t in tiers(fixed)] == ["pass"] * 4
    # 4 × 3200 tokens fit in 20,000; 8 × 3200 do not
    assert shaped.code == 0, shaped.err
    assert shaped.json["highest_kept"] == 4  # the ceiling (the setting: the best tier below it)
    assert shaped.json["last_passing"]["batch_size"] <= 4
    assert [t["verdict"] for t in tiers(shaped)] == ["pass", "pass", "pass", "fail"]
    assert "oom" in tiers(shaped)[-1]["error_kinds"]
    for tier in tiers(shaped)[:3]:
        assert tier["input_tokens_target"] == 3000
        assert tier["input_tokens_mean"] == pytest.approx(3000, rel=0.05)
        assert tier["output_tokens_mean"] == 200
    table = (run_dir(isolated, shaped.json["run_id"]) / "tiers.csv").read_text("utf-8")
    assert "input_tokens_target" in table and "input_tokens_mean" in table
    assert "3000→" in shaped.err  # the table shows target → actual input tokens
    workload = shaped.json["workload"]
    assert workload["source"] == "synthetic" and workload["output_tokens"] == 200
    assert workload["longest_input_tokens"] == pytest.approx(3000, rel=0.05)


def test_forced_answers_are_complete_and_the_canary_is_compared(cli, isolated: Path) -> None:
    with start_mock(**FAST_MOCK) as mock:
        calibrated(cli, isolated, mock.base_url, LADDER + "batch_sizes = [1, 2]\n")
        result = cli(
            "ladder", "--input-tokens", "300", "--output-tokens", "50", "--slo", "e2e:30", "--json"
        )
    assert result.code == 0, result.err
    records = jsonl(run_dir(isolated, result.json["run_id"]) / "records.jsonl")
    work = [r for r in records if not r.get("canary")]
    canaries = [r for r in records if r.get("canary")]
    # forced to 50 tokens, they end with "length" by design: complete, not incomplete
    assert work and all(r["ok"] and r["finish_reason"] == "length" for r in work)
    assert all(r["usage"]["completion_tokens"] == 50 for r in work)
    assert all(r["params"]["max_tokens"] == 50 for r in work)
    assert all(r["input_tokens_target"] == 300 for r in work)
    # one canary per wave: 2 tiers × 2 rounds; it keeps the normal rule and the baseline text
    assert len(canaries) == 4 and all(r["finish_reason"] == "stop" for r in canaries)
    for tier in tiers(result):
        assert (tier["baseline_match"], tier["baseline_items"]) == (2, 2)
        assert tier["items"] == tier["batch_size"] * 2  # canaries are not counted as items
        assert tier["slo_met"] == tier["items"]  # nor as goodput
        assert tier["goodput_per_s"] == pytest.approx(tier["items_per_s"], rel=1e-4)
    prompts = [r["prompt"] for r in work]
    assert len(set(prompts)) == len(prompts)  # every request its own prompt


def test_an_answer_cut_short_of_the_forced_length_is_incomplete(cli, isolated: Path) -> None:
    with start_mock(**FAST_MOCK, truncate_rate=1.0) as mock:
        open_gate(isolated, mock.base_url, LADDER + "batch_sizes = [1]\n")
        result = cli("ladder", "--input-tokens", "100", "--output-tokens", "40")
    assert result.code == 1
    assert "incomplete" in result.err and "forced to 40 tokens" in result.err


# Under preemption nothing fails: the requests slow down, and the server's own preemption counter
# (the mock's vllm:num_preemptions_total) says why: stop: preempt, the tier not kept (SPEC §5.3).
def test_preemption_is_stopped_by_the_preemption_counter_not_a_failure(cli, isolated: Path) -> None:
    rule = LADDER.replace("latency_rise = 100.0", "latency_rise = 1.25")
    with start_mock(**{**KV_20K, "per_token_s": 0.001}, on_kv_full="preempt") as mock:
        calibrated(cli, isolated, mock.base_url, rule)
        # not streamed: streamed, the mock's preemption leaves batch 8's time per item at 1.02×
        # batch 4's (its slowdown shows only on whole answers); the rule is what is tested here
        args = ("--input-tokens", "3000", "--output-tokens", "200", "--no-stream")
        result = cli("ladder", *args, "--json")
    assert result.code == 0, result.err
    assert [t["verdict"] for t in tiers(result)][-1] == "stop: preempt"
    assert [t["batch_size"] for t in tiers(result)][-1] == 8
    assert all(t["errors"] == 0 for t in tiers(result))
    assert result.json["tiers_detail"][-1]["preemptions"] > 0
    assert result.json["last_passing"]["batch_size"] <= 4, "a preempting tier is not kept"


def test_prefix_cache_identical_prompts_hold_far_less_kv_than_unique_ones(
    cli, isolated: Path
) -> None:
    # 0.4 s answers: at 0.1 s a machine at load 14 delivered the four apart, the server never
    # ran 4 at once (the ladder said so, inconclusive) and held 3 prompts' KV at its peak
    with start_mock(**{**KV_20K, "per_token_s": 0.002}, prefix_cache=True) as mock:
        calibrated(cli, isolated, mock.base_url, LADDER + "batch_sizes = [4]\n")
        args = ("ladder", "--input-tokens", "2000", "--output-tokens", "200", "--json")
        unique = cli(*args)
        shared = cli(*args, "--shared-prefix", "1.0")
    assert unique.code == 0 and shared.code == 0, unique.err + shared.err
    kv_unique = tiers(unique)[0]["peak_kv_usage"]
    kv_shared = tiers(shared)[0]["peak_kv_usage"]
    # 4 unique prompts hold 4 × 2200 tokens of 20,000; 4 identical ones hold the 2000 once
    assert kv_unique >= 0.35 and kv_shared <= kv_unique / 2, (kv_unique, kv_shared)
    assert shared.json["workload"]["shared_prefix"] == 1.0


def _tasks(root: Path) -> Path:
    path = root / "tasks.jsonl"
    lines = [{"id": i, "text": f"item {i} " + "word " * (i * 7 % 31)} for i in range(1, 31)]
    lines[4]["prompt"] = "own prompt:"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), "utf-8")
    return path


def _work_prompts(root: Path, result: object) -> list[str]:
    run = run_dir(root, result.json["run_id"])  # type: ignore[attr-defined]
    return [r["prompt"] for r in jsonl(run / "records.jsonl") if not r.get("canary")]


def test_tasks_pick_longest_takes_the_longest_items_built_as_batch_builds_them(
    cli, isolated: Path
) -> None:
    tasks = _tasks(isolated)
    texts = [json.loads(line)["text"] for line in tasks.read_text("utf-8").splitlines()]
    with start_mock(**FAST_MOCK) as mock:
        calibrated(cli, isolated, mock.base_url, LADDER + "batch_sizes = [1, 2]\n")
        result = cli("ladder", "--tasks", str(tasks), "--prompt", "概括：", "--json")
    assert result.code == 0, result.err
    longest = sorted({len(t) for t in texts}, reverse=True)[:2]
    sent = _work_prompts(isolated, result)
    assert {len(p) - len("概括：\n") for p in sent} == set(longest)  # never "the first N lines"
    assert all(p.startswith("概括：\n") for p in sent)
    workload = result.json["workload"]
    assert workload["source"] == "tasks" and workload["pick"] == "longest"


def test_tasks_pick_sample_is_seeded_and_reproducible(cli, isolated: Path) -> None:
    tasks = _tasks(isolated)
    with start_mock(**SEEN_MOCK) as mock:
        calibrated(cli, isolated, mock.base_url, LADDER + "batch_sizes = [2, 4]\n")
        args = ("ladder", "--tasks", str(tasks), "--pick", "sample", "--json")
        first, second = cli(*args), cli(*args)
        (isolated / "calibrate.toml").write_text(
            (isolated / "calibrate.toml").read_text("utf-8") + "[workload]\nseed = 7\n", "utf-8"
        )
        other = cli(*args)
    assert first.code == second.code == other.code == 0, first.err
    one, two = _work_prompts(isolated, first), _work_prompts(isolated, second)
    assert one == two and len(set(one)) == len(one)  # 12 distinct items, the same each run
    assert _work_prompts(isolated, other) != one  # another seed, another sample


def test_workload_flags_out_of_bounds_exit_2_before_anything_is_written(
    cli, isolated: Path
) -> None:
    with start_mock(**FAST_MOCK) as mock:
        calibrated(cli, isolated, mock.base_url)
        runs_before = sorted((isolated / "runs").iterdir())
        for args, words in [
            (("--input-tokens", "2000000"), "--input-tokens must be in [1, 1048576]"),
            (("--input-tokens", "9:3"), "A ≤ B"),
            (("--input-tokens", "100", "--output-tokens", "0"), "--output-tokens must be in"),
            (("--input-tokens", "100", "--shared-prefix", "1.5"), "--shared-prefix must be"),
            (("--output-tokens", "10"), "--output-tokens and --shared-prefix shape"),
            (("--tasks", "x.jsonl", "--input-tokens", "5"), "give one of them"),
            (("--axis", "context", "--context-lengths", "1024,512"), "must increase"),
            (("--batch", "2"), "--batch goes with --axis context"),
        ]:
            result = cli("ladder", *args)
            assert result.code == 2 and words in result.err, (args, result.err)
        assert sorted((isolated / "runs").iterdir()) == runs_before


def test_sweep_sends_the_workload_and_records_it(cli, isolated: Path) -> None:
    extra = (
        LADDER + "batch_sizes = [1, 2]\n[sweep]\nconcurrency = [1, 2]\nlevel_s = 0.1\nrepeats = 1\n"
    )
    with start_mock(**FAST_MOCK) as mock:
        calibrated(cli, isolated, mock.base_url, extra)
        assert cli("ladder").code == 0
        result = cli("sweep", "--input-tokens", "400:800", "--output-tokens", "30", "--json")
    assert result.code == 0, result.err
    levels = result.json["levels_detail"]
    assert all(400 <= lv["input_tokens_target"] <= 800 for lv in levels)
    assert all(lv["output_tokens_mean"] == 30 for lv in levels)
    workload = result.json["workload"]
    assert workload["input_tokens"] == "400:800" and workload["output_tokens"] == 30
    records = jsonl(run_dir(isolated, result.json["run_id"]) / "records.jsonl")
    # each level runs for its window (at least 4×C requests), every prompt its own
    assert len(records) >= 4 * 1 + 4 * 2
    assert len({r["prompt"] for r in records}) == len(records)
