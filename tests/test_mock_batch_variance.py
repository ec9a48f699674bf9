"""The mock's batch variance (``--nondeterministic-above N``) as an engine's: an answer varies
with the requests decoding *beside* it, never with those queued behind it for a slot."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from calibrate.mock import MockModel, MockSettings
from tests.mockserver import start_mock

CHAT = {
    "model": "internlm-s2",
    "messages": [{"role": "user", "content": "Name the three primary colours."}],
    "temperature": 0,
    "max_tokens": 30,
}


def _copies(base_url: str, n: int) -> list[str]:
    def one(_: int) -> str:
        answer = requests.post(f"{base_url}/chat/completions", json=CHAT, timeout=30)
        answer.raise_for_status()
        return str(answer.json()["choices"][0]["message"]["content"])

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


@pytest.mark.parametrize("stream", [False, True])
def test_copies_queued_on_a_one_slot_server_answer_alike(stream: bool) -> None:
    """Four copies at once on a 1-slot mock ran one at a time: each alone in its batch, so
    none varies (the mock used to count the three queued ones in flight, and 3 of 4 differed)."""
    with start_mock(ttft_s=0.02, per_token_s=0.002, slots=1, nondeterministic_above=1) as mock:
        if stream:
            body = CHAT | {"stream": True}
            with ThreadPoolExecutor(4) as pool:
                done = pool.map(
                    lambda _: (
                        requests.post(
                            f"{mock.base_url}/chat/completions", json=body, timeout=30
                        ).text
                    ),
                    range(4),
                )
                texts = [_streamed(raw) for raw in done]
        else:
            texts = _copies(mock.base_url, 4)
    assert len(set(texts)) == 1, texts


def test_copies_running_together_still_vary() -> None:
    """With room for all four in one batch the copies run together and vary, as before."""
    with start_mock(ttft_s=0.05, per_token_s=0.002, slots=4, nondeterministic_above=1) as mock:
        texts = _copies(mock.base_url, 4)
    assert len(set(texts)) > 1, texts


def test_a_request_varies_by_what_runs_beside_it_when_seated_not_by_the_queue() -> None:
    model = MockModel(MockSettings(slots=1, nondeterministic_above=1))
    a, b = model.admit(), model.admit()  # two in flight: a runs, b waits for its slot
    assert model.seat(a, model.queue_up(a))
    entry = model.queue_up(b)
    assert not model.seat(b, entry)
    assert model.batch_varied(a) is None
    model.release(a)
    assert model.seat(b, entry) and model.batch_varied(b) is None  # it ran alone
    assert model.generate("hello", None, b).text == model.generate("hello", None, a).text
    model.release(b)


def _streamed(raw: str) -> str:
    import json

    parts = []
    for line in raw.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            chunk = json.loads(line.removeprefix("data: "))
            for choice in chunk.get("choices") or ():
                parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)
