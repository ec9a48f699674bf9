"""A total deadline per request (issue 10, item 3): ``timeout_s`` bounds the whole request, so a
server that drips its answer or streams only keep-alive comments is cut, streaming or not."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import write_config
from tests.mockserver import start_mock
from tests.tier_helpers import jsonl

FAST: dict[str, Any] = {"ttft_s": 0.001, "per_token_s": 0.0001}
# the fixed prompt's 128 tokens at 0.2 s apart: a dripped answer whole takes 25.6 s at least
# (keep-alive comments only: never). A request cut at timeout_s 1 took about 1 s by its own
# clock; the bound leaves a busy machine room to be late, never room for the whole answer.
CUT_BY_S = 6.0
WHOLE_ANSWER_S = 128 * 0.2


def _config(root: Path, base_url: str, timeout_s: float, extra: str = "") -> None:
    write_config(root / "calibrate.toml", base_url)
    text = (
        (root / "calibrate.toml")
        .read_text("utf-8")
        .replace("timeout_s = 30", f"timeout_s = {timeout_s}")
    )
    (root / "calibrate.toml").write_text(text + extra, encoding="utf-8")


@pytest.mark.parametrize(
    ("hostile", "stream"),
    [
        ({"drip_s": 0.2}, False),
        ({"drip_s": 0.2}, True),
        ({"keepalive_only": True}, True),
        ({"keepalive_only": True}, False),
    ],
)
def test_a_dripping_or_pinging_server_is_cut_at_timeout_s(
    cli: Any, isolated: Path, hostile: dict[str, Any], stream: bool
) -> None:
    with start_mock(**FAST, **hostile) as mock:
        _config(isolated, mock.base_url, 1)
        start = time.monotonic()
        result = cli("single", *(["--stream"] if stream else []))
        elapsed = time.monotonic() - start
    assert result.code == 1, result.err
    assert "(timeout)" in result.err and "after 1 s" in result.err
    assert elapsed < WHOLE_ANSWER_S  # the command never waited the answer out
    (record,) = [r for p in (isolated / "runs").glob("*/records.jsonl") for r in jsonl(p)]
    assert record["error"]["kind"] == "timeout"
    assert 1 <= record["elapsed_s"] < CUT_BY_S, record  # cut at the deadline, by its own clock


def test_batch_items_against_a_dripping_server_fail_as_timeouts(cli: Any, isolated: Path) -> None:
    (isolated / "in.jsonl").write_text(
        "".join(f'{{"id": {i}, "text": "item {i}"}}\n' for i in range(2)), encoding="utf-8"
    )
    with start_mock(**FAST, drip_s=0.2) as mock:
        _config(isolated, mock.base_url, 1)
        start = time.monotonic()
        result = cli(
            "batch", "--input", "in.jsonl", "--out", "out.jsonl", "--retries", "0", "-c", "2"
        )
        elapsed = time.monotonic() - start
    assert result.code == 1, result.err
    lines = jsonl(isolated / "out.jsonl")
    assert len(lines) == 2 and {line["error"]["kind"] for line in lines} == {"timeout"}
    assert elapsed < WHOLE_ANSWER_S  # the two items side by side, each cut at its deadline


@pytest.mark.parametrize(
    "line", ["connect_timeout_s = 0", "connect_timeout_s = nan", "connect_timeout_s = inf"]
)
def test_connect_timeout_out_of_range_is_a_usage_error(cli: Any, isolated: Path, line: str) -> None:
    _config(isolated, "http://127.0.0.1:9/v1", 5, line + "\n")
    result = cli("single")
    assert result.code == 2 and "connect_timeout_s" in result.err
