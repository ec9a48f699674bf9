"""Every stage driven through the real CLI against a real engine doing real token generation.

Run with `make test-engine` (it installs and starts `transformers serve` with continuous batching
on the CPU, serving the tiny model built by scripts/build_tiny_model.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine


def _records(root: Path, run_id: str) -> list[dict]:
    text = (root / "runs" / run_id / "records.jsonl").read_text("utf-8")
    return [json.loads(line) for line in text.splitlines()]


def test_single_passes_with_usage_and_stop(
    cli, engine_config: Path, isolated: Path, engine_model: str
) -> None:
    result = cli("single", "--json")
    assert result.code == 0, result.err
    (record,) = _records(isolated, result.json["run_id"])
    assert record["finish_reason"] == "stop" and record["text"].strip()
    assert record["usage"]["prompt_tokens"] > 0 and record["usage"]["completion_tokens"] > 0
    assert engine_model in result.json["identity"]["models"][0]["id"]
    assert "right endpoint, wrong weights" not in result.err


def test_single_streaming_without_done_marker(cli, engine_config: Path, isolated: Path) -> None:
    result = cli("single", "--stream", "--json")
    assert result.code == 0, result.err
    (record,) = _records(isolated, result.json["run_id"])
    assert record["ttft_s"] is not None and record["usage"]["completion_tokens"] > 0


def test_single_with_tiny_max_tokens_is_cut_off(cli, engine_config: Path) -> None:
    text = engine_config.read_text("utf-8").replace("max_tokens = 32", "max_tokens = 3")
    engine_config.write_text(text, "utf-8")
    result = cli("single")
    assert result.code == 1 and "cut off at max_tokens=3" in result.err


def test_unknown_model_lists_what_is_served(cli, engine_config: Path, engine_model: str) -> None:
    result = cli("single", "--model", "tiny-llama")
    assert result.code == 1
    assert "does not serve 'tiny-llama'" in result.err and engine_model in result.err


def test_repro_identical(cli, engine_config: Path) -> None:
    assert cli("single").code == 0
    result = cli("repro", "--runs", "2", "--json")
    assert result.code == 0, result.err
    assert result.json["verdict"] == "identical"


def _calibrated_through_repro(cli) -> None:
    assert cli("single").code == 0
    assert cli("repro").code == 0


def test_ladder_wave_mode_all_tiers_pass_without_vram(
    cli, engine_config: Path, isolated: Path
) -> None:
    _calibrated_through_repro(cli)
    result = cli("ladder", "--json")
    assert result.code == 0, result.err
    assert "VRAM not measured" in result.err
    run = isolated / "runs" / result.json["run_id"]
    tiers = [json.loads(line) for line in (run / "tiers.jsonl").read_text("utf-8").splitlines()]
    # each tier in order, then any a noisy pair needed again (interleaved repeats, SPEC §5.14)
    assert [t["batch_size"] for t in tiers][:4] == [1, 2, 4, 8]
    assert {t["batch_size"] for t in tiers} == {1, 2, 4, 8}
    assert all(t["verdict"] in ("pass", "stop: latency") for t in tiers), tiers
    assert all("baseline_match" in t for t in tiers)
    assert result.json["last_passing"]["batch_size"] >= 1
    print("\n" + result.err)  # the tier table, for the CI log


def test_sweep_recommends_a_concurrency(cli, engine_config: Path) -> None:
    _calibrated_through_repro(cli)
    assert cli("ladder").code == 0
    result = cli("sweep", "--json")
    assert result.code == 0, result.err
    assert result.json["recommended_concurrency"] >= 1
    print("\n" + result.err)


def test_verify_is_consistent(cli, engine_config: Path) -> None:
    assert cli("single").code == 0
    result = cli("verify", "--json")
    assert result.code == 0, result.err
    assert "config consistent" in result.err


def test_batch_of_50_items_all_ok(cli, engine_config: Path, isolated: Path) -> None:
    questions = [f"What is {a} plus {b}?" for a in range(1, 11) for b in range(1, 6)]
    tasks = isolated / "tasks.jsonl"
    tasks.write_text(
        "".join(json.dumps({"id": n, "text": q}) + "\n" for n, q in enumerate(questions)), "utf-8"
    )
    result = cli("batch", "--input", str(tasks), "--out", "out.jsonl", "-c", "4", "--json")
    assert result.code == 0, result.err
    lines = [json.loads(x) for x in (isolated / "out.jsonl").read_text("utf-8").splitlines()]
    assert len(lines) == 50 and all(line["ok"] for line in lines)
    assert {line["id"] for line in lines} == set(range(50))
    assert all(line["usage"]["completion_tokens"] > 0 for line in lines)
    rerun = cli("batch", "--input", str(tasks), "--out", "out.jsonl", "-c", "4")
    assert rerun.code == 0 and "50 already done, 0 to run" in rerun.err


def test_workload_shaped_ladders_show_actual_token_counts(
    cli, engine_config: Path, isolated: Path
) -> None:
    """SPEC §5.11 on a real engine: synthetic inputs calibrated by the probe (transformers serve
    refuses ignore_eos/min_tokens with a 422, so the output length is not forced there), and
    --tasks items built as batch builds them; every tier carries what the server counted."""
    _calibrated_through_repro(cli)
    synthetic = cli("ladder", "--input-tokens", "400", "--output-tokens", "16", "--json")
    assert synthetic.code == 0, synthetic.err
    assert "output length not controlled" in synthetic.err
    run = isolated / "runs" / synthetic.json["run_id"]
    tiers = [json.loads(line) for line in (run / "tiers.jsonl").read_text("utf-8").splitlines()]
    for tier in tiers:
        assert tier["input_tokens_target"] == 400
        assert abs(tier["input_tokens_mean"] - 400) <= 0.1 * 400, tier  # the server's own count
    print("\n" + synthetic.err)
    tasks = isolated / "tasks.jsonl"
    lines = [{"id": n, "text": f"What is {n} plus {n + 1}?"} for n in range(12)]
    tasks.write_text("".join(json.dumps(x) + "\n" for x in lines), "utf-8")
    picked = cli("ladder", "--tasks", str(tasks), "--json")
    assert picked.code == 0, picked.err
    assert picked.json["workload"]["source"] == "tasks"
    assert picked.json["workload"]["pick"] == "longest"
    print("\n" + picked.err)
