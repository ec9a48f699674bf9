"""calibrate batch against the real mock over real HTTP: output, resume, retries, format, input."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

from calibrate.config import Overrides, load
from calibrate.state.ledger import target_fingerprint
from tests.batch_helpers import ok_ids, results, write_tasks
from tests.helpers import write_config
from tests.mockserver import start_mock


def _setup(isolated: Path, base_url: str, n: int = 20, **kw) -> tuple[Path, Path]:
    write_config(isolated / "calibrate.toml", base_url)
    return write_tasks(isolated / "tasks.jsonl", n, **kw), isolated / "out.jsonl"


def test_batch_writes_one_line_per_item_and_a_summary(cli, mock, isolated: Path) -> None:
    tasks, out = _setup(isolated, mock.base_url, 30)
    result = cli(
        "batch",
        "--input",
        str(tasks),
        "--out",
        str(out),
        "--prompt",
        "一句话概括：",
        "-c",
        "4",
        "--fsync",
        "--json",
    )
    assert result.code == 0, result.err
    lines = out.read_text("utf-8").splitlines()
    assert len(lines) == 30 and all(x.startswith('{"id":"t') for x in lines)  # compact
    record = json.loads(lines[0])
    fields = ["id", "ok", "input_fp", "output", "finish_reason", "usage", "seconds", "sent_at"]
    # the run's first line holds its settings in full; every line says what made it
    assert list(record) == [*fields, "settings", "made", "attempts"]
    assert list(json.loads(lines[1])) == [*fields, "made", "attempts"]
    assert record["settings"]["model"] == "internlm-s2" and record["settings"]["prompt"]
    assert record["ok"] and record["output"] and record["finish_reason"] == "stop"
    assert record["usage"]["completion_tokens"] > 0 and record["attempts"] == 1
    assert "定长数组" not in lines[0] or "\\u" not in lines[0]  # UTF-8, not escaped
    summary = result.json
    assert summary["total"] == 30 and summary["done"] == 30 and summary["failed"] == 0
    assert summary["skipped"] == 0 and summary["items_per_s"] > 0
    assert summary["output_tokens_per_s"] > 0 and summary["concurrency"] == 4
    assert "30 total, 0 already done, 30 to run" in result.err
    assert "items/s" in result.err and "output tokens/s" in result.err
    run_dir = isolated / "runs" / summary["run_id"]
    assert json.loads((run_dir / "summary.json").read_text())["summary"]["done"] == 30
    ledger = (isolated / "runs/ledger.jsonl").read_text().splitlines()
    assert json.loads(ledger[-1])["stage"] == "batch"
    # the prompt really goes before each text: the mock tokenises what it receives
    bare = cli("batch", "--input", str(tasks), "--out", str(isolated / "bare.jsonl"), "-c", "4")
    assert bare.code == 0
    with_prompt = {r["id"]: r["usage"]["prompt_tokens"] for r in results(out)}
    without = {r["id"]: r["usage"]["prompt_tokens"] for r in results(isolated / "bare.jsonl")}
    assert all(with_prompt[i] > without[i] for i in without)


def test_a_byte_order_mark_and_crlf_line_ends_are_accepted(cli, mock, isolated: Path) -> None:
    """Windows Notepad's UTF-8: a BOM before the first line, CRLF after each."""
    write_config(isolated / "calibrate.toml", mock.base_url)
    tasks = isolated / "tasks.jsonl"
    lines = [json.dumps({"id": i, "text": f"第{i}段"}, ensure_ascii=False) for i in range(4)]
    tasks.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode("utf-8") + b"\r\n")
    result = cli("batch", "--input", str(tasks), "--out", "out.jsonl", "--json")
    assert result.code == 0, result.err
    assert sorted(ok_ids(isolated / "out.jsonl")) == [0, 1, 2, 3]


def test_rerun_skips_finished_items(cli, mock, isolated: Path) -> None:
    tasks, out = _setup(isolated, mock.base_url, 12)
    assert cli("batch", "--input", str(tasks), "--out", str(out), "--limit", "5").code == 0
    assert len(ok_ids(out)) == 5
    result = cli("batch", "--input", str(tasks), "--out", str(out), "--json")
    assert result.code == 0
    assert result.json["skipped"] == 5 and result.json["done"] == 7
    assert "12 total, 5 already done, 7 to run" in result.err
    assert sorted(Counter(ok_ids(out)).values()) == [1] * 12


