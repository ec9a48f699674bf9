"""Slow headers (issue 23, item 4): a server that sends its status line and headers a byte at a
time is cut at ``timeout_s`` like one that drips its body — for every request calibrate makes
(completions, streamed or not, /v1/models, /metrics, /props, a health probe), in single, batch
and ladder."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from calibrate.errors import RequestError
from calibrate.http.client import OpenAIClient
from calibrate.http.models import SamplingParams
from tests.front_proxy import FrontProxy
from tests.helpers import write_config
from tests.mockserver import start_mock
from tests.tier_helpers import FAST as LADDER_FAST
from tests.tier_helpers import jsonl, open_gate

FAST: dict[str, Any] = {"ttft_s": 0.001, "per_token_s": 0.0001, "expose_props": True}
MARGIN_S = 1.5  # a loaded 2-core machine: the deadline plus scheduling, not the drip's minutes


def _timeout_config(root: Path, base_url: str, timeout_s: float, extra: str = "") -> None:
    write_config(root / "calibrate.toml", base_url, extra)
    path = root / "calibrate.toml"
    path.write_text(
        path.read_text("utf-8").replace("timeout_s = 30", f"timeout_s = {timeout_s}"), "utf-8"
    )


@pytest.mark.parametrize(
    ("call", "path"),
    [
        (lambda c: c.models(), "/models"),
        (lambda c: c.get_text("/metrics"), "/metrics"),
        (lambda c: c.get_text("/props"), "/props"),
        (lambda c: c.get_text("/health"), "/health"),
        (
            lambda c: c.chat(
                "internlm-s2", "hi", SamplingParams(temperature=0.0, top_p=1.0, max_tokens=4)
            ),
            "/completions",
        ),
        (
            lambda c: c.chat(
                "internlm-s2",
                "hi",
                SamplingParams(temperature=0.0, top_p=1.0, max_tokens=4),
                stream=True,
            ),
            "/completions",
        ),
    ],
    ids=["models", "metrics", "props", "health", "chat", "chat-stream"],
)
def test_every_request_is_cut_at_its_deadline_while_headers_drip(call: Any, path: str) -> None:
    with start_mock(**FAST) as mock, FrontProxy(mock.base_url, [path], drip_s=0.1) as proxy:
        client = OpenAIClient(proxy.base_url, timeout_s=0.8)
        start = time.monotonic()
        with pytest.raises(RequestError) as caught:
            call(client)
        elapsed = time.monotonic() - start
        client.close()
    assert caught.value.info.kind == "timeout", caught.value.info
    assert 0.7 < elapsed < 0.8 + MARGIN_S
    assert proxy.dripped  # the drip was what it ran into


def test_a_slow_but_finishing_header_drip_within_the_deadline_still_answers() -> None:
    with start_mock(**FAST) as mock, FrontProxy(mock.base_url, ["/models"], drip_s=0.001) as proxy:
        client = OpenAIClient(proxy.base_url, timeout_s=10)
        (model,) = client.models()
        client.close()
    assert model.id == "internlm-s2"


@pytest.mark.parametrize("stream", [False, True])
def test_single_against_slow_headers_ends_at_timeout_s(
    cli: Any, isolated: Path, stream: bool
) -> None:
    with start_mock(**FAST) as mock, FrontProxy(mock.base_url, ["/completions"]) as proxy:
        _timeout_config(isolated, proxy.base_url, 1)
        start = time.monotonic()
        result = cli("single", *(["--stream"] if stream else []))
        elapsed = time.monotonic() - start
    assert result.code == 1, result.err
    assert "(timeout)" in result.err
    assert elapsed < 1 + MARGIN_S + 1  # one request; its /v1/models answered at once
    (record,) = [r for p in (isolated / "runs").glob("*/records.jsonl") for r in jsonl(p)]
    assert record["error"]["kind"] == "timeout"


def test_batch_items_against_slow_headers_fail_as_timeouts(cli: Any, isolated: Path) -> None:
    (isolated / "in.jsonl").write_text(
        "".join(f'{{"id": {i}, "text": "item {i}"}}\n' for i in range(3)), encoding="utf-8"
    )
    with start_mock(**FAST) as mock, FrontProxy(mock.base_url, ["/completions"]) as proxy:
        _timeout_config(isolated, proxy.base_url, 1)
        start = time.monotonic()
        result = cli(
            "batch", "--input", "in.jsonl", "--out", "out.jsonl", "--retries", "0", "-c", "3"
        )
        elapsed = time.monotonic() - start
    assert result.code == 1, result.err
    lines = jsonl(isolated / "out.jsonl")
    assert len(lines) == 3 and {line["error"]["kind"] for line in lines} == {"timeout"}
    assert elapsed < 1 + MARGIN_S + 3


@pytest.mark.parametrize("paths", [["/completions"], ["/metrics"]], ids=["completions", "metrics"])
def test_ladder_against_slow_headers_ends_in_time(
    cli: Any, isolated: Path, paths: list[str]
) -> None:
    with start_mock(**FAST) as mock, FrontProxy(mock.base_url, paths) as proxy:
        open_gate(isolated, proxy.base_url, LADDER_FAST + "batch_sizes = [1, 2]\n")
        path = isolated / "calibrate.toml"
        path.write_text(path.read_text("utf-8").replace("timeout_s = 30", "timeout_s = 1"), "utf-8")
        start = time.monotonic()
        result = cli("ladder", "--vram-source", "metrics" if paths == ["/metrics"] else "none")
        elapsed = time.monotonic() - start
    assert "Traceback" not in result.err
    if paths == ["/completions"]:
        assert result.code == 1, result.err  # every request timed out: batch 1 failed
    else:
        assert result.code == 2 and "/metrics" in result.err  # no usable figure in time
    assert elapsed < 12  # the drip of one answer's headers alone would take ~10 s per request
