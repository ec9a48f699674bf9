"""A huge ``GET /v1/models`` (issue 23, low): 300,000 models listed become a few kept and a
count — in the warning, the summary and the ledger — and the configured one is always kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from calibrate.http.client import OpenAIClient
from calibrate.http.responses import MAX_MODELS_KEPT
from tests.canned_server import CannedServer
from tests.helpers import write_config

N = 300_000
ANSWER = {
    "model": "internlm-s2",
    "choices": [{"index": 0, "message": {"content": "An answer."}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
}


def _models(n: int, at: int | None) -> bytes:
    ids = [f"model-{i}" for i in range(n)]
    if at is not None:
        ids[at] = "internlm-s2"
    return json.dumps({"data": [{"id": i, "object": "model"} for i in ids]}).encode()


@pytest.mark.parametrize("at", [None, 0, 31, 250_000, N - 1])
def test_a_huge_model_list_is_kept_short_and_says_how_many_more(
    cli: Any, isolated: Path, at: int | None
) -> None:
    replies = {
        "/v1/models": (200, {}, _models(N, at)),
        "/v1/chat/completions": (200, {}, json.dumps(ANSWER).encode()),
    }
    with CannedServer(replies) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        result = cli("single", "--json")
        client = OpenAIClient(server.base_url, timeout_s=30)
        models, more = client.model_list(keep="internlm-s2")
        client.close()
    assert len(models) == MAX_MODELS_KEPT and more == N - MAX_MODELS_KEPT
    assert ("internlm-s2" in [m.id for m in models]) == (at is not None)
    assert len(result.err) < 4000, len(result.err)
    if at is None:
        assert f"(and {N - MAX_MODELS_KEPT:,} more)" in result.err
    ledger = (isolated / "runs" / "ledger.jsonl").read_bytes()
    assert len(ledger) < 20_000, len(ledger)
    identity = json.loads(ledger.splitlines()[-1])["summary"]["identity"]
    assert identity["more_models"] == N - MAX_MODELS_KEPT
    assert len(identity["models"]) == MAX_MODELS_KEPT


def test_a_short_model_list_is_kept_whole() -> None:
    with CannedServer({"/v1/models": (200, {}, _models(3, 1))}) as server:
        client = OpenAIClient(server.base_url, timeout_s=5)
        models, more = client.model_list()
        client.close()
    assert [m.id for m in models] == ["model-0", "internlm-s2", "model-2"] and more == 0