def test_faults_are_retried_until_every_item_is_ok(cli, isolated: Path) -> None:
    with start_mock(
        ttft_s=0.005,
        per_token_s=0.0002,
        fail_rate=0.2,
        reset_rate=0.1,
        overload_rate=0.1,
        retry_after_s=1,
        seed=3,
    ) as server:
        tasks, out = _setup(isolated, server.base_url, 30)
        result = cli(
            "batch",
            "--input",
            str(tasks),
            "--out",
            str(out),
            "-c",
            "8",
            "--retries",
            "10",
            "--backoff-s",
            "0.01",
            "--json",
        )
    assert result.code == 0, result.err
    rows = results(out)
    assert len(rows) == 30 and all(r["ok"] for r in rows)
    retried = [r for r in rows if r["attempts"] > 1]
    assert retried, "with 40 % faults some items must have needed retries"
    kinds = {k for r in retried for k in r["retried"]}
    assert kinds <= {"http_5xx", "reset", "overloaded"} and len(kinds) >= 2
    assert all(len(r["retried"]) == r["attempts"] - 1 for r in retried)
    assert result.json["retried_items"] == len(retried)


def test_without_retries_failures_are_recorded_and_a_rerun_retries_only_those(
    cli, isolated: Path
) -> None:
    with start_mock(
        ttft_s=0.002,
        per_token_s=0.0002,
        fail_rate=0.2,
        reset_rate=0.1,
        overload_rate=0.1,
        retry_after_s=1,
        seed=5,
    ) as server:
        tasks, out = _setup(isolated, server.base_url, 40)
        first = cli("batch", "--input", str(tasks), "--out", str(out), "--retries", "0", "--json")
        assert first.code == 1, first.err
        failed = [r for r in results(out) if not r["ok"]]
        assert failed and first.json["failed"] == len(failed)
        assert all(r["attempts"] == 1 and r["error"]["kind"] for r in failed)
        assert sum(first.json["failed_by_kind"].values()) == len(failed)
        assert "rerun to retry only those: calibrate batch" in first.err
        ok_before = set(ok_ids(out))
        second = cli(
            "batch",
            "--input",
            str(tasks),
            "--out",
            str(out),
            "--retries",
            "10",
            "--backoff-s",
            "0.01",
            "--json",
        )
    assert second.code == 0, second.err
    assert second.json["skipped"] == len(ok_before) and second.json["to_run"] == len(failed)
    new_lines = results(out)[40:]
    assert {r["id"] for r in new_lines} == {r["id"] for r in failed}
    assert sorted(Counter(ok_ids(out)).values()) == [1] * 40


def test_truncated_answers_fail_as_incomplete_without_retrying(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.001, per_token_s=0.0001, truncate_rate=1.0) as server:
        tasks, out = _setup(isolated, server.base_url, 5)
        result = cli("batch", "--input", str(tasks), "--out", str(out), "--json")
    assert result.code == 1
    rows = results(out)
    assert {r["error"]["kind"] for r in rows} == {"incomplete"}
    assert all(r["attempts"] == 1 and r["finish_reason"] == "length" for r in rows)


def test_the_rate_of_a_run_with_failed_items_says_how_many_were_ok(cli, isolated: Path) -> None:
    """Failed items are no work done: a run where every answer was cut short read "N items/s"
    as if that were its throughput. The rate now says it counts finished items, and the ok
    items' own rate stands beside it (``ok_per_s`` in --json)."""
    with start_mock(ttft_s=0.001, per_token_s=0.0001, truncate_rate=1.0) as server:
        tasks, out = _setup(isolated, server.base_url, 6)
        said = cli("batch", "--input", str(tasks), "--out", str(out))
        again = cli("batch", "--input", str(tasks), "--out", str(out), "--json")
    assert said.code == 1 and again.code == 1
    assert "items/s finished, 0.0 ok/s" in said.err, said.err
    assert again.json["failed"] == 6 and again.json["ok_per_s"] == 0.0
    assert again.json["items_per_s"] > 0


def test_expect_json_parses_fences_and_fails_bad_json_as_format(cli, mock, isolated: Path) -> None:
    tasks, out = _setup(
        isolated, mock.base_url, 10, prompt_of=lambda i: "[badjson] 输出JSON：" if i == 3 else None
    )
    args = (
        "batch",
        "--input",
        str(tasks),
        "--out",
        str(out),
        "--prompt",
        "[json] 输出JSON：",
        "--expect",
        "json",
        "--json",
    )
    result = cli(*args)
    assert result.code == 1
    rows = {r["id"]: r for r in results(out)}
    good = rows["t0"]
    assert good["ok"] and good["output"].startswith("```json")
    assert isinstance(good["parsed"], dict) and "summary" in good["parsed"]
    bad = rows["t3"]
    assert not bad["ok"] and bad["error"]["kind"] == "format" and "parsed" not in bad
    assert result.json["failed_by_kind"] == {"format": 1}
    again = cli(*args)
    assert again.code == 1 and again.json["to_run"] == 1 and again.json["skipped"] == 9
    assert [r["id"] for r in results(out)[10:]] == ["t3"]


