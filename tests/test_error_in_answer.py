"""An error object in an HTTP 200 answer (vLLM's streamed failure, a 200 whose body is an error)
has the status its body names: batch retries what the server said was its own failure (500),
never what it said was the request's (400) — that fails again, each retry a wasted wait."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.canned_server import CannedServer
from tests.helpers import write_config
from tests.tier_helpers import jsonl

MODELS = (200, {}, b'{"data": [{"id": "internlm-s2"}]}')


def _error_answer(code: int) -> tuple[int, dict[str, str], bytes]:
    err = {"message": f"refused with {code}", "type": "BadRequestError", "param": None}
    return 200, {}, json.dumps({"error": {**err, "code": code}}).encode()


@pytest.mark.parametrize(("code", "kind", "sent"), [(400, "http_4xx", 1), (500, "http_5xx", 2)])
def test_batch_retries_an_error_in_a_200_answer_only_when_its_body_names_a_server_error(
    cli: Any, isolated: Path, code: int, kind: str, sent: int
) -> None:
    (isolated / "in.jsonl").write_text('{"id": 1, "text": "one item"}\n', encoding="utf-8")
    replies = {"/v1/models": MODELS, "/v1/chat/completions": _error_answer(code)}
    with CannedServer(replies) as server:  # type: ignore[arg-type]
        write_config(isolated / "calibrate.toml", server.base_url)
        result = cli(
            "batch", "--input", "in.jsonl", "--out", "out.jsonl", "-c", "1", "--retries", "1"
        )
    assert result.code == 1, result.err
    assert "Traceback" not in result.err
    (line,) = jsonl(isolated / "out.jsonl")
    assert line["error"]["kind"] == kind and line["error"]["status"] == code
    assert (
        f"error in an HTTP 200 answer (code {code}): refused with {code}"
        in line["error"]["message"]
    )
    assert server.hits.count("/v1/chat/completions") == sent  # the 400 once, the 500 retried
