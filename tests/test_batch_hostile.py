"""Hostile servers and broken handling: every item ends ok or recorded failed, and the exit says so."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from calibrate.errors import ExitCode
from calibrate.http.client import OpenAIClient
from calibrate.http.models import Choice, Completion, SamplingParams, Usage
from calibrate.load.retry import RetryPolicy
from calibrate.stages.batch.request import stopped_error
from calibrate.stages.batch.sending.outage import Breaker, OutagePolicy
from calibrate.stages.batch.stage import BatchSpec, open_batch, run_batch
from tests.batch_helpers import (
    HostileServer,
    Reply,
    ScriptedTransport,
    assert_valid_jsonl,
    completion,
    raw_completion,
    scripted_lane,
    write_tasks,
)
from tests.helpers import write_config

DEEP = "[" * 100_000 + "]" * 100_000


def _tasks(path: Path, markers: list[str]) -> Path:
    with path.open("w", encoding="utf-8") as handle:
        for i, marker in enumerate(markers):
            handle.write(json.dumps({"id": f"t{i}", "text": f"{marker} item {i}"}) + "\n")
    return path


def _spec(tasks: Path, out: Path, **extra: Any) -> BatchSpec:
    """Two in flight over ``tasks``, answers to ``out``, the rest as ``extra`` says."""
    params = SamplingParams(0.0, 16, 1.0, None)
    return BatchSpec(
        input_path=tasks, out_path=out, model="m", params=params, concurrency=2, **extra
    )


def _timeout(root: Path, seconds: float) -> None:
    path = root / "calibrate.toml"
    path.write_text(
        path.read_text("utf-8").replace("timeout_s = 30", f"timeout_s = {seconds}"), "utf-8"
    )


def _last_ledger(isolated: Path) -> dict[str, Any]:
    lines = (isolated / "runs/ledger.jsonl").read_bytes().split(b"\n")
    return json.loads(lines[-2])


def test_malformed_answers_are_recorded_failures_and_the_file_stays_valid(
    cli, isolated: Path
) -> None:
    def reply(text: str) -> Reply:
        marker = text.split()[0]
        return {
            "[null]": raw_completion("[null]"),
            "[one]": raw_completion("[1]"),
            "[deep-body]": raw_completion(DEEP),
            "[surrogate]": completion('{"summary": "\ud800 ok"}'),
            "[deep]": completion(DEEP),
            "[nan]": completion('{"summary": NaN}'),
            "[inf]": completion('{"summary": 1e999}'),
            "[sep]": completion('{"summary": "a\u2028b\u0085c"}'),
        }.get(marker, completion('{"summary": "fine"}'))

    markers = [
        "[null]",
        "[one]",
        "[deep-body]",
        "[surrogate]",
        "[deep]",
        "[nan]",
        "[inf]",
        "[sep]",
    ] + ["ok"] * 12
    tasks = _tasks(isolated / "tasks.jsonl", markers)
    out = isolated / "out.jsonl"
    with HostileServer(reply) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        result = cli(
            "batch",
            "--input",
            str(tasks),
            "--out",
            str(out),
            "-c",
            "4",
            "--retries",
            "0",
            "--expect",
            "json",
            "--json",
        )
    assert result.code == 1, result.err
    assert "Traceback" not in result.err and "remaining (--limit)" not in result.err
    rows = {r["id"]: r for r in assert_valid_jsonl(out)}
    assert sorted(rows) == sorted(f"t{i}" for i in range(20)), "every item has exactly one line"
    for item in ("t0", "t1", "t2"):  # null / wrong-typed choices, a body nested absurdly deep
        error = rows[item]["error"]
        assert error["kind"] in ("internal", "invalid_response"), error
        if error["kind"] == "internal":
            assert error["message"].split(":")[0].endswith("Error"), error
    assert rows["t3"]["ok"] and "\ufffd ok" in rows["t3"]["output"]  # stored, as valid UTF-8
    assert rows["t3"]["parsed"] == {"summary": "\ufffd ok"}
    assert (
        rows["t4"]["error"]["kind"] == "format"
        and "nested too deeply" in rows["t4"]["error"]["message"]
    )
    for item in ("t5", "t6"):  # NaN / Infinity would make "parsed" unreadable by strict parsers
        assert rows[item]["error"]["kind"] == "format" and "parsed" not in rows[item]
    assert rows["t7"]["ok"] and rows["t7"]["parsed"] == {"summary": "a\u2028b\u0085c"}
    assert all(rows[f"t{i}"]["ok"] for i in range(8, 20))
    summary = result.json
    assert summary["done"] == 14 and summary["failed"] == 6 and summary["unfinished"] == 0
    assert _last_ledger(isolated)["passed"] is False


def test_a_line_separator_inside_a_record_does_not_split_it_on_resume(cli, isolated: Path) -> None:
    tasks = write_tasks(isolated / "tasks.jsonl", 6)
    out = isolated / "out.jsonl"
    with HostileServer(lambda text: completion("one\u2028two\u0085three\u2029")) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        first = cli("batch", "--input", str(tasks), "--out", str(out), "--json")
        assert first.code == 0, first.err
        again = cli("batch", "--input", str(tasks), "--out", str(out), "--json")
    assert again.code == 0, again.err
    assert again.json["skipped"] == 6 and again.json["to_run"] == 0
    assert "unreadable" not in again.err
    assert len(assert_valid_jsonl(out)) == 6


def raising(body: dict[str, Any]) -> Any:
    """An answer for an item that is an exception named in the item's text."""
    text = body["messages"][0]["content"]
    if "[type]" in text:
        raise TypeError("'NoneType' object is not subscriptable")
    if "[recursion]" in text:
        raise RecursionError("maximum recursion depth exceeded")
    if "[encode]" in text:
        "\ud800".encode()
    if "[memory]" in text:
        raise MemoryError()
    return OpenAIClient  # not a Completion at all: reading it fails too