def test_sample_reports_a_preamble_and_leaves_out_untouched(cli, mock, isolated: Path) -> None:
    tasks, out = _setup(
        isolated,
        mock.base_url,
        40,
        prompt_of=lambda i: "[zh-preamble] 概括：" if i in (2, 5) else None,
    )
    result = cli(
        "batch",
        "--input",
        str(tasks),
        "--out",
        str(out),
        "--prompt",
        "概括：",
        "--sample",
        "10",
        "--max-chars",
        "2000",
        "--json",
    )
    assert result.code == 1
    assert not out.exists()
    checks = {c["name"]: c for c in result.json["checks"]}
    assert not checks["no preamble"]["passed"]
    assert "2 of 10 outputs open with a preamble" in checks["no preamble"]["detail"]
    assert "'t2'" in checks["no preamble"]["detail"] and "好的，以下是" in result.err
    assert checks["within 2000 chars"]["passed"]
    assert result.json["done"] == 10 and result.json["total"] == 40
    sample_file = isolated / "runs" / result.json["run_id"] / "sample.jsonl"
    assert len(sample_file.read_text("utf-8").splitlines()) == 10
    clean = cli("batch", "--input", str(tasks), "--prompt", "概括：", "--sample", "2")
    assert clean.code == 0 and "sample passed" in clean.err


BAD_INPUTS = {
    "not JSON": (b'{"id": 1, "text": "a"}\n{"id": 2, "text": \n', "line 2: not JSON"),
    "missing id": (b'{"id": 1, "text": "a"}\n{"text": "b"}\n', "line 2: no 'id'"),
    "missing text": (b'{"id": 1, "text": "a"}\n{"id": 2}\n', "line 2: no 'text'"),
    "float id": (b'{"id": 1.5, "text": "a"}\n', "line 1: 'id' must be"),
    "bool id": (b'{"id": true, "text": "a"}\n', "line 1: 'id' must be"),
    "list item": (b'[1, "a"]\n', "line 1: expected an object"),
    "duplicate id": (
        b'{"id": "a", "text": "x"}\n\n{"id": "a", "text": "y"}\n',
        "line 3: duplicate id 'a' (first on line 1)",
    ),
    "invalid UTF-8": (
        b'{"id": 1, "text": "ok"}\n{"id": 2, "text": "\xff\xfe"}\n',
        "line 2: not valid UTF-8",
    ),
    "lone surrogate": (b'{"id": 1, "text": "\\ud800"}\n', "line 1: a lone surrogate"),
    # a Chinese user's editor saving in another encoding: the line named, nothing sent
    "GBK": (
        '{"id": 1, "text": "ok"}\n{"id": 2, "text": "一句话"}\n'.encode("gbk"),
        "line 2: not valid UTF-8",
    ),
    "GB18030": ('{"id": 1, "text": "一句话"}\n'.encode("gb18030"), "line 1: not valid UTF-8"),
    "UTF-16": ('{"id": 1, "text": "摘要"}\n'.encode("utf-16"), "line 1: not valid UTF-8"),
    "empty": (b"\n\n", "holds no items"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_exits_2_and_touches_nothing(cli, mock, isolated: Path, case: str) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    content, message = BAD_INPUTS[case]
    tasks = isolated / "tasks.jsonl"
    tasks.write_bytes(content)
    out = isolated / "out.jsonl"
    before = mock.model.snapshot().requests_total
    result = cli("batch", "--input", str(tasks), "--out", str(out))
    assert result.code == 2, result.err
    assert f"{tasks}" in result.err and message in result.err
    assert "Traceback" not in result.err
    assert not out.exists() and not (isolated / "runs").exists()
    assert mock.model.snapshot().requests_total == before
    existing = b'{"id":1,"ok":true,"output":"x","attempts":1}\n'
    out.write_bytes(existing)
    assert cli("batch", "--input", str(tasks), "--out", str(out)).code == 2
    assert out.read_bytes() == existing


def test_output_with_foreign_ids_exits_2_unless_allowed(cli, mock, isolated: Path) -> None:
    tasks, out = _setup(isolated, mock.base_url, 5)
    foreign = '{"id":"other-7","ok":true,"output":"x","attempts":1}\n'
    out.write_text(foreign, encoding="utf-8")
    result = cli("batch", "--input", str(tasks), "--out", str(out))
    assert result.code == 2
    assert (
        "not items of" in result.err and "other-7" in result.err and "--allow-foreign" in result.err
    )
    assert out.read_text("utf-8") == foreign
    allowed = cli("batch", "--input", str(tasks), "--out", str(out), "--allow-foreign")
    assert allowed.code == 0 and len(ok_ids(out)) == 6


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-c", "0"], "-c/--concurrency must be ≥ 1"),
        (["-c", "1000000000"], "-c/--concurrency must be ≤ 4096"),
        (["--backoff-s", "nan"], "--backoff-s must be ≥ 0"),
        (["--retries", "-1"], "--retries must be ≥ 0"),
        (["--drift-window-s", "0.1"], "--drift-window-s must be ≥ 0.5 and ≤ 60"),
        (["--drift-window-s", "nan"], "--drift-window-s must be ≥ 0.5 and ≤ 60"),
        (["--drift-window-s", "61"], "--drift-window-s must be ≤ 60 (the maximum), got 61"),
        (["--no-out"], "--out is required"),
        (["--same"], "same file as --input"),
    ],
)
def test_bad_flags_exit_2(cli, isolated: Path, args: list[str], message: str) -> None:
    tasks = write_tasks(isolated / "tasks.jsonl", 2)
    out = ["--out", "out.jsonl"]
    if args == ["--no-out"]:
        args, out = [], []
    elif args == ["--same"]:
        args, out = [], ["--out", str(tasks)]
    result = cli("batch", "--input", str(tasks), *out, *args)
    assert result.code == 2 and message in result.err


