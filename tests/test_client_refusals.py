"""What a refusal means, said plainly (issue 23, lows): a redirect is its own error (not HTTP 500,
not retried, says where it points); a 400 about the context length is not "does not serve the
model"; calibrate out of file descriptors is one message, not a server outage."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from calibrate.errors import ErrorInfo, RequestError
from calibrate.http.client import OpenAIClient
from calibrate.http.error_kinds import refusal_cause
from calibrate.http.models import SamplingParams
from tests.canned_server import CannedServer
from tests.helpers import write_config
from tests.mockserver import start_mock
from tests.tier_helpers import jsonl

REPO = Path(__file__).resolve().parents[1]
BATCH = (sys.executable, "-m", "calibrate", "batch")
MODELS = (200, {}, b'{"data": [{"id": "internlm-s2"}]}')
PARAMS = SamplingParams(temperature=0.0, max_tokens=4, top_p=1.0)


def _error_body(message: str) -> bytes:
    return json.dumps({"object": "error", "message": message, "code": 400}).encode()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_its_own_error_and_says_where_it_points(status: int) -> None:
    where = "https://elsewhere.example/v1/chat/completions"
    reply = (status, {"Location": where}, b'{"error": "moved"}')
    with CannedServer({"/v1/chat/completions": reply, "/v1/models": reply}) as server:
        client = OpenAIClient(server.base_url, api_key="sk-redirect-secret", timeout_s=5)
        for call in (lambda: client.chat("internlm-s2", "hi", PARAMS), client.models):
            with pytest.raises(RequestError) as caught:
                call()
            info = caught.value.info
            assert info.status == status and info.kind == "http_4xx" and not info.transient
            assert f"HTTP {status}" in info.message and where in info.message
            assert "HTTP 500" not in info.message  # the port may hold "500": not the status
        client.close()
        assert server.hits.count("/v1/chat/completions") == 1  # never followed


def test_batch_does_not_retry_a_redirect(cli: Any, isolated: Path) -> None:
    (isolated / "in.jsonl").write_text('{"id": 1, "text": "a"}\n{"id": 2, "text": "b"}\n', "utf-8")
    moved = (302, {"Location": "http://127.0.0.1:1/v1/chat/completions"}, b"")
    with CannedServer({"/v1/models": MODELS, "/v1/chat/completions": moved}) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        result = cli("batch", "--input", "in.jsonl", "--out", "out.jsonl", "--retries", "3")
        posts = server.hits.count("/v1/chat/completions")
    assert result.code == 1, result.err
    lines = jsonl(isolated / "out.jsonl")
    assert [line["attempts"] for line in lines] == [1, 1] and posts == 2
    assert all("redirects to http://127.0.0.1:1/" in line["error"]["message"] for line in lines)


CONTEXT_TEXTS = [
    "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
    "(4000 in the messages, 1000 in the completion). Please reduce the length of the messages.",
    "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
    "the request exceeds the available context size, try increasing it",
    "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 5000",
]
MODEL_TEXTS = [
    "The model `internlm-s2` does not exist.",
    "model 'internlm-s2' not found, try pulling it first",
    "Unknown model: internlm-s2",
]


@pytest.mark.parametrize("text", CONTEXT_TEXTS)
def test_a_context_length_400_is_said_as_such(cli: Any, isolated: Path, text: str) -> None:
    reply = (400, {}, _error_body(text))
    with CannedServer({"/v1/models": MODELS, "/v1/chat/completions": reply}) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        result = cli("single")
    assert result.code == 1, result.err
    assert "does not serve" not in result.err
    assert "too long for its context" in result.err
    assert refusal_cause(ErrorInfo("http_4xx", f"HTTP 400: {text}", 400)) == "context_length"


@pytest.mark.parametrize("text", MODEL_TEXTS)
def test_an_unknown_model_400_still_says_what_is_served(
    cli: Any, isolated: Path, text: str
) -> None:
    models = (200, {}, b'{"data": [{"id": "internlm-s2"}, {"id": "other"}]}')
    reply = (400, {}, _error_body(text))
    with CannedServer({"/v1/models": models, "/v1/chat/completions": reply}) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        result = cli("single")
    assert result.code == 1, result.err
    assert "does not serve 'internlm-s2'" in result.err and "other" in result.err
    assert refusal_cause(ErrorInfo("http_4xx", f"HTTP 400: {text}", 400)) == "unknown_model"


@pytest.mark.parametrize("limit", [40, 56])
def test_running_out_of_file_descriptors_is_one_message_not_an_outage(
    isolated: Path, limit: int
) -> None:
    (isolated / "in.jsonl").write_text(
        "".join(f'{{"id": {i}, "text": "item {i}"}}\n' for i in range(200)), encoding="utf-8"
    )

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    with start_mock(ttft_s=0.2, per_token_s=0.001) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url)
        start = time.monotonic()
        proc = subprocess.run(
            [*BATCH, "--input", "in.jsonl", "--out", "out.jsonl", "-c", "96"],
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=low_limit,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
            cwd=isolated,
        )
        elapsed = time.monotonic() - start
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "outage" not in proc.stderr
    assert proc.stderr.count("ran out of file descriptors") <= 2  # the summary line and the error
    assert "ulimit -n" in proc.stderr and "-c" in proc.stderr
    lines = jsonl(isolated / "out.jsonl") if (isolated / "out.jsonl").exists() else []
    assert all(line["ok"] for line in lines)  # no item was failed for calibrate's own limit
    assert elapsed < 60
