"""LMDeploy as calibrate starts it and as the mock plays it: the failure modes of the InternLM
guide rehearsed without a GPU.

LMDeploy's own sources: ``/metrics`` came in v0.9.2 behind ``--enable-metrics``; from v0.11.0
they are on by default and the flag is gone (``--disable-metrics`` instead), so passing it makes
``lmdeploy serve api_server`` exit with "unrecognized arguments" there (and before v0.9.2).
calibrate passes no metrics flag; on v0.9.2–v0.10.x the user adds it to ``[server] args``."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from calibrate.engines.base import LaunchSpec
from calibrate.engines.builders import build
from tests.helpers import write_config
from tests.mockserver import start_mock
from tests.tier_helpers import FAST, open_gate

LMDEPLOY = '[server]\nkind = "lmdeploy"\nmodel_path = "/models/internlm-s2"\n'


def test_lmdeploy_is_started_without_a_metrics_flag_and_args_may_add_it() -> None:
    plain = build(LaunchSpec("lmdeploy", "/m", 23333, 4, 4)).argv
    assert not [w for w in plain if "metrics" in w], plain
    old = build(LaunchSpec("lmdeploy", "/m", 23333, 4, 4, args=("--enable-metrics",))).argv
    assert old.count("--enable-metrics") == 1 and old[-1] == "--enable-metrics", old


def _post(url: str, body: dict[str, object]) -> tuple[int, str]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.status, answer.read().decode()


def test_the_mock_answers_an_engine_failure_as_lmdeploy_does() -> None:
    """HTTP 200, finish_reason "error", the reason as the text: INPUT_LENGTH_ERROR for a prompt
    the session cannot hold, INTERNAL_ENGINE_ERROR for any other failure."""
    settings = {"ttft_s": 0.001, "per_token_s": 0.0002, "error_style": "lmdeploy"}
    chat = {"model": "internlm-s2", "messages": [{"role": "user", "content": "hi"}]}
    with start_mock(**settings, max_model_len=64) as mock:
        status, text = _post(f"{mock.base_url}/chat/completions", {**chat, "max_tokens": 100})
    choice = json.loads(text)["choices"][0]
    assert status == 200 and choice["finish_reason"] == "error"
    assert choice["message"]["content"] == (
        "internal error happened, status code ResponseType.INPUT_LENGTH_ERROR"
    )
    with start_mock(**settings, fail_rate=1.0) as mock:
        status, text = _post(f"{mock.base_url}/chat/completions", {**chat, "stream": True})
    assert status == 200 and '"finish_reason": "error"' in text
    assert "ResponseType.INTERNAL_ENGINE_ERROR" in text and text.rstrip().endswith("[DONE]")


def test_the_mock_serves_lmdeploys_gauges_or_no_metrics_at_all() -> None:
    with start_mock(metrics_style="lmdeploy") as mock:
        got = urllib.request.urlopen(mock.base_url.removesuffix("/v1") + "/metrics")
        text = got.read().decode()
        got.close()
    for name in ("gpu_cache_usage_perc", "num_requests_waiting", "num_requests_running"):
        assert f'lmdeploy:{name}{{engine="0"}} ' in text
    with start_mock(metrics=False) as mock, pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(mock.base_url.removesuffix("/v1") + "/metrics")
    assert refused.value.code == 404
    refused.value.close()


def test_a_ladder_reads_lmdeploys_gauges(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005, slots=2, metrics_style="lmdeploy") as mock:
        open_gate(isolated, mock.base_url, f"{FAST}batch_sizes = [1, 2]\n{LMDEPLOY}")
        result = cli("ladder")
    assert result.code == 0, result.err
    source = next(ln for ln in result.err.splitlines() if ln.startswith("VRAM source: "))
    assert "lmdeploy:gpu_cache_usage_perc" in source, source
    assert "server queue: lmdeploy:num_requests_waiting" in source, source
    assert "no lmdeploy:gpu_cache_usage_perc" not in result.err


def test_a_ladder_on_an_lmdeploy_without_metrics_says_how_to_turn_them_on(
    cli, isolated: Path
) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005, slots=2, metrics=False) as mock:
        open_gate(isolated, mock.base_url, f"{FAST}batch_sizes = [1, 2]\n{LMDEPLOY}")
        result = cli("ladder")
    assert result.code == 0, result.err
    warning = next(ln for ln in result.err.splitlines() if "no lmdeploy:gpu_cache_usage" in ln)
    assert warning.startswith("warning: no lmdeploy:gpu_cache_usage_perc on the server's /metrics")
    assert "on v0.9.2–v0.10.x only with --enable-metrics: add it to [server] args" in warning


def test_a_ladder_against_lmdeploys_engine_errors_quotes_them(cli, isolated: Path) -> None:
    """A tier whose requests LMDeploy failed fails, and the incident line quotes LMDeploy's
    text (it used to say only "finish_reason is 'error', not 'stop'")."""
    with start_mock(ttft_s=0.002, per_token_s=0.0005, error_style="lmdeploy", fail_rate=1.0) as m:
        write_config(isolated / "calibrate.toml", m.base_url, f"{FAST}batch_sizes = [1, 2]\n")
        open_gate(isolated, m.base_url, f"{FAST}batch_sizes = [1, 2]\n")
        result = cli("ladder")
    assert result.code == 1, result.err
    assert "status code ResponseType.INTERNAL_ENGINE_ERROR" in result.err, result.err