def test_default_concurrency_comes_from_the_pin(cli, mock, isolated: Path) -> None:
    tasks, out = _setup(isolated, mock.base_url, 6)
    first = cli("batch", "--input", str(tasks), "--out", str(out), "--limit", "2", "--json")
    assert first.json["concurrency"] == 4 and "not calibrated" in first.err
    target = target_fingerprint(load(Overrides(), {}))
    pin = {
        "ts": "2026-11-29T00:00:00.000Z",
        "stage": "pin",
        "run_id": "r",
        "target": target,
        "passed": True,
        "summary": {"concurrency": 3, "batch_size": 4},
    }
    with (isolated / "runs/ledger.jsonl").open("a") as handle:
        handle.write(json.dumps(pin) + "\n")
    second = cli("batch", "--input", str(tasks), "--out", str(out), "--json")
    assert second.code == 0
    assert second.json["concurrency"] == 3 and second.json["concurrency_source"] == "pin"
    assert "not calibrated" not in second.err


def test_junit_names_the_failure_kinds(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.001, per_token_s=0.0001, fail_rate=1.0) as server:
        tasks, out = _setup(isolated, server.base_url, 4)
        result = cli(
            "batch",
            "--input",
            str(tasks),
            "--out",
            str(out),
            "--retries",
            "0",
            "--junit",
            "junit.xml",
        )
    assert result.code == 1
    suite = ET.parse(isolated / "junit.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("name") == "batch"
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert set(cases) == {"all items ok", "items failed: http_5xx"}
    failure = cases["all items ok"].find("failure")
    assert failure is not None and "4 of 4 items failed (http_5xx 4)" in failure.get("message", "")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["run_dir"].startswith("runs")


def test_a_server_that_sends_no_usage_leaves_the_tokens_unknown_never_zero(
    cli, isolated: Path
) -> None:
    """No usage in any answer: how many output tokens they had is unknown — the summary and
    --json say so, never "0 output tokens/s" (which they said before)."""
    with start_mock(ttft_s=0.001, per_token_s=0.0001, no_usage=True) as server:
        tasks, out = _setup(isolated, server.base_url, 4)
        result = cli("batch", "--input", str(tasks), "--out", str(out), "--json")
    assert result.code == 0, result.err
    assert result.json["output_tokens_per_s"] is None and result.json["answers_without_usage"] == 4
    said = " ".join(result.err.split())
    assert "output tokens not reported (the server sent no usage)" in said, said
    assert "0 output tokens/s" not in said


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_model_the_server_does_not_serve_ends_the_run_with_no_item_failed(
    cli, isolated: Path, workers: str
) -> None:
    """A mistyped --model: the server refuses every item as naming a model it does not serve.
    Before, each was recorded failed (http_4xx) at "893 items/s" with 0 ok, exit 1, and the
    rerun had to retry them all. The first refusal of the run's own model, before any item was
    answered ok, ends the run: exit 1 saying so and what to do, no item marked failed; the
    rerun with the right model does every item."""
    with start_mock(ttft_s=0.001, per_token_s=0.0001) as server:
        tasks, out = _setup(isolated, server.base_url, 40)
        args = ("batch", "--input", str(tasks), "--out", str(out), "-c", "4", "--workers", workers)
        wrong = cli(*args, "--model", "no-such-model", "--json")
        assert wrong.code == 1, wrong.err
        said = " ".join(wrong.err.split())
        assert "the server does not serve the model asked for" in said, said
        assert "no item was marked failed" in said and "Set --model" in said, said
        assert wrong.json["failed"] == 0 and wrong.json["stopped_by"] == "unknown_model"
        assert not out.exists() or not [r for r in results(out) if not r["ok"]]
        right = cli(*args, "--json")
    assert right.code == 0, right.err
    assert right.json["done"] == 40 and right.json["failed"] == 0