class BrokenBreaker(Breaker):
    """An outage breaker with calibrate's own bug: asked whether it is down a 7th time, it
    raises — a fault in the sending itself, not in any one item."""

    calls = 0

    @property  # type: ignore[override]
    def down(self) -> bool:
        self.calls += 1
        if self.calls > 6:
            raise KeyError("a bug in the sending loop")
        return False


def test_a_bug_in_the_sending_itself_stops_the_run_as_a_recorded_failure(isolated: Path) -> None:
    """Not an item's failure (those are its ``internal`` line) but the loop's: the run stops,
    recorded as failed (``internal``, exit 1 by its error), what finished kept, none counted ok
    that never got its line, the rest left to the rerun."""
    tasks = _tasks(isolated / "tasks.jsonl", ["[ok]"] * 20)
    out = isolated / "out.jsonl"
    spec = _spec(tasks, out)
    answer = Completion((Choice(0, "fine", "stop"),), Usage(3, 1, 4), "m", None, 0.001)
    lane = scripted_lane(ScriptedTransport(lambda body: answer), 2)
    lane = replace(lane, breaker=BrokenBreaker(lane.label, OutagePolicy(), lambda: None))
    with open_batch(spec) as plan:
        result = run_batch(plan, None, out, lanes=[lane])
    assert result.stopped_by == "internal", result.stop_detail
    assert "KeyError" in result.stop_detail and "a bug in the sending loop" in result.stop_detail
    rows = assert_valid_jsonl(out)
    assert all(row["ok"] for row in rows) and len(rows) == result.ok == result.finished
    assert 0 < result.ok < 20 and result.remaining == 20 - result.ok
    error = stopped_error(result, spec, "calibrate batch …")
    assert error is not None and error.exit_code == ExitCode.FAILED
    assert "calibrate's own bug" in error.render() and "resume with" in error.render()


def test_any_exception_while_sending_or_reading_an_item_is_its_recorded_internal_failure(
    isolated: Path,
) -> None:
    markers = ["[type]", "[recursion]", "[encode]", "[memory]", "[other]"] * 4
    tasks = _tasks(isolated / "tasks.jsonl", markers)
    out = isolated / "out.jsonl"
    spec = _spec(tasks, out, retry=RetryPolicy(retries=0))
    transport = ScriptedTransport(raising)
    with open_batch(spec) as plan:
        result = run_batch(plan, None, out, lanes=[scripted_lane(transport, 2)])
    assert transport.calls == 20, "the two slots lived on through every exception"
    rows = {r["id"]: r for r in assert_valid_jsonl(out)}
    assert len(rows) == 20 and result.failed == 20 and result.unfinished == 0
    assert result.failed_by_kind == {"internal": 20}
    kinds = Counter(r["error"]["message"].split(":")[0] for r in rows.values())
    assert kinds == Counter(
        {
            "TypeError": 4,
            "RecursionError": 4,
            "UnicodeEncodeError": 4,
            "MemoryError": 4,
            "AttributeError": 4,
        }
    )


