"""The protocol habits of real engines (docs/engine-protocol.md), reproduced by mock flags.

`transformers serve` ends streams without `data: [DONE]`, puts usage on the finish chunk, answers
an unknown model with 400 and a bad body with 422 `{"detail": [...]}`. Each is covered here in the
fast suite, so the client does not depend on the mock's defaults.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.errors import RequestError
from calibrate.http.client import OpenAIClient
from calibrate.http.error_kinds import refusal_cause
from calibrate.http.models import SamplingParams
from tests.helpers import write_config
from tests.mockserver import start_mock

PARAMS = SamplingParams(temperature=0.0, max_tokens=64, top_p=1.0, seed=0)
FAST = {"ttft_s": 0.001, "per_token_s": 0.0002}


def _record(root: Path, run_id: str) -> dict:
    return json.loads((root / "runs" / run_id / "records.jsonl").read_text("utf-8").splitlines()[0])


@pytest.mark.parametrize(
    "habit",
    [
        {"no_done": True},
        {"usage_in_last_chunk": True},
        {"no_done": True, "usage_in_last_chunk": True},
    ],
)
def test_stream_without_done_or_with_usage_on_the_finish_chunk(cli, isolated: Path, habit) -> None:
    with start_mock(**FAST, **habit) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        result = cli("single", "--stream", "--json")
    assert result.code == 0, result.err
    record = _record(isolated, result.json["run_id"])
    assert record["finish_reason"] == "stop" and record["usage"]["completion_tokens"] > 0
    assert record["ttft_s"] is not None


def test_streamed_and_plain_answers_are_the_same_text(isolated: Path) -> None:
    with start_mock(**FAST, no_done=True, usage_in_last_chunk=True) as server:
        client = OpenAIClient(server.base_url, timeout_s=10)
        plain = client.chat("internlm-s2", "hello there", PARAMS)
        streamed = client.chat("internlm-s2", "hello there", PARAMS, stream=True)
        client.close()
    assert streamed.text == plain.text
    assert streamed.usage == plain.usage


def test_stream_without_usage_is_diagnosed(cli, isolated: Path) -> None:
    with start_mock(**FAST, no_usage=True, no_done=True) as server:
        result = cli("single", "--stream", "--base-url", server.base_url)
    assert result.code == 1 and "did not report token usage" in result.err


def test_422_validation_error_is_a_4xx_with_the_servers_reason() -> None:
    with start_mock(**FAST, strict_422=True) as server:
        client = OpenAIClient(server.base_url, timeout_s=10)
        with pytest.raises(RequestError) as caught:
            client.post_completion("/chat/completions", {"model": "internlm-s2", "max_tokens": 5})
        client.close()
    info = caught.value.info
    assert info.kind == "http_4xx" and info.status == 422
    assert "messages" in info.message


def test_unknown_model_400_is_not_retried_as_transient(cli, isolated: Path) -> None:
    """batch tries a 400 once (a wrong name does not heal), where a 5xx would be retried: the
    run's own model refused before any answer ends the run, no item marked failed (each was
    recorded failed before, and the rerun retried them all)."""
    tasks = isolated / "tasks.jsonl"
    tasks.write_text('{"id": 1, "text": "a"}\n{"id": 2, "text": "b"}\n', "utf-8")
    with start_mock(**FAST, unknown_model_status=400) as server:
        client = OpenAIClient(server.base_url, timeout_s=10)
        with pytest.raises(RequestError) as caught:
            client.chat("tiny-llama", "hi", PARAMS)
        client.close()
        write_config(isolated / "calibrate.toml", server.base_url, model="tiny-llama")
        result = cli(
            "batch",
            "--input",
            str(tasks),
            "--out",
            "out.jsonl",
            "--retries",
            "3",
            "--backoff-s",
            "0",
            "-c",
            "1",
        )
    assert caught.value.info.status == 400 and not caught.value.info.transient
    assert result.code == 1
    said = " ".join(result.err.split())
    assert "the server does not serve the model asked for (HTTP 400" in said, said
    assert "no item was marked failed" in said, said
    out = isolated / "out.jsonl"
    assert not out.exists() or not out.read_text("utf-8").strip()


@pytest.mark.parametrize(
    ("text", "kind", "reason"),
    [
        ("[Errno 111] Connection refused", "connect", "connection refused"),
        (
            "Failed to resolve 'gpu-box' ([Errno -2] Name or service not known)",
            "connect",
            "host name not resolved",
        ),
        ("[Errno 113] No route to host", "connect", "no route to host"),
        ("('Connection aborted.', RemoteDisconnected('closed'))", "reset", "dropped"),
    ],
)
def test_transport_failures_name_their_cause(text: str, kind: str, reason: str) -> None:
    from calibrate.http.error_kinds import connection_error

    error = connection_error("http://gpu-box:8000/v1/models", OSError(text))
    assert error.kind == kind and reason in error.info.message


def test_a_prompt_over_the_slot_is_refused_with_llamacpps_own_body() -> None:
    """llama-server refuses a prompt its slot cannot hold with HTTP 400 and this body — the
    OpenAI envelope, the counts beside the message (ggml-org/llama.cpp
    tools/server/server-context.cpp ``send_error(..., ERROR_TYPE_EXCEED_CONTEXT_SIZE)``,
    server-task.cpp ``server_task_result_error::to_json``; recorded from a real llama-server in
    docs/engine-protocol.md). The mock sent vLLM's flat body with llama.cpp's type, which no
    engine sends."""
    with start_mock(**FAST, slot_context=16) as server:
        client = OpenAIClient(server.base_url, timeout_s=10)
        with pytest.raises(RequestError) as caught:
            client.chat("internlm-s2", "word " * 40, PARAMS)
        client.close()
    info = caught.value.info
    assert info.status == 400 and info.kind == "http_4xx"
    assert refusal_cause(info) == "context_length"
    body = json.loads(info.body or "")
    assert set(body) == {"error"}
    error = body["error"]
    assert error["code"] == 400 and error["type"] == "exceed_context_size_error"
    assert error["n_ctx"] == 16 and error["n_prompt_tokens"] > 16
    expected = (
        f"request ({error['n_prompt_tokens']} tokens) exceeds the available context size "
        "(16 tokens), try increasing it"
    )
    assert error["message"] == expected and info.message == f"HTTP 400: {expected}"
