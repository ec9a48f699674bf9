"""Stage A against the real mock over real HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakes import free_port
from tests.helpers import write_config
from tests.mockserver import start_mock


def _records(root: Path, stage: str) -> list[dict]:
    (run,) = [p for p in (root / "runs").iterdir() if p.is_dir() and f"-{stage}-" in p.name]
    return [json.loads(line) for line in (run / "records.jsonl").read_text("utf-8").splitlines()]


def test_single_passes_writes_record_baseline_and_ledger(cli, mock, isolated: Path) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    result = cli("single", "--json")
    assert result.code == 0, result.err
    assert "baseline written" in result.err
    (record,) = _records(isolated, "single")
    assert record["ok"] and record["finish_reason"] == "stop" and record["text"]
    assert record["params"] == {"temperature": 0.0, "max_tokens": 128, "top_p": 1.0, "seed": 0}
    assert record["usage"]["prompt_tokens"] > 0 and record["usage"]["completion_tokens"] > 0
    assert record["served_model"] == "internlm-s2"
    baseline = json.loads((isolated / "baselines/single.jsonl").read_text("utf-8"))
    assert baseline["text"] == record["text"]
    ledger = [json.loads(x) for x in (isolated / "runs/ledger.jsonl").read_text().splitlines()]
    assert ledger[-1]["stage"] == "single" and ledger[-1]["passed"] is True
    assert result.json["passed"] is True
    run_dir = isolated / "runs" / result.json["run_id"]
    manifest = json.loads((run_dir / "manifest.json").read_text("utf-8"))
    assert manifest["target"] == record["target"] and manifest["config"]["target"]["model"]
    assert manifest["server"]["models"][0]["id"] == "internlm-s2"
    assert manifest["command"][:2] == ["calibrate", "single"] and "versions" in manifest
    # JSONL is compact and UTF-8 unescaped
    raw = (run_dir / "records.jsonl").read_text("utf-8")
    assert "定长数组" in raw and ", " not in raw.split('"text"')[0]


def test_second_single_keeps_baseline_save_baseline_replaces(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.001, per_token_s=0.0002) as first:
        write_config(isolated / "calibrate.toml", first.base_url)
        assert cli("single").code == 0
    original = (isolated / "baselines/single.jsonl").read_text("utf-8")
    with start_mock(ttft_s=0.001, per_token_s=0.0002, text_seed=7) as second:
        write_config(isolated / "calibrate.toml", second.base_url)
        assert cli("single").code == 0
        assert (isolated / "baselines/single.jsonl").read_text("utf-8") == original
        result = cli("single", "--save-baseline")
        assert result.code == 0 and "baseline replaced" in result.err
    kept = list((isolated / "baselines").glob("single.*.jsonl"))
    assert len(kept) == 1 and kept[0].read_text("utf-8") == original
    assert (isolated / "baselines/single.jsonl").read_text("utf-8") != original


def test_stream_records_ttft(cli, mock, isolated: Path) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    assert cli("single", "--stream").code == 0
    (record,) = _records(isolated, "single")
    assert record["ttft_s"] is not None and 0 < record["ttft_s"] <= record["elapsed_s"]
    assert record["usage"]["completion_tokens"] > 0


def test_unreachable_server_exits_4_with_hint(cli, isolated: Path) -> None:
    port = free_port()  # nothing listens there: this worker's own band
    result = cli("single", "--base-url", f"http://127.0.0.1:{port}/v1")
    assert result.code == 4
    assert f"http://127.0.0.1:{port}/v1" in result.err and "make mock" in result.err
    assert "Traceback" not in result.err
    assert not (isolated / "runs").exists(), "nothing was measured, so no run folder"


def test_unknown_model_names_what_is_served(cli, mock, isolated: Path) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    result = cli("single", "--model", "other-model")
    assert result.code == 1
    assert "does not serve 'other-model'" in result.err and "internlm-s2" in result.err
    # the real message first: no line of numbers for an answer that never came, no warning
    # saying the same thing before it (only the line said before the wait for an answer)
    waiting, first = result.err.splitlines()[:2]
    assert waiting.startswith("single: sending the fixed prompt; waiting for the first answer")
    assert first == "single failed: the server does not serve 'other-model'; it serves: internlm-s2"


@pytest.mark.parametrize("stream", [False, True])
def test_an_lmdeploy_engine_error_is_shown_with_its_text(cli, isolated: Path, stream: bool) -> None:
    """LMDeploy (v0.9.2 – v0.15) answers a request its engine failed with HTTP 200,
    finish_reason "error" and the reason as the text: the failure quotes it."""
    with start_mock(
        ttft_s=0.001, per_token_s=0.0002, error_style="lmdeploy", max_model_len=64
    ) as m:
        write_config(isolated / "calibrate.toml", m.base_url)
        result = cli("single", *(["--stream"] if stream else []))
    assert result.code == 1, result.err
    assert (
        "single failed: the server reported an error (finish_reason 'error'): internal error "
        "happened, status code ResponseType.INPUT_LENGTH_ERROR" in result.err.splitlines()
    ), result.err


def test_unknown_model_with_400_like_transformers_serve(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.001, per_token_s=0.0002, unknown_model_status=400) as server:
        result = cli("single", "--base-url", server.base_url, "--model", "nope")
    assert result.code == 1 and "it serves: internlm-s2" in result.err


def test_length_is_a_failure_with_max_tokens_diagnosis(cli, mock, isolated: Path) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url, "[prompt]\nmax_tokens = 3\n")
    result = cli("single")
    assert result.code == 1
    assert "cut off at max_tokens=3" in result.err
    assert not (isolated / "baselines/single.jsonl").exists(), "a failed call is no baseline"


def test_missing_usage_is_diagnosed(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.001, per_token_s=0.0002, no_usage=True) as server:
        result = cli("single", "--base-url", server.base_url)
    assert result.code == 1 and "did not report token usage" in result.err


@pytest.mark.parametrize("stream", [False, True])
def test_wrong_weights_fail_single_without_a_baseline(cli, isolated: Path, stream: bool) -> None:
    """A server that answers any name with what it loaded (llama.cpp) is caught by its answer:
    exit 1, no baseline, both names and both ways out in the message."""
    with start_mock(
        ttft_s=0.001, per_token_s=0.0002, models=("qwen-7b",), any_model=True
    ) as server:
        args = ["single", "--base-url", server.base_url, "--json"]
        result = cli(*args, *(["--stream"] if stream else []))
    assert result.code == 1, result.err
    (line,) = [x for x in result.err.splitlines() if "single failed" in x]
    assert "the server serves 'qwen-7b', the config names 'internlm-s2'" in line
    assert "fix target.model" in line and "--accept-model" in line
    assert not (isolated / "baselines/single.jsonl").exists(), "other weights are no baseline"
    assert result.json["passed"] is False and result.json["served_model"] == "qwen-7b"
    ledger = [json.loads(x) for x in (isolated / "runs/ledger.jsonl").read_text().splitlines()]
    assert ledger[-1]["stage"] == "single" and ledger[-1]["passed"] is False


def test_accept_model_passes_and_records_the_alias(cli, isolated: Path) -> None:
    with start_mock(
        ttft_s=0.001, per_token_s=0.0002, models=("qwen-7b",), any_model=True
    ) as server:
        result = cli("single", "--base-url", server.base_url, "--accept-model", "--json")
    assert result.code == 0, result.err
    assert "'internlm-s2' accepted as an alias of 'qwen-7b' (recorded)" in result.err
    assert (isolated / "baselines/single.jsonl").exists()
    assert result.json["accepted_model"] == "qwen-7b"
    ledger = [json.loads(x) for x in (isolated / "runs/ledger.jsonl").read_text().splitlines()]
    assert ledger[-1]["passed"] is True and ledger[-1]["summary"]["accepted_model"] == "qwen-7b"


def test_a_listing_of_other_models_fails_an_answer_that_names_no_model() -> None:
    """An answer without a ``model`` field: /v1/models is the only word on the weights."""
    from calibrate.http.models import ModelInfo, ServerIdentity
    from calibrate.stages.single import model_mismatch

    listing = ServerIdentity(models=(ModelInfo("qwen-7b"),))
    assert model_mismatch(listing, None, "internlm-s2") == "qwen-7b"
    assert model_mismatch(listing, "internlm-s2", "internlm-s2") is None  # it answered as asked
    assert model_mismatch(listing, "qwen-7b", "qwen-7b") is None
    assert model_mismatch(ServerIdentity(), None, "internlm-s2") is None  # nothing known


def test_right_model_gives_no_weights_warning(cli, mock, isolated: Path) -> None:
    result = cli("single", "--base-url", mock.base_url)
    assert result.code == 0 and "warning" not in result.err