def test_items_left_neither_ok_nor_failed_fail_the_run_and_say_why(cli, isolated: Path) -> None:
    tasks = write_tasks(isolated / "tasks.jsonl", 400)
    out = isolated / "out.jsonl"
    full = tasks.read_bytes()

    def reply(text: str) -> Reply:
        tasks.write_bytes(full[: len(full) // 2])  # the input shrinks while the run reads it
        return completion("done")

    with HostileServer(reply) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        result = cli("batch", "--input", str(tasks), "--out", str(out), "-c", "1", "--json")
    assert result.code == 1, result.err
    unfinished = result.json["unfinished"]
    assert unfinished > 0 and result.json["done"] + unfinished == 400
    assert f"{unfinished} of 400 item(s) were neither done nor failed" in result.err
    assert "did it change during the run?" in result.err
    assert "(--limit)" not in result.err
    assert _last_ledger(isolated)["passed"] is False


FUZZ_KINDS = (
    "ok",
    "ok",
    "ok",
    "null",
    "one",
    "nonjson",
    "surrogate",
    "deep",
    "http500",
    "drop",
    "message-int",
    "content-int",
    "empty",
    "429",
    "choices-obj",
    "usage-str",
    "length",
    "json-nan",
    "deep-body",
    "slow-headers",
    "huge-usage",
    "negative-usage",
    "huge-index",
)
GOOD_CHOICE = '[{"index":0,"message":{"content":"{}"},"finish_reason":"stop"}]'


def _with_usage(usage: str, choices: str = GOOD_CHOICE) -> Reply:
    return Reply(f'{{"model":"internlm-s2","choices":{choices},"usage":{usage}}}'.encode())


def fuzz_reply(rng: random.Random, lock: Any) -> Any:
    def reply(text: str) -> Reply:
        with lock:
            kind = rng.choice(FUZZ_KINDS)
        return {
            "ok": completion('{"summary": "fine"}'),
            "null": raw_completion("[null]"),
            "one": raw_completion("[1]"),
            "nonjson": Reply(b"<html>oops</html>"),
            "surrogate": completion('{"s": "\udc80\ud800"}'),
            "deep": completion(DEEP[:5000] + DEEP[-5000:]),
            "deep-body": raw_completion(DEEP),
            "http500": Reply(b'{"error": {"message": "boom"}}', 500),
            "drop": Reply(drop=True),
            "message-int": raw_completion('[{"index":0,"message":7,"finish_reason":"stop"}]'),
            "content-int": raw_completion(
                '[{"index":0,"message":{"content":[1,2]},"finish_reason":"stop"}]'
            ),
            "empty": Reply(b""),
            "429": Reply(b"{}", 429),
            "choices-obj": raw_completion('{"0": {}}'),
            "usage-str": Reply(
                b'{"choices":[{"message":{"content":"{}"},"finish_reason":"stop"}],"usage":"lots"}'
            ),
            "length": completion("{", "length"),
            "json-nan": completion("[NaN, Infinity]"),
            # the status line and headers a byte every 0.2 s: cut at timeout_s, a timeout
            "slow-headers": Reply(completion('{"summary": "fine"}').body, header_drip_s=0.2),
            "huge-usage": _with_usage('{"prompt_tokens":3,"completion_tokens":1' + "0" * 330 + "}"),
            "negative-usage": _with_usage('{"prompt_tokens":3,"completion_tokens":-8768}'),
            "huge-index": _with_usage(
                '{"prompt_tokens":3,"completion_tokens":2}',
                '[{"index":1' + "0" * 40 + ',"message":{"content":"{}"},"finish_reason":"stop"}]',
            ),
        }[kind]

    return reply


def test_fuzz_every_item_ends_ok_or_failed_and_the_exit_code_matches(cli, isolated: Path) -> None:
    import threading

    tasks = write_tasks(isolated / "tasks.jsonl", 200)
    out = isolated / "out.jsonl"
    args = (
        "batch",
        "--input",
        str(tasks),
        "--out",
        str(out),
        "-c",
        "8",
        "--retries",
        "1",
        "--backoff-s",
        "0.001",
        "--expect",
        "json",
        "--json",
    )
    with HostileServer(fuzz_reply(random.Random(1234), threading.Lock())) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        _timeout(isolated, 2)
        start = time.monotonic()
        first = cli(*args)
        elapsed = time.monotonic() - start
    rows = assert_valid_jsonl(out)
    # every attempt's kind: the last one's, and the retried ones' (a slow header is retried)
    kinds = Counter(r["error"]["kind"] for r in rows if not r["ok"])
    kinds.update(kind for r in rows for kind in r.get("retried", ()))
    assert kinds["timeout"] > 0 and kinds["invalid_response"] > 0, kinds  # slow headers, huge
    assert elapsed < 60  # slow headers are cut at timeout_s, not after their drip's 16 s
    assert Counter(r["id"] for r in rows) == Counter(f"t{i}" for i in range(200))
    ok = sum(r["ok"] for r in rows)
    assert first.json["done"] == ok and first.json["failed"] == 200 - ok
    assert first.json["unfinished"] == 0 and "Traceback" not in first.err
    assert first.code == (0 if ok == 200 else 1)
    assert 0 < ok < 200, "the seed mixes good and bad answers"
    assert _last_ledger(isolated)["passed"] is False
    with HostileServer(lambda text: completion('{"summary": "fine"}')) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        second = cli(*args)
    assert second.code == 0, second.err
    assert second.json["skipped"] == ok and second.json["done"] == 200 - ok
    assert sorted(r["id"] for r in assert_valid_jsonl(out) if r["ok"]) == sorted(
        f"t{i}" for i in range(200)
    )
    assert _last_ledger(isolated)["passed"] is True
