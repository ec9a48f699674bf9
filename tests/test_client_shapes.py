"""Replies of a wrong shape end as ``invalid_response`` in every stage, never as a traceback;
a lone surrogate in an answer is made valid text (issue 10, item 1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from calibrate.errors import RequestError
from calibrate.http.responses import parse_chunk, parse_completion
from tests.helpers import write_config
from tests.mockserver import start_mock
from tests.tier_helpers import jsonl, open_gate, run_dir

FAST: dict[str, Any] = {"ttft_s": 0.001, "per_token_s": 0.0001}


def _records(root: Path) -> list[dict[str, Any]]:
    return [r for p in sorted((root / "runs").glob("*/records.jsonl")) for r in jsonl(p)]


@pytest.mark.parametrize("stream", [False, True])
def test_single_reports_every_wrong_shape_as_invalid_response(
    cli: Any, isolated: Path, stream: bool
) -> None:
    flags = ["--stream"] if stream else []
    with start_mock(**FAST, malformed_rate=1.0, seed=3) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url)
        results = [cli("single", *flags) for _ in range(20)]  # the seed cycles all seven shapes
    for result in results:
        assert result.code == 1, result.err
        assert "invalid_response" in result.err and "Traceback" not in result.err
    records = _records(isolated)
    assert len(records) == 20
    assert {r["error"]["kind"] for r in records} == {"invalid_response"}
    messages = " | ".join(r["error"]["message"] for r in records)
    for what in (
        "choices[0] is null",
        "choices[0] is an integer",
        "is a string, not an object",
        "content is an integer, not a string or null",
        "no choices",
        "usage.completion_tokens is an integer of 331 digits",
        "usage.prompt_tokens is -7",
    ):
        assert what in messages.replace("no 'choices'", "no choices")


def test_ladder_and_sweep_report_invalid_response_without_a_traceback(
    cli: Any, isolated: Path
) -> None:
    with start_mock(**FAST, malformed_rate=1.0) as mock:
        open_gate(isolated, mock.base_url)
        ladder = cli("ladder", "--json")
        open_gate(isolated, mock.base_url, stage="ladder")
        sweep = cli("sweep", "--json")
    assert ladder.code == 1, ladder.err
    assert "Traceback" not in ladder.err and "invalid_response" in ladder.err
    records = jsonl(run_dir(isolated, ladder.json["run_id"]) / "records.jsonl")
    assert records and {r["error"]["kind"] for r in records} == {"invalid_response"}
    assert sweep.code == 1, sweep.err
    assert "Traceback" not in sweep.err and "invalid_response" in sweep.err


@pytest.mark.parametrize("stream", [False, True])
def test_a_lone_surrogate_becomes_a_replacement_character(
    cli: Any, isolated: Path, stream: bool
) -> None:
    with start_mock(**FAST, lone_surrogate=True) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url)
        result = cli("single", "--json", *(["--stream"] if stream else []))
    assert result.code == 0, result.err
    (record,) = _records(isolated)
    assert record["ok"] and record["text"].endswith("\ufffd")
    # Every file written is valid UTF-8 a strict reader takes back.
    for path in isolated.rglob("*.jsonl"):
        lines = path.read_bytes().decode("utf-8").split("\n")
        assert all(json.loads(line) for line in lines if line.strip())


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        ({"choices": [{"index": "0", "message": {"content": "x"}}]}, "index is a string"),
        (
            {"choices": [{"message": {"content": "x"}, "finish_reason": 1}]},
            "finish_reason is an integer",
        ),
        ({"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": "9"}}, "usage."),
        ({"choices": [{"message": {"content": "x"}}], "usage": [1]}, "'usage' is a list"),
        ({"choices": []}, "empty 'choices'"),
        ({"choices": {"0": {}}}, "'choices' that is an object"),
    ],
)
def test_each_wrong_shape_is_named(payload: dict[str, Any], says: str) -> None:
    with pytest.raises(RequestError) as caught:
        parse_completion(payload, 0.1, None, chat=True)
    assert caught.value.kind == "invalid_response" and says in caught.value.info.message


def test_stream_chunks_are_checked_the_same_way() -> None:
    assert parse_chunk({"choices": [], "usage": None}, chat=True).choices == []
    finish = parse_chunk({"choices": [{"index": 0, "finish_reason": "stop"}]}, chat=True)
    assert finish.choices[0].finish_reason == "stop" and finish.choices[0].text == ""
    for bad in (
        [1],
        {"choices": [None]},
        {"choices": [{"delta": "x"}]},
        {"choices": [{"delta": {"content": 5}}]},
    ):
        with pytest.raises(RequestError) as caught:
            parse_chunk(bad, chat=True)
        assert caught.value.kind == "invalid_response"
