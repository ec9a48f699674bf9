"""Redirects are never followed and the key never leaves base_url's origin — for every request
calibrate makes (a completion on either transport, streamed or not, /v1/models, /metrics), and
for a CLI stage: the server a 3xx points to never hears from calibrate."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from calibrate.errors import RequestError
from calibrate.http.client import OpenAIClient
from calibrate.http.models import SamplingParams
from tests.canned_server import CannedServer
from tests.helpers import FAKE_KEY, write_config

PARAMS = SamplingParams(temperature=0.0, max_tokens=4, top_p=1.0)
PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/metrics")

CALLS: dict[str, Callable[[OpenAIClient], Any]] = {
    "chat": lambda c: c.chat("internlm-s2", "hi", PARAMS),
    "chat, streamed": lambda c: c.chat("internlm-s2", "hi", PARAMS, stream=True),
    "completions": lambda c: c.post_completion("/completions", {"model": "m", "prompt": ["a"]}),
    "models": lambda c: c.models(),
    "metrics": lambda c: c.get_text("/metrics"),
}


@pytest.mark.parametrize("status", [301, 302, 307, 308])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_no_request_follows_a_redirect_and_the_key_stays_home(status: int, call: str) -> None:
    with CannedServer({}) as elsewhere:
        where = elsewhere.base_url.removesuffix("/v1")
        replies = {p: (status, {"Location": where + p}, b"moved") for p in PATHS}
        with CannedServer(replies) as server:  # type: ignore[arg-type]
            client = OpenAIClient(server.base_url, api_key=FAKE_KEY, timeout_s=5)
            try:
                with pytest.raises(RequestError) as caught:
                    CALLS[call](client)
            finally:
                client.close()
            assert len(server.hits) == 1, "asked once, never retried"
        assert elsewhere.hits == [], "the redirect was followed: the key left the origin"
    info = caught.value.info
    assert info.status == status and f"redirects to {where}" in info.message
    assert FAKE_KEY not in info.message


def test_a_stage_against_a_redirecting_server_sends_nothing_elsewhere(
    cli: Any, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALIBRATE_API_KEY", FAKE_KEY)
    with CannedServer({}) as elsewhere:
        where = elsewhere.base_url.removesuffix("/v1")
        replies = {p: (302, {"Location": where + p}, b"") for p in PATHS}
        with CannedServer(replies) as server:  # type: ignore[arg-type]
            write_config(isolated / "calibrate.toml", server.base_url)
            result = cli("single")
        assert elsewhere.hits == []
    assert result.code == 1 and "does not follow redirects" in result.err
    assert FAKE_KEY not in result.err
