"""Diagnoses that name what happened (issue 26): a failed request is a failed request, a
length cut blames max_tokens only when the answer reached it, a failed repro/verify says what
to check first and which command to run, a changed system_fingerprint is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.batch_helpers import results, write_tasks
from tests.helpers import write_config
from tests.mockserver import start_mock

FAST = {"ttft_s": 0.001, "per_token_s": 0.0002}


def _baseline(cli, isolated: Path) -> int:
    with start_mock(**FAST) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        assert cli("single").code == 0
    return server.port


@pytest.mark.parametrize(
    ("fault", "kind", "status"),
    [({"fail_rate": 1.0}, "http_5xx", 500), ({"overload_rate": 1.0}, None, None)],
)
@pytest.mark.parametrize("command", ["repro", "verify"])
def test_a_failed_request_is_named_as_such_never_other_weights(
    cli, isolated: Path, fault: dict[str, float], kind: str | None, status: int | None, command: str
) -> None:
    port = _baseline(cli, isolated)
    with start_mock(**FAST, **fault, port=port):
        args = ("repro", "--runs", "1") if command == "repro" else ("verify", "--force")
        result = cli(*args, "--json")
    assert result.code == 1
    err = " ".join(result.err.split())
    assert "served_model differs" not in err and "other weights" not in err
    assert "sampling params differ" not in err
    assert "no answer to compare" in err
    failure = (result.json["comparisons"][0] if command == "repro" else result.json["comparison"])[
        "failure"
    ]
    if kind is not None:
        assert failure.startswith(f"{kind}, HTTP {status}: ")
    assert failure in err
    assert "next: a failed request is not a different answer: check the server first" in err
    assert f"then run calibrate {command} again" in err


def test_served_model_is_compared_only_between_two_answers(cli, tmp_path: Path) -> None:
    answer = {"ok": True, "error": None, "text": "x", "served_model": "internlm-s2"}
    other = {**answer, "served_model": "qwen-7b"}
    failed = {
        **answer,
        "ok": False,
        "text": None,
        "served_model": None,
        "error": {"kind": "timeout", "message": "no answer within 30 s", "status": None},
    }
    for name, record in (("a", answer), ("b", other), ("c", failed)):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(record) + "\n")
    weights = cli("repro", "a.jsonl", "b.jsonl")
    assert weights.code == 1
    assert "served_model differs ('internlm-s2' → 'qwen-7b')" in weights.err
    assert "start the server with the weights the baseline was recorded with" in weights.err
    timeout = cli("repro", "a.jsonl", "c.jsonl")
    assert timeout.code == 1
    assert "served_model" not in timeout.err.split("---")[0].split("likely cause")[1]
    assert "failed (timeout: no answer within 30 s)" in timeout.err


def test_a_changed_system_fingerprint_is_named_with_the_next_step(cli, isolated: Path) -> None:
    port = _baseline(cli, isolated)
    with start_mock(**FAST, text_seed=1, port=port):
        plain = cli("repro", "--runs", "1")
        ignored = cli("repro", "--runs", "1", "--ignore", "system_fingerprint")
        verify = cli("verify", "--force")
    for result, again in ((plain, "repro"), (ignored, "repro"), (verify, "verify")):
        err = " ".join(result.err.split())
        assert result.code == 1
        assert "system_fingerprint changed (fp_mock_0 → fp_mock_1)" in err
        assert "next: the server's build changed" in err and f"run calibrate {again}" in err
        assert "re-record the baseline: calibrate single" in err


def test_a_different_answer_with_the_same_build_says_what_to_check(cli, tmp_path: Path) -> None:
    a = {"ok": True, "text": "x", "system_fingerprint": "fp1"}
    (tmp_path / "a.jsonl").write_text(json.dumps(a) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({**a, "text": "y"}) + "\n")
    result = cli("repro", "a.jsonl", "b.jsonl")
    err = " ".join(result.err.split())
    assert result.code == 1 and "system_fingerprint changed" not in err
    assert "next: check the server runs the baseline's engine version" in err
    assert "calibrate repro --ignore FIELD" in err


def test_an_answer_stopped_early_does_not_blame_max_tokens(cli, isolated: Path) -> None:
    with start_mock(**FAST, truncate_rate=1.0) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        result = cli("single")
    err = " ".join(result.err.split())
    assert result.code == 1
    assert "raise max_tokens" not in err and "cut off at max_tokens" not in err
    assert (
        "the server stopped the answer early: finish_reason length at 24 of max_tokens=128" in err
    )


def test_an_answer_that_reached_max_tokens_blames_it(cli, mock, isolated: Path) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url, "[prompt]\nmax_tokens = 5\n")
    result = cli("single")
    assert result.code == 1
    assert "cut off at max_tokens=5 (finish_reason length): raise max_tokens" in result.err


def test_batch_items_stopped_early_name_their_token_count(cli, isolated: Path) -> None:
    with start_mock(**FAST, truncate_rate=1.0) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        tasks = write_tasks(isolated / "tasks.jsonl", 3)
        out = isolated / "out.jsonl"
        assert cli("batch", "--input", str(tasks), "--out", str(out)).code == 1
    messages = [r["error"]["message"] for r in results(out)]
    assert len(messages) == 3
    for message in messages:
        assert "the server stopped the answer early: finish_reason length at " in message
        assert "raise max_tokens" not in message
