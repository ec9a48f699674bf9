"""Every number read from a server is bounded (issue 23, item 12): a usage count of 10**330 or
−8768 is ``invalid_response``, never an OverflowError or a negative rate; a gauge, a /props slot
count, a max_model_len or a Retry-After out of range is ignored, as if the server had not said."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from calibrate.errors import RequestError
from calibrate.gpu.engine_metrics import device_memory, kv_usage, queue_depth
from calibrate.gpu.prometheus import parse_prometheus
from calibrate.http.client import OpenAIClient
from calibrate.http.error_kinds import retry_after_s
from calibrate.http.responses import parse_chunk, parse_completion
from calibrate.stages.prepare.server_cap import read_server_cap
from tests.canned_server import CannedServer
from tests.helpers import write_config
from tests.mockserver import start_mock
from tests.tier_helpers import jsonl

FAST: dict[str, Any] = {"ttft_s": 0.001, "per_token_s": 0.0001}
ANSWER = {"choices": [{"index": 0, "message": {"content": "x"}, "finish_reason": "stop"}]}


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": 5, "completion_tokens": 10**330},
        {"prompt_tokens": 5, "completion_tokens": -8768},
        {"prompt_tokens": -1, "completion_tokens": 4},
        {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 10**20},
        {"prompt_tokens": 10**400, "completion_tokens": 4},
    ],
)
def test_a_usage_count_out_of_range_is_invalid_response(usage: dict[str, int]) -> None:
    for parse in (
        lambda: parse_completion(ANSWER | {"usage": usage}, 0.1, None, chat=True),
        lambda: parse_chunk({"choices": [], "usage": usage}, chat=True),
    ):
        with pytest.raises(RequestError) as caught:
            parse()
        assert caught.value.kind == "invalid_response"
        assert "usage." in caught.value.info.message and len(caught.value.info.message) < 200


def test_a_usage_count_in_range_is_kept() -> None:
    usage = {"prompt_tokens": 0, "completion_tokens": 10**9, "total_tokens": 10**9}
    parsed = parse_completion(ANSWER | {"usage": usage}, 0.1, None, chat=True).usage
    assert parsed is not None and parsed.completion_tokens == 10**9


@pytest.mark.parametrize("index", [-1, 2**31, 10**330])
def test_a_choice_index_out_of_range_is_invalid_response(index: int) -> None:
    choice = {"index": index, "message": {"content": "x"}}
    with pytest.raises(RequestError) as caught:
        parse_completion({"choices": [choice]}, 0.1, None, chat=True)
    assert caught.value.kind == "invalid_response"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_single_and_batch_end_cleanly_on_huge_or_negative_usage(
    cli: Any, isolated: Path, stream: bool, seed: int
) -> None:
    (isolated / "in.jsonl").write_text(
        "".join(f'{{"id": {i}, "text": "item {i}"}}\n' for i in range(6)), encoding="utf-8"
    )
    flags = ["--stream"] if stream else []
    # malformed_rate 1: every answer a wrong shape, huge and negative usage among them
    with start_mock(**FAST, malformed_rate=1.0, seed=seed) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url)
        single = cli("single", *flags)
        batch = cli("batch", "--input", "in.jsonl", "--out", "out.jsonl", "--retries", "0")
    assert single.code == 1 and "invalid_response" in single.err
    for result in (single, batch):
        assert "Traceback" not in result.err and "OverflowError" not in result.err
    assert batch.code == 1, batch.err
    lines = jsonl(isolated / "out.jsonl")
    assert len(lines) == 6 and {line["error"]["kind"] for line in lines} == {"invalid_response"}
    assert "failed" in batch.err  # the summary was written


def test_huge_and_negative_usage_shapes_are_both_drawn() -> None:
    import requests

    body = {"model": "internlm-s2", "messages": [{"role": "user", "content": "hi"}]}
    seen: set[str] = set()
    with start_mock(**FAST, malformed_rate=1.0, seed=3) as mock:
        for _ in range(40):
            reply = requests.post(f"{mock.base_url}/chat/completions", json=body, timeout=5).json()
            if "usage" in reply:
                count = reply["usage"]["completion_tokens"]
                seen.add("huge" if count > 10**300 else "negative" if count < 0 else "?")
    assert seen == {"huge", "negative"}


@pytest.mark.parametrize(
    "metrics",
    [
        "vllm:kv_cache_usage_perc 1e300\nvllm:num_requests_waiting -5\n",
        "vllm:kv_cache_usage_perc -0.5\nvllm:num_requests_waiting 1e300\n",
        "vllm:kv_cache_usage_perc 1e400\nvllm:num_requests_waiting nan\n",
        "vllm:kv_cache_usage_perc 250\nvllm:num_requests_waiting -inf\n",
    ],
)
def test_a_gauge_out_of_range_is_ignored(metrics: str) -> None:
    scrape = parse_prometheus(metrics)
    assert kv_usage(scrape) is None and queue_depth(scrape) is None


def test_gauges_in_range_are_read() -> None:
    scrape = parse_prometheus("vllm:kv_cache_usage_perc 0.5\nvllm:num_requests_waiting 3\n")
    kv, queue = kv_usage(scrape), queue_depth(scrape)
    assert kv is not None and kv.usage == 0.5 and queue is not None and queue.value == 3


@pytest.mark.parametrize(
    "metrics",
    [
        "DCGM_FI_DEV_FB_USED -4096\nDCGM_FI_DEV_FB_FREE 1000\n",
        "DCGM_FI_DEV_FB_USED 1e300\nDCGM_FI_DEV_FB_FREE 1000\n",
        'mock_vram_used_bytes 1e300\nmock_vram_total_bytes{gpu="0"} 10\n',
        "mock_vram_used_bytes 1000\nmock_vram_total_bytes -1e30\n",
    ],
)
def test_device_memory_out_of_range_is_no_reading(metrics: str) -> None:
    assert device_memory(parse_prometheus(metrics)) is None


@pytest.mark.parametrize(
    "props", [{"total_slots": 10**330}, {"total_slots": -4}, {"total_slots": 0}, "[" * 100_000]
)
def test_a_props_slot_count_out_of_range_is_no_cap(props: object) -> None:
    text = props if isinstance(props, str) else json.dumps(props)
    assert read_server_cap(lambda path: text if path == "/props" else "{}") is None
    assert read_server_cap(lambda path: json.dumps({"total_slots": 4})).slots == 4  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1e400", None), ("nan", None), ("-3", None), ("inf", None), ("2", 2.0), ("1e9", 3600.0)],
)
def test_retry_after_out_of_range_is_no_hint(value: str, expected: float | None) -> None:
    assert retry_after_s(value) == expected


@pytest.mark.parametrize("max_len", ["1" + "0" * 330, "-8192", "0", "true", str(2**40)])
def test_a_max_model_len_out_of_range_is_ignored(max_len: str) -> None:
    body = f'{{"data": [{{"id": "m", "max_model_len": {max_len}}}, {{"id": "n", "max_model_len": 8192}}]}}'
    with CannedServer({"/v1/models": (200, {}, body.encode())}) as server:
        client = OpenAIClient(server.base_url, timeout_s=5)
        first, second = client.models()
        client.close()
    assert first.id == "m" and first.max_model_len is None
    assert second.max_model_len == 8192
