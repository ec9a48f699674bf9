"""One endpoint answering as another model (issue 23, low): batch holds every answer to the
model the baseline named (else to its first answers'), and stops on the first that names another
— as several endpoints are refused when they answer unlike the baseline."""

from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.canned_server import CannedServer, Reply
from tests.helpers import write_config
from tests.mockserver import start_mock
from tests.tier_helpers import jsonl

FAST: dict[str, Any] = {"ttft_s": 0.002, "per_token_s": 0.0002}


def _tasks(root: Path, n: int) -> None:
    (root / "in.jsonl").write_text(
        "".join(f'{{"id": {i}, "text": "item {i}"}}\n' for i in range(n)), encoding="utf-8"
    )


def _batch(cli: Any, *flags: str) -> Any:
    return cli("batch", "--input", "in.jsonl", "--out", "out.jsonl", "-c", "1", *flags)


@pytest.mark.parametrize("other", ["llama-3-8b", "internlm-s2-chat"])
def test_a_server_answering_as_another_model_than_the_baseline_stops_the_batch(
    cli: Any, isolated: Path, other: str
) -> None:
    _tasks(isolated, 20)
    with start_mock(**FAST) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url)
        assert cli("single").code == 0  # the baseline: served_model internlm-s2
    # the same URL now serves other weights that accept any name and answer as themselves
    with start_mock(**FAST, models=(other,), any_model=True, port=mock.port):
        result = _batch(cli)
    assert result.code == 1, result.err
    assert f"answered as model {other!r}, not 'internlm-s2'" in result.err
    assert "Traceback" not in result.err
    assert len(jsonl(isolated / "out.jsonl")) < 20  # stopped, the rest left for a rerun


def _answer(model: str) -> Reply:
    body = {
        "model": model,
        "choices": [{"index": 0, "message": {"content": "An answer."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }
    return 200, {}, json.dumps(body).encode()


@pytest.mark.parametrize("swap_after", [1, 5])
def test_a_mid_run_swap_without_a_baseline_stops_the_batch(
    cli: Any, isolated: Path, swap_after: int
) -> None:
    _tasks(isolated, 20)
    count = itertools.count()
    lock = threading.Lock()

    def chat() -> Reply:
        with lock:
            n = next(count)
        return _answer("model-a" if n < swap_after else "model-b")

    models = (200, {}, b'{"data": [{"id": "internlm-s2"}]}')
    with CannedServer({"/v1/models": models, "/v1/chat/completions": chat}) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        result = _batch(cli)
    assert result.code == 1, result.err
    assert "answered as model 'model-b', not 'model-a'" in result.err
    assert len(jsonl(isolated / "out.jsonl")) <= swap_after + 1


@pytest.mark.parametrize("named", ["internlm-s2", "gpt-3.5-turbo"])
def test_a_server_that_names_one_model_throughout_passes(
    cli: Any, isolated: Path, named: str
) -> None:
    """llama.cpp names its own alias, whatever was asked: consistent, so no alarm."""
    _tasks(isolated, 8)
    models = (200, {}, b'{"data": [{"id": "internlm-s2"}]}')
    chat = _answer(named)
    with CannedServer({"/v1/models": models, "/v1/chat/completions": chat}) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        result = _batch(cli)
    assert result.code == 0, result.err
    assert len(jsonl(isolated / "out.jsonl")) == 8
