"""A client that leaves frees its slot at once, as on a real engine.

vLLM aborts a request whose client closed the connection, streamed or not (its engine suite's
test_a_request_whose_client_left_frees_its_slot_as_the_mock_does). The mock slept a non-streamed
answer (and a streamed one's first token) out whatever the client did, so a request calibrate
gave up on (its deadline, a Ctrl-C) held one of the mock's slots for an answer nobody would read,
and the next request queued behind it: a slower server than vLLM.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest
import requests

from tests.mockserver import start_mock

LONG_S = 2.0  # what the abandoned answer would take; the next one takes ~0.05 s


def _leave_early(port: int, body: dict[str, Any]) -> None:
    """Send ``body`` as a completion, then close the connection before any answer."""
    raw = json.dumps({"model": "internlm-s2", **body}).encode()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw)
        )
        time.sleep(0.3)  # it holds the one slot now


@pytest.mark.parametrize(
    ("settings", "stream"),
    [
        ({"per_token_s": LONG_S / 100}, False),  # a whole answer, then sent
        ({"prefill_ms_per_1k_tokens": LONG_S * 1000}, True),  # a long prompt's first token
        ({"per_token_s": LONG_S / 100, "kv_capacity_tokens": 4096}, False),
    ],
    ids=["whole", "streamed", "kv-tracked"],
)
def test_a_request_whose_client_left_frees_its_slot_for_the_next(
    settings: dict[str, Any], stream: bool
) -> None:
    with start_mock(slots=1, ttft_s=0.01, **settings) as mock:
        long_prompt = "x " * (1000 if stream else 1)  # about 1,000 tokens to read first
        left = {"prompt": long_prompt, "max_tokens": 100, "ignore_eos": True, "stream": stream}
        _leave_early(mock.port, left)
        started = time.monotonic()
        answer = requests.post(
            f"{mock.base_url}/completions",
            json={"model": "internlm-s2", "prompt": "y", "max_tokens": 1, "stream": stream},
            timeout=30,
        )
        waited_s = time.monotonic() - started
    assert answer.status_code == 200
    assert waited_s < LONG_S / 2, f"the next request waited {waited_s:.2f} s for a ghost"
