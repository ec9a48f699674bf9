"""The OpenAI Batch API's JSONL (as ``vllm run-batch`` reads and writes it) runs through batch
with every guarantee of calibrate's own {id, text} tasks: a request file written for vllm
run-batch goes in unchanged, its bodies are sent as they are, its output lines are the Batch
API's (the openai package's own types accept their bodies and errors), and it resumes after
kill -9, retries, checks and exports exactly as tasks do. Bad request lines, a file mixing the
two formats, urls calibrate does not send: exit 2 naming the line, nothing sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from calibrate.io.jobs.openai_batch import output_line
from calibrate.io.tasks import load_pool
from tests.batch_helpers import batch_process, results, wait_for_lines, write_tasks
from tests.helpers import kill_9, reaped, write_config
from tests.mockserver import start_mock
from tests.workload_helpers import FAST_MOCK, calibrated

MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"

# vLLM's own example (examples/offline_inference/openai_batch/openai_example_batch.jsonl), as
# its docs show it: spaces after the colons, none after the first message's comma
VLLM_EXAMPLE = (
    '{"custom_id": "request-1", "method": "POST", "url": "/v1/chat/completions", "body": '
    '{"model": "meta-llama/Meta-Llama-3-8B-Instruct", "messages": [{"role": "system", '
    '"content": "You are a helpful assistant."},{"role": "user", "content": "Hello world!"}],'
    '"max_completion_tokens": 1000}}\n'
    '{"custom_id": "request-2", "method": "POST", "url": "/v1/chat/completions", "body": '
    '{"model": "meta-llama/Meta-Llama-3-8B-Instruct", "messages": [{"role": "system", '
    '"content": "You are an unhelpful assistant."},{"role": "user", "content": "Hello world!"}]'
    ',"max_completion_tokens": 1000}}\n'
)


@pytest.fixture
def server() -> Any:
    with start_mock(ttft_s=0.001, per_token_s=0.0002, models=MODEL) as running:
        yield running


def request_line(
    custom_id: str, text: str, *, url: str = "/v1/chat/completions", **body: Any
) -> str:
    """One request line; ``body`` adds to (or replaces) the default body of ``url``."""
    if url == "/v1/completions":
        base: dict[str, Any] = {"prompt": text, "max_tokens": 64}
    else:
        base = {"messages": [{"role": "user", "content": text}], "max_tokens": 64}
    line = {"custom_id": custom_id, "method": "POST", "url": url, "body": {**base, **body}}
    return json.dumps(line, ensure_ascii=False) + "\n"


def write_requests(path: Path, n: int, **body: Any) -> Path:
    path.write_text(
        "".join(
            request_line(f"req-{i}", f"第{i}段：定长数组的长度在编译时确定。", **body)
            for i in range(n)
        ),
        encoding="utf-8",
    )
    return path


def assert_batch_output(lines: list[dict[str, Any]]) -> None:
    """Each line is a Batch API output line: its keys, and its body or error as the openai
    package's own types read them (imported here: a second of CPU, not at collection in every
    worker)."""
    import openai.types.chat

    for line in lines:
        assert list(line) == ["id", "custom_id", "response", "error"], line
        assert isinstance(line["id"], str) and line["id"].startswith("batch_req_")
        assert isinstance(line["custom_id"], str)
        response, error = line["response"], line["error"]
        if error is not None:
            openai.types.BatchError.model_validate(error)
            assert isinstance(error["code"], str) and isinstance(error["message"], str)
        if response is None:
            assert error is not None
            continue
        assert set(response) == {"status_code", "request_id", "body"}
        assert isinstance(response["status_code"], int) and isinstance(response["request_id"], str)
        if response["status_code"] == 200:
            body = response["body"]
            if body.get("object") == "text_completion":
                openai.types.Completion.model_validate(body)
            else:
                openai.types.chat.ChatCompletion.model_validate(body)


def test_a_file_written_for_vllm_run_batch_runs_unchanged(cli, server, isolated: Path) -> None:
    write_config(isolated / "calibrate.toml", server.base_url, model=MODEL)
    (isolated / "requests.jsonl").write_text(VLLM_EXAMPLE, encoding="utf-8")
    done = cli(
        "batch", "--input", "requests.jsonl", "--out", "out.jsonl", "--final", "results.jsonl"
    )
    assert done.code == 0, done.err
    assert "input format (detected): OpenAI Batch API requests" in done.err
    assert "Batch API output lines in input order: 2 ok" in done.err
    final = results(isolated / "results.jsonl")
    assert [line["custom_id"] for line in final] == ["request-1", "request-2"]
    assert_batch_output(final)
    assert all(line["error"] is None for line in final)
    body = final[0]["response"]["body"]
    assert body["model"] == MODEL and body["choices"][0]["message"]["content"]
    assert final[0]["response"]["request_id"] == body["id"]
    # the journal is calibrate's own: an ok line per custom_id, with the answer it kept
    journal = results(isolated / "out.jsonl")
    assert {line["id"] for line in journal if line["ok"]} == {"request-1", "request-2"}
    assert all(line["response"]["body"]["choices"] for line in journal)
    # export writes the same lines again, the same ids included
    again = cli("export", "--input", "requests.jsonl", "--out", "out.jsonl", "--to", "again.jsonl")
    assert again.code == 0, again.err
    assert (isolated / "again.jsonl").read_bytes() == (isolated / "results.jsonl").read_bytes()


BAD_FILES = {
    "a task after a request": (
        request_line("r1", "a") + '{"id": "t2", "text": "b"}\n',
        "line 2 is one of {id, text} tasks, but line 1 is one of OpenAI Batch API requests",
    ),
    "a request after a task": (
        '{"id": "t1", "text": "a"}\n' + request_line("r2", "b"),
        "line 2 is one of OpenAI Batch API requests (custom_id, method, url, body), but line 1",
    ),
    "an embeddings request": (
        request_line("r1", "a")
        + '{"custom_id": "e1", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}\n',
        "line 2 (custom_id 'e1'): url '/v1/embeddings' is not sent by calibrate batch (answers "
        "with no text to check); it sends /v1/chat/completions and /v1/completions",
    ),
    "another url": (
        request_line("r1", "a", url="/v2/chat"),
        "line 1 (custom_id 'r1'): url '/v2/chat' is not sent by calibrate batch (not an endpoint",
    ),
    "a GET": (
        request_line("r1", "a").replace('"POST"', '"GET"'),
        "line 1 (custom_id 'r1'): 'method' must be \"POST\", got 'GET'",
    ),
    "a streamed body": (
        request_line("r1", "a", stream=True),
        "line 1 (custom_id 'r1'): the body asks to stream; the Batch API answers whole bodies",
    ),
    "a number for custom_id": (
        request_line("r1", "a").replace('"r1"', "1"),
        "line 1: 'custom_id' must be a non-empty string, got 1",
    ),
    "a duplicate custom_id": (
        request_line("r1", "a") + request_line("r2", "b") + request_line("r1", "c"),
        "line 3: duplicate custom_id 'r1' (first on line 1)",
    ),
    "no custom_id": (
        request_line("r1", "a").replace('"custom_id": "r1", ', ""),
        "line 1: no 'id' (nor 'custom_id')",
    ),
    "no messages": (
        request_line("r1", "a", messages=[]),
        "line 1 (custom_id 'r1'): body 'messages' must be a non-empty list",
    ),
    "a body naming another model": (
        request_line("r1", "a") + request_line("r2", "b", model="gpt-4o-mini"),
        "line 2: the body names model 'gpt-4o-mini', but this batch is for "
        "'meta-llama/Meta-Llama-3-8B-Instruct'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_request_file_calibrate_would_not_send_as_it_is_is_refused_naming_the_line(
    cli, server, isolated: Path, case: str
) -> None:
    write_config(isolated / "calibrate.toml", server.base_url, model=MODEL)
    text, said = BAD_FILES[case]
    (isolated / "requests.jsonl").write_text(text, encoding="utf-8")
    refused = cli("batch", "--input", "requests.jsonl", "--out", "out.jsonl")
    assert refused.code == 2, refused.err
    assert f"requests.jsonl {said}" in refused.err
    assert "Traceback" not in refused.err and len(refused.err.strip().splitlines()) <= 2
    assert server.model.snapshot().requests_total == 0
    assert not (isolated / "out.jsonl").exists()


@pytest.mark.parametrize("flags", [["--prompt", "一句话概括："], ["--max-tokens", "8"]])
def test_flags_that_would_change_the_requests_are_refused(
    cli, server, isolated: Path, flags: list[str]
) -> None:
    write_config(isolated / "calibrate.toml", server.base_url, model=MODEL)
    write_requests(isolated / "requests.jsonl", 2)
    refused = cli("batch", "--input", "requests.jsonl", "--out", "out.jsonl", *flags)
    assert refused.code == 2, refused.err
    assert f"{flags[0]}: requests.jsonl holds OpenAI Batch API requests, sent as they are" in (
        refused.err
    )
    assert server.model.snapshot().requests_total == 0


def test_kill_9_then_a_rerun_loses_and_repeats_no_request(cli, isolated: Path) -> None:
    requests = write_requests(isolated / "requests.jsonl", 150)
    out = isolated / "out.jsonl"
    with start_mock(ttft_s=0.01, per_token_s=0.0005, models=MODEL) as server:
        write_config(isolated / "calibrate.toml", server.base_url, model=MODEL)
        args = ("--input", str(requests), "--out", str(out), "-c", "4")
        with reaped(batch_process(isolated, *args)) as proc:
            wait_for_lines(out, 40, proc)
            kill_9(proc)
        lines = out.read_bytes().splitlines(keepends=True)
        assert 40 <= len(lines) < 150
        out.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # torn
        kept = {json.loads(line)["id"] for line in lines[:-1]}
        again = cli("batch", *args, "--final", "results.jsonl", "--json")
    assert again.code == 0, again.err
    assert "torn" in again.err
    assert again.json["skipped"] == len(kept) and again.json["done"] == 150 - len(kept)
    assert again.json["input_format"] == "openai_batch"
    ok = [line["id"] for line in results(out) if line["ok"]]
    assert sorted(ok) == sorted(f"req-{i}" for i in range(150))  # each request once
    final = results(isolated / "results.jsonl")
    assert [line["custom_id"] for line in final] == [f"req-{i}" for i in range(150)]
    assert_batch_output(final)
    assert len({line["id"] for line in final}) == 150


def test_http_errors_are_retried_and_answered_as_the_batch_api_does(cli, isolated: Path) -> None:
    write_requests(isolated / "requests.jsonl", 30)
    with start_mock(ttft_s=0.002, per_token_s=0.0002, fail_rate=0.3, seed=5, models=MODEL) as s:
        write_config(isolated / "calibrate.toml", s.base_url, model=MODEL)
        first = cli(
            "batch", "--input", "requests.jsonl", "--out", "out.jsonl", "--retries", "0",
            "--final", "first.jsonl",
        )  # fmt: skip
        assert first.code == 1, first.err
        failed = [line for line in results(isolated / "first.jsonl") if line["response"]]
        failed = [line for line in failed if line["response"]["status_code"] == 500]
        assert failed, "with 30 % faults and no retries some requests fail"
        assert_batch_output(results(isolated / "first.jsonl"))
        for line in failed:  # an HTTP error answer: its status and body, no error of its own
            assert line["error"] is None
            assert line["response"]["body"]["message"] == "Internal server error (injected fault)."
        second = cli(
            "batch", "--input", "requests.jsonl", "--out", "out.jsonl", "--retries", "10",
            "--backoff-s", "0.01", "--final", "results.jsonl",
        )  # fmt: skip
    assert second.code == 0, second.err
    final = results(isolated / "results.jsonl")
    assert_batch_output(final)
    assert all(line["response"]["status_code"] == 200 and not line["error"] for line in final)
    retried = {line["custom_id"] for line in failed}
    assert {line["custom_id"] for line in final} >= retried


def test_checks_and_failures_without_an_answer_become_the_line_s_error(
    cli, server, isolated: Path
) -> None:
    """A body sent as given (no model: the batch's), a completions request, the length check
    against the body's own max_tokens, an HTTP 400, a request that never ran."""
    lines = [
        request_line("chat", "你好"),
        request_line("no-model", "hello").replace(f'"model": "{MODEL}", ', ""),
        request_line("completion", "Once upon a time", url="/v1/completions"),
        request_line("cut", "a long answer please", max_tokens=2, min_tokens=2),
        request_line("n2", "two answers", n=2),  # the mock answers one: HTTP 400
        request_line("never", "not reached"),
    ]
    (isolated / "requests.jsonl").write_text("".join(lines), encoding="utf-8")
    write_config(isolated / "calibrate.toml", server.base_url, model=MODEL)
    run = cli(
        "batch", "--input", "requests.jsonl", "--out", "out.jsonl", "--limit", "5",
        "--final", "results.jsonl", "--json",
    )  # fmt: skip
    assert run.code == 1, run.err
    final = {line["custom_id"]: line for line in results(isolated / "results.jsonl")}
    assert list(final) == ["chat", "no-model", "completion", "cut", "n2", "never"]
    assert_batch_output(list(final.values()))
    assert final["no-model"]["response"]["body"]["model"] == MODEL
    assert final["completion"]["response"]["body"]["object"] == "text_completion"
    cut = final["cut"]
    assert cut["response"]["status_code"] == 200  # answered, but cut at the body's max_tokens
    assert cut["error"]["code"] == "incomplete" and "max_tokens=2" in cut["error"]["message"]
    assert final["n2"]["response"]["status_code"] == 400 and final["n2"]["error"] is None
    assert "n = 1" in final["n2"]["response"]["body"]["message"]
    assert final["never"]["response"] is None and final["never"]["error"]["code"] == "not_run"
    assert run.json["failed_by_kind"] == {"http_4xx": 1, "incomplete": 1}
    # --expect json: an answer that is no JSON is the line's format error, its answer kept
    (isolated / "one.jsonl").write_text(lines[0], encoding="utf-8")
    checked = cli(
        "batch", "--input", "one.jsonl", "--out", "json.jsonl", "--expect", "json",
        "--final", "json-final.jsonl",
    )  # fmt: skip
    assert checked.code == 1, checked.err
    (line,) = results(isolated / "json-final.jsonl")
    assert line["error"]["code"] == "format" and line["response"]["status_code"] == 200


def test_every_answer_of_a_request_with_several_is_checked(cli, server, isolated: Path) -> None:
    """A completions body whose prompt is a list is answered one choice per prompt: the item is
    ok only when every one of them is complete — the second cut at max_tokens fails it, as the
    first would (it was ok: only the first choice was looked at)."""
    from calibrate.mock.text import count_tokens, natural_text

    short, long = sorted(
        (f"第{i}段：定长数组的长度在编译时确定。" for i in range(8)),
        key=lambda prompt: count_tokens(natural_text(prompt, 0)),
    )[::7]
    limit = count_tokens(natural_text(short, 0))  # the first answer whole, the second cut
    assert count_tokens(natural_text(long, 0)) > limit
    (isolated / "requests.jsonl").write_text(
        request_line("two", "", url="/v1/completions", prompt=[short, long], max_tokens=limit)
        + request_line("one", short, url="/v1/completions", max_tokens=limit),
        encoding="utf-8",
    )
    write_config(isolated / "calibrate.toml", server.base_url, model=MODEL)
    run = cli(
        "batch", "--input", "requests.jsonl", "--out", "out.jsonl", "--final", "results.jsonl",
        "--json",
    )  # fmt: skip
    assert run.code == 1, run.err
    final = {line["custom_id"]: line for line in results(isolated / "results.jsonl")}
    choices = final["two"]["response"]["body"]["choices"]
    assert [c["finish_reason"] for c in choices] == ["stop", "length"]
    assert final["two"]["error"]["code"] == "incomplete", final["two"]
    assert final["two"]["error"]["message"].startswith("choice 1 of 2: cut off")
    assert final["one"]["error"] is None  # one prompt, one choice: as before
    assert run.json["failed_by_kind"] == {"incomplete": 1}


def test_shards_workers_and_several_endpoints_answer_every_request_once(
    cli, isolated: Path
) -> None:
    write_requests(isolated / "requests.jsonl", 40)
    fast = {"ttft_s": 0.002, "per_token_s": 0.0002, "models": MODEL}
    with start_mock(**fast) as a, start_mock(**fast) as b:
        write_config(isolated / "calibrate.toml", a.base_url, model=MODEL)
        run = ("batch", "--input", "requests.jsonl")
        zero = cli(*run, "--out", "out-0.jsonl", "--shard", "0/2", "--workers", "2", "-c", "4")
        assert zero.code == 0, zero.err
        one = cli(
            *run, "--out", "out-1.jsonl", "--shard", "1/2", "--base-url", a.base_url,
            "--base-url", b.base_url,
        )  # fmt: skip
        assert one.code == 0, one.err
        assert a.model.snapshot().requests_total and b.model.snapshot().requests_total
    merged = cli(
        "export", "--input", "requests.jsonl", "--out", "out-0.jsonl,out-1.jsonl",
        "--to", "results.jsonl",
    )  # fmt: skip
    assert merged.code == 0, merged.err
    final = results(isolated / "results.jsonl")
    assert [line["custom_id"] for line in final] == [f"req-{i}" for i in range(40)]
    assert_batch_output(final)
    journals = results(isolated / "out-0.jsonl") + results(isolated / "out-1.jsonl")
    assert sorted(line["id"] for line in journals if line["ok"]) == sorted(
        f"req-{i}" for i in range(40)
    )


def test_a_resume_knows_what_produced_each_answer(cli, isolated: Path) -> None:
    """The batch's model (for bodies naming none) is a setting of the journal's results; an
    edited body is another request: it runs again."""
    lines = [request_line(f"r{i}", f"text {i}") for i in range(4)]
    lines = [line.replace(f'"model": "{MODEL}", ', "") for line in lines]  # no model named
    requests = isolated / "requests.jsonl"
    requests.write_text("".join(lines), encoding="utf-8")
    with start_mock(ttft_s=0.001, per_token_s=0.0002, any_model=True) as server:
        write_config(isolated / "calibrate.toml", server.base_url, model=MODEL)
        batch = ("batch", "--input", "requests.jsonl", "--out", "out.jsonl")
        assert cli(*batch, "--limit", "2").code == 0
        sent = server.model.snapshot().requests_total
        other = cli(*batch, "--model", "other-model")
        assert other.code == 2, other.err
        assert "holds 2 result(s) made with other settings: --model" in other.err
        assert server.model.snapshot().requests_total == sent
        requests.write_text(lines[0].replace("text 0", "text zero") + "".join(lines[1:]), "utf-8")
        again = cli(*batch, "--json")
    assert again.code == 0, again.err
    assert "1 item(s) changed in requests.jsonl since their result (e.g. id 'r0')" in again.err
    assert again.json["skipped"] == 1 and again.json["done"] == 3
    settings = next(line["settings"] for line in results(isolated / "out.jsonl"))
    assert settings["params"] == {}  # nothing but the body is sent: no sampling of calibrate's


def test_a_sample_of_requests_checks_their_shape(cli, server, isolated: Path) -> None:
    write_config(isolated / "calibrate.toml", server.base_url, model=MODEL)
    write_requests(isolated / "requests.jsonl", 6)
    sample = cli("batch", "--input", "requests.jsonl", "--sample", "3", "--expect", "json")
    assert sample.code == 1, sample.err  # the mock's prose is no JSON
    assert "sample failed" in sample.err
    assert server.model.snapshot().requests_total == 3
    assert "Batch API output lines" not in sample.err  # a sample has no output to export


def test_output_lines_of_failures_without_an_answer() -> None:
    """A refused request has no response: the error says why, as the Batch API's error file
    does; each export gives a result the same id."""
    record = {
        "id": "r1",
        "ok": False,
        "input_fp": "0123456789abcdef",
        "error": {"kind": "connect", "message": "connection refused", "status": None},
        "response": None,
        "made": "fedcba9876543210",
        "attempts": 4,
    }
    line = output_line(record)
    assert line["response"] is None
    assert line["error"] == {"code": "connect", "message": "connection refused"}
    assert line == output_line(dict(record)) and line["custom_id"] == "r1"
    assert output_line({**record, "attempts": 5})["id"] != line["id"]
    assert_batch_output([line])


def test_the_ladder_reads_a_request_file_as_its_bodies_text(isolated: Path) -> None:
    """The length check (and ``ladder --tasks``, which it suggests) measure what the bodies
    send: a request file's items are their messages' text, or their prompts."""
    lines = [
        request_line("a", "short"),
        request_line("b", "x" * 500),
        request_line("c", "a prompt", url="/v1/completions"),
    ]
    (isolated / "requests.jsonl").write_text("".join(lines), encoding="utf-8")
    pool = load_pool(isolated / "requests.jsonl", pick="longest")
    assert pool.total == 3 and pool.messages[0] == "x" * 500
    assert set(pool.messages) == {"short", "x" * 500, "a prompt"}


def test_requests_longer_than_the_ladder_verified_are_warned_about_before_sending(
    cli, isolated: Path
) -> None:
    """The length check reads a request's text as its body sends it (its messages)."""
    lines = [
        request_line(f"r{i}", " ".join(["word"] * (i * 400))).replace(f'"model": "{MODEL}", ', "")
        for i in range(1, 9)
    ]
    (isolated / "requests.jsonl").write_text("".join(lines), encoding="utf-8")
    with start_mock(**FAST_MOCK, max_model_len=8192) as server:
        calibrated(cli, isolated, server.base_url)
        ladder = cli("ladder", "--axis", "context", "--context-lengths", "512,2000")
        assert ladder.code == 0, ladder.err
        result = cli(
            "batch", "--input", "requests.jsonl", "--out", "out.jsonl", "-c", "2",
            "--final", "results.jsonl",
        )  # fmt: skip
    warning = next(line for line in result.err.splitlines() if "items exceed" in line)
    assert warning.startswith("warning: 4 items exceed"), warning  # 2,400 … 3,200 words
    assert "run calibrate ladder --tasks requests.jsonl" in warning
    assert result.err.index("items exceed") < result.err.index("all 8 items ok")
    assert result.code == 0, result.err


def test_tasks_stay_as_they_were_and_the_summary_names_either_format(
    cli, server, isolated: Path
) -> None:
    write_config(isolated / "calibrate.toml", server.base_url, model=MODEL)
    write_tasks(isolated / "tasks.jsonl", 3)
    tasks = cli("batch", "--input", "tasks.jsonl", "--out", "out.jsonl", "--json")
    assert tasks.code == 0, tasks.err
    assert tasks.json["input_format"] == "tasks" and "input format" not in tasks.err
    assert all("response" not in line for line in results(isolated / "out.jsonl"))
