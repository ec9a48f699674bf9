"""The client's bounds: an answer-size cap (issue 10, item 19) and a connection pool that does
not pre-fill to a huge size (item 5)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from calibrate.http.client import OpenAIClient
from calibrate.http.models import SamplingParams
from tests.helpers import write_config
from tests.mockserver import start_mock
from tests.tier_helpers import jsonl

FAST: dict[str, Any] = {"ttft_s": 0.001, "per_token_s": 0.0001}


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_over_max_response_mib_is_invalid_response(
    cli: Any, isolated: Path, stream: bool
) -> None:
    with start_mock(**FAST, huge_mib=3) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url, "max_response_mib = 1\n")
        result = cli("single", *(["--stream"] if stream else []))
        write_config(isolated / "calibrate.toml", mock.base_url, "max_response_mib = 4\n")
        roomy = cli("single", *(["--stream"] if stream else []))
    assert result.code == 1, result.err
    assert "(invalid_response)" in result.err and "answer larger than 1 MiB" in result.err
    assert "Traceback" not in result.err
    assert roomy.code == 0, roomy.err  # under the cap, the same answer passes
    records = [r for p in sorted((isolated / "runs").glob("*/records.jsonl")) for r in jsonl(p)]
    kinds = sorted(r["error"]["kind"] if r["error"] else "ok" for r in records)
    assert kinds == ["invalid_response", "ok"]


def test_max_response_mib_out_of_range_is_a_usage_error(cli: Any, isolated: Path) -> None:
    write_config(isolated / "calibrate.toml", "http://127.0.0.1:9/v1", "max_response_mib = 0\n")
    result = cli("single")
    assert result.code == 2 and "max_response_mib" in result.err


def test_a_huge_max_connections_constructs_instantly_and_still_serves_many_threads() -> None:
    start = time.perf_counter()
    client = OpenAIClient("http://127.0.0.1:9/v1", max_connections=10**9)
    assert time.perf_counter() - start < 0.5
    with start_mock(**FAST) as mock:
        client = OpenAIClient(mock.base_url, max_connections=10**9, timeout_s=10)
        params = SamplingParams(temperature=0.0, max_tokens=8, top_p=1.0, seed=0)
        start = time.perf_counter()
        assert client.chat("internlm-s2", "hi", params).text  # the pool is built on first use
        assert time.perf_counter() - start < 1.0
        with ThreadPoolExecutor(16) as pool:
            done = list(pool.map(lambda _: client.chat("internlm-s2", "hi", params), range(32)))
        client.close()
    assert all(c.text for c in done)
