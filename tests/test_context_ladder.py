"""``ladder --axis context`` (SPEC §5.3) against the mock's max_model_len, and what it feeds:
the resolver (never the batch size), status, pin's header and batch's length check."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.mockserver import start_mock
from tests.workload_helpers import FAST_MOCK, LADDER, calibrated, tiers


def test_context_ladder_steps_up_to_the_limit_the_server_reports(cli, isolated: Path) -> None:
    with start_mock(**FAST_MOCK, max_model_len=8192) as mock:
        calibrated(cli, isolated, mock.base_url)
        result = cli("ladder", "--axis", "context", "--json")
    assert result.code == 0, result.err
    assert "max_model_len 8192 from /v1/models" in result.err
    lengths = [t["input_tokens_target"] for t in tiers(result)]
    # 512, 1k, 2k, 4k, then the longest that fits beside a 128-token answer (5 % margin)
    assert lengths[:4] == [512, 1024, 2048, 4096] and 7000 < lengths[-1] < 8192 - 128
    assert all(t["verdict"] == "pass" and t["batch_size"] == 1 for t in tiers(result))
    assert result.json["axis"] == "context"
    assert 7000 < result.json["context_verified"] <= 8192 - 128
    assert "longest passing input:" in result.err


def test_a_step_over_the_context_fails_with_the_servers_400(cli, isolated: Path) -> None:
    with start_mock(**FAST_MOCK, max_model_len=8192) as mock:
        calibrated(cli, isolated, mock.base_url)
        lengths = ("--context-lengths", "2048,4096,9000", "--batch", "2")
        result = cli("ladder", "--axis", "context", *lengths, "--json")
    assert result.code == 0, result.err  # a length passed: the ladder found the ceiling
    assert [t["verdict"] for t in tiers(result)] == ["pass", "pass", "fail"]
    assert tiers(result)[-1]["error_kinds"] == {"http_4xx": 2}
    assert "maximum context length is 8192 tokens" in result.err
    assert abs(result.json["context_verified"] - 4096) <= 0.05 * 4096
    assert result.json["stopped_by"] == "failure"


def test_a_context_ladder_never_sets_the_batch_size(cli, isolated: Path) -> None:
    with start_mock(**FAST_MOCK, max_model_len=8192) as mock:
        server = '[server]\nmodel_path = "/models/m"\n'
        sweep = "[sweep]\nconcurrency = [1, 2]\nlevel_s = 0.1\nrepeats = 1\n"
        extra = LADDER + "batch_sizes = [1, 2]\n" + sweep + server
        calibrated(cli, isolated, mock.base_url, extra)
        assert cli("ladder").code == 0
        context = cli("ladder", "--axis", "context", "--context-lengths", "512,3000", "--json")
        assert context.code == 0, context.err
        status = cli("status", "--json")
        sweep_gate = cli("sweep", "--json")
        pin = cli("pin", "--kind", "vllm", "--json")
    assert status.json["setting"]["batch_size"] == 2  # the batch-axis ladder's, not 1
    verified = status.json["verified_input_tokens"]
    assert abs(verified - 3000) <= 150
    assert sweep_gate.code == 0, sweep_gate.err  # the batch ladder still opens the sweep gate
    assert pin.code == 0, pin.err
    header = (isolated / "scripts/launch.sh").read_text("utf-8")
    workload_line = next(line for line in header.splitlines() if line.startswith("# workload:"))
    assert f"inputs verified up to {verified:,} tokens" in workload_line
    assert "BATCH_SIZE=2" in header


def test_batch_warns_before_sending_about_items_longer_than_any_ladder_verified(
    cli, isolated: Path
) -> None:
    tasks = isolated / "long.jsonl"
    lines = [{"id": i, "text": " ".join(["word"] * (i * 400))} for i in range(1, 9)]
    tasks.write_text("".join(json.dumps(x) + "\n" for x in lines), "utf-8")
    with start_mock(**FAST_MOCK, max_model_len=8192) as mock:
        calibrated(cli, isolated, mock.base_url)
        ladder = cli("ladder", "--axis", "context", "--context-lengths", "512,2000")
        assert ladder.code == 0, ladder.err
        out = str(isolated / "out.jsonl")
        result = cli("batch", "--input", str(tasks), "--out", out, "-c", "2")
    # items of 2,400 … 3,200 words (about a token each) are longer than the 2,000 verified
    warning = next(line for line in result.err.splitlines() if "items exceed" in line)
    found = re.match(r"warning: (\d+) items exceed ([\d,]+) tokens", warning)
    assert found and found[1] == "4", warning
    assert abs(int(found[2].replace(",", "")) - 2000) <= 100  # what the 2000-token step sent
    assert "run calibrate ladder --tasks" in warning and str(tasks) in warning
    assert result.err.index("items exceed") < result.err.index("batch: 8/8")  # before sending
    assert result.code == 0


def test_batch_says_nothing_when_every_item_fits(cli, isolated: Path) -> None:
    tasks = isolated / "short.jsonl"
    tasks.write_text('{"id": 1, "text": "short"}\n{"id": 2, "text": "also short"}\n', "utf-8")
    with start_mock(**FAST_MOCK) as mock:
        calibrated(cli, isolated, mock.base_url, LADDER + "batch_sizes = [1]\n")
        assert cli("ladder", "--input-tokens", "200", "--output-tokens", "10").code == 0
        result = cli("batch", "--input", str(tasks), "--out", str(isolated / "out.jsonl"))
    assert result.code == 0, result.err
    assert "exceed" not in result.err
