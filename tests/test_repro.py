"""Stage B: repro against the baseline and between files; gates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import passing_ladder
from tests.helpers import FAKE_KEY, all_files_text, write_config
from tests.mockserver import start_mock


def _baseline(cli, base_url: str, isolated: Path) -> None:
    write_config(isolated / "calibrate.toml", base_url)
    assert cli("single").code == 0


def test_repro_identical(cli, mock, isolated: Path) -> None:
    _baseline(cli, mock.base_url, isolated)
    result = cli("repro", "--json")
    assert result.code == 0, result.err
    assert result.json["verdict"] == "identical" and result.json["runs"] == 2
    assert "repro passed: 2/2 identical" in result.err


def test_repro_detects_changed_answer(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.001, per_token_s=0.0002) as server:
        _baseline(cli, server.base_url, isolated)
    with start_mock(ttft_s=0.001, per_token_s=0.0002, text_seed=1, port=server.port) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        result = cli("repro", "--runs", "1", "--json")
    assert result.code == 1
    assert "text" in result.json["differing"]
    diff_lines = [line for line in result.err.splitlines() if line.startswith(("-", "+"))]
    assert any('"text"' in line for line in diff_lines if line.startswith("-"))
    assert any('"text"' in line for line in diff_lines if line.startswith("+"))
    ledger = [json.loads(x) for x in (isolated / "runs/ledger.jsonl").read_text().splitlines()]
    assert ledger[-1]["stage"] == "repro" and ledger[-1]["passed"] is False


def test_repro_whitespace_only_passes_with_note(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.001, per_token_s=0.0002) as server:
        _baseline(cli, server.base_url, isolated)
    with start_mock(
        ttft_s=0.001, per_token_s=0.0002, whitespace_variant=True, port=server.port
    ) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        result = cli("repro", "--runs", "1", "--json")
    assert result.code == 0, result.err
    assert result.json["verdict"] == "whitespace-only"
    assert "whitespace-only" in result.err


def test_repro_cause_hint_for_prompt_tokens(cli, isolated: Path, tmp_path: Path) -> None:
    base = {"text": "a", "usage": {"prompt_tokens": 10, "completion_tokens": 1}, "ts": "x"}
    other = {"text": "b", "usage": {"prompt_tokens": 12, "completion_tokens": 1}, "ts": "y"}
    (tmp_path / "a.jsonl").write_text(json.dumps(base) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps(other) + "\n")
    result = cli("repro", "a.jsonl", "b.jsonl")
    assert result.code == 1
    assert "chat template or tokenizer changed" in result.err


def test_repro_offline_files_and_ignore(cli, tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "x", "ts": 1, "system_fingerprint": "a"}\n')
    (tmp_path / "b.jsonl").write_text('{"text": "x", "ts": 2, "system_fingerprint": "b"}\n')
    assert cli("repro", "a.jsonl", "b.jsonl").code == 1
    assert cli("repro", "a.jsonl", "b.jsonl", "--ignore", "system_fingerprint").code == 0
    assert cli("repro", "a.jsonl", "b.jsonl", "--jq", "{text}").code == 0
    assert not (tmp_path / "runs").exists(), "offline comparison writes nothing"


def test_bad_jq_program_exits_2_with_jq_message(cli, tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    result = cli("repro", "a.jsonl", "a.jsonl", "--jq", "del(.text")
    assert result.code == 2 and "does not compile" in result.err


def test_repro_bad_file_is_exit_2(cli, tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("{not json\n")
    result = cli("repro", "a.jsonl", "missing.jsonl")
    assert result.code == 2 and "a.jsonl:1" in result.err


def test_gate_closed_without_baseline_and_force(cli, mock, isolated: Path) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    result = cli("repro")
    assert result.code == 3 and "calibrate single" in result.err
    forced = cli("repro", "--force")  # forcing cannot conjure a baseline to compare with
    assert forced.code == 2 and "FORCED" in forced.err and "calibrate single" in forced.err
    assert "Traceback" not in forced.err


def test_no_api_key_on_disk(cli, mock, isolated: Path, monkeypatch) -> None:
    monkeypatch.setenv("CALIBRATE_API_KEY", FAKE_KEY)
    _baseline(cli, mock.base_url, isolated)
    assert cli("repro").code == 0
    assert cli("status").code == 0
    text = all_files_text(isolated)
    assert FAKE_KEY not in text and FAKE_KEY[-12:] not in text


@pytest.mark.parametrize(
    ("stage", "case"),
    [
        ("repro", "stream refused"),  # verify sends what the baseline sent: no --stream
        ("repro", "client timeout"),
        ("verify", "client timeout"),
        ("repro", "server error"),
        ("verify", "server error"),
    ],
)
def test_a_failed_request_is_blamed_on_what_caused_it(cli, isolated: Path, stage, case) -> None:
    """A request that failed because of what the client asked (a stream option the server
    refuses) or its own limit ([target] timeout_s) names that and what to change, as `single`
    does; it said "check the server first (calibrate server status; calibrate server logs)".
    A failure only the server can explain (an HTTP 500) still sends the user to the server."""
    mock_args: dict[str, Any] = {"ttft_s": 0.001, "per_token_s": 0.0002}
    with start_mock(**mock_args) as server:
        _baseline(cli, server.base_url, isolated)
        if stage == "verify":
            passing_ladder(isolated, cli("single", "--json").json["record"]["target"], 1)
    argv = [stage, "--json"] + (["--stream", "--runs", "1"] if case == "stream refused" else [])
    again = {
        "stream refused": {"refuse_stream_options": True},
        "client timeout": {"ttft_s": 0.5},
        "server error": {"fail_rate": 1.0},
    }[case]
    if case == "client timeout":
        config = isolated / "calibrate.toml"
        config.write_text(config.read_text().replace("timeout_s = 30", "timeout_s = 0.1"))
    with start_mock(**{**mock_args, **again}, port=server.port):
        result = cli(*argv)
    assert result.code == 1, result.err
    said = " ".join(result.err.split())
    nxt = said[said.index("next: ") :]
    if case == "server error":
        assert "check the server first (calibrate server status; calibrate server logs)" in nxt
        assert "cause" not in result.json
        return
    expect = {
        "stream refused": "the streamed request was refused (",
        "client timeout": "the request failed (timeout): no answer from http",
    }[case]
    assert nxt.startswith(f"next: {expect}") and nxt.endswith(f"then run calibrate {stage} again")
    if case == "client timeout":
        assert "the client's own limit, [target] timeout_s = 0.1 s: raise it" in nxt
    assert "check the server first" not in said and result.json["cause"].startswith(expect)


def test_a_jq_program_with_several_outputs_compares_them_all(cli, isolated: Path) -> None:
    """``--jq '.served_model, .text'`` gives two outputs per record; repro compared the first
    alone and said "2/2 identical" for an answer whose text had changed."""
    with start_mock(ttft_s=0.001, per_token_s=0.0002) as server:
        _baseline(cli, server.base_url, isolated)
    with start_mock(ttft_s=0.001, per_token_s=0.0002, text_seed=1, port=server.port) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        result = cli("repro", "--runs", "1", "--jq", ".served_model, .text", "--json")
        same = cli("repro", "--runs", "1", "--jq", ".served_model, .prompt")
    assert result.code == 1, result.err
    assert result.json["verdict"] == "differs" and "identical" not in result.err
    assert same.code == 0 and "repro passed: 1/1 identical" in same.err


@pytest.mark.parametrize("program", ['error("no")', "empty", ".text | ascii_downcase | .x"])
def test_a_jq_program_that_fails_on_the_baseline_sends_nothing(
    cli, mock, isolated: Path, program: str
) -> None:
    """A --jq that fails on every record was found only on the first answer: exit 2 after a
    request was sent and a run folder written (SPEC §2: exit 2, nothing sent, nothing written)."""
    _baseline(cli, mock.base_url, isolated)
    runs = {p.name for p in (isolated / "runs").iterdir()}
    sent = mock.model.snapshot().requests_total
    for stage in ("repro", "verify"):
        result = cli(stage, "--jq", program)
        assert result.code == 2, result.err
        assert "the jq program" in result.err and len(result.err.strip().splitlines()) <= 2
    assert {p.name for p in (isolated / "runs").iterdir()} == runs
    assert mock.model.snapshot().requests_total == sent
