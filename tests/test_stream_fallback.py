"""A server that refuses streamed requests (SPEC §5.13): one probe before the ladder or sweep, a
fallback to streaming without stream_options, then to unstreamed, said once and recorded; the
probe counted in no tier; nothing retried on a 5xx, an OOM or a timeout; the real mock over HTTP."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from calibrate.cli.mock import register, settings_from_args
from calibrate.errors import ErrorInfo, ErrorKind, RequestError
from calibrate.http.client import OpenAIClient
from calibrate.http.models import SamplingParams
from calibrate.stages.prepare.stream_probe import StreamCheck, check_streaming, stream_details
from tests.helpers import write_config
from tests.mockserver import start_mock
from tests.tier_helpers import FAST, jsonl, open_gate, run_dir

REFUSED = "the server refused streamed requests (HTTP 400: streaming is not supported"
OPTIONS_REFUSED = "the server refused stream_options (HTTP 400: Unrecognized request argument"
LADDER = FAST + "batch_sizes = [1, 2]\n"
SWEEP = FAST + "[sweep]\nconcurrency = [1, 2]\nlevel_s = 0.2\nrepeats = 1\n"


class Scripted:
    """A probe sender answering each shape as scripted: None = answered, else that error kind."""

    def __init__(self, **answers: ErrorKind | None) -> None:
        self.answers = answers
        self.sent: list[tuple[bool, bool]] = []

    def __call__(self, stream: bool, stream_options: bool) -> None:
        self.sent.append((stream, stream_options))
        name = "unstreamed" if not stream else "streamed" if stream_options else "no_options"
        kind = self.answers.get(name)
        if kind is not None:
            status = {"http_4xx": 400, "http_5xx": 500, "oom": 500}.get(kind)
            raise RequestError(ErrorInfo(kind, f"HTTP {status}: no ({name})", status))


def test_a_refused_stream_falls_back_one_shape_at_a_time() -> None:
    refuses_all = Scripted(streamed="http_4xx", no_options="http_4xx")
    check = check_streaming(refuses_all)
    assert refuses_all.sent == [(True, True), (True, False), (False, False)]
    assert check == StreamCheck(False, False, "HTTP 400: no (streamed)")
    note = check.note() or ""
    assert note.startswith("the server refused streamed requests (HTTP 400: no (streamed)): ")
    assert "TTFT, TPOT and ITL not measured; E2E and throughput are" in note
    only_options = Scripted(streamed="http_4xx")
    check = check_streaming(only_options)
    assert only_options.sent == [(True, True), (True, False)]
    assert check.stream and not check.stream_options and check.fell_back
    assert "the server refused stream_options" in (check.note() or "")
    assert stream_details(check)["streaming"] == {
        "stream": True,
        "stream_options": False,
        "refused": "HTTP 400: no (streamed)",
    }
    assert stream_details(None) == {}


@pytest.mark.parametrize("kind", ["http_5xx", "oom", "timeout", "reset", "overloaded"])
def test_capacity_and_transport_failures_are_never_retried(kind: ErrorKind) -> None:
    """A 5xx, an OOM, a timeout is information for the tiers: one probe, no fallback."""
    send = Scripted(streamed=kind)
    assert check_streaming(send) == StreamCheck() and send.sent == [(True, True)]
    assert stream_details(StreamCheck()) == {
        "streaming": {"stream": True, "stream_options": True, "refused": None}
    }


def test_a_fallback_that_fails_otherwise_or_a_4xx_to_every_shape_changes_nothing() -> None:
    """Not about streaming after all: the stage sends what it would have, its tiers say why."""
    later_5xx = Scripted(streamed="http_4xx", no_options="http_5xx")
    assert check_streaming(later_5xx) == StreamCheck() and len(later_5xx.sent) == 2
    every = Scripted(streamed="http_4xx", no_options="http_4xx", unstreamed="http_4xx")
    assert check_streaming(every) == StreamCheck() and len(every.sent) == 3


def _post(base_url: str, *, stream: bool, stream_options: bool) -> Any:
    client = OpenAIClient(base_url, timeout_s=10)
    params = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=4)
    body = client.chat_body(
        "internlm-s2", "hi", params, stream=stream, stream_options=stream_options
    )
    try:
        return client.post_completion("/chat/completions", body)
    finally:
        client.close()


def test_the_mock_refuses_streaming_or_stream_options_with_an_openai_style_400() -> None:
    with start_mock(ttft_s=0.001, per_token_s=0.0001, refuse_stream=True) as mock:
        with pytest.raises(RequestError) as refused:
            _post(mock.base_url, stream=True, stream_options=False)
        assert _post(mock.base_url, stream=False, stream_options=False).text
    assert refused.value.info.status == 400 and refused.value.kind == "http_4xx"
    assert refused.value.info.message == "HTTP 400: streaming is not supported by this server"
    assert json.loads(refused.value.info.body or "")["type"] == "BadRequestError"
    with start_mock(ttft_s=0.001, per_token_s=0.0001, refuse_stream_options=True) as mock:
        with pytest.raises(RequestError) as unknown:
            _post(mock.base_url, stream=True, stream_options=True)
        streamed = _post(mock.base_url, stream=True, stream_options=False)
    assert "Unrecognized request argument supplied: stream_options" in unknown.value.info.message
    assert streamed.ttft_s is not None and streamed.usage is None


def test_the_mock_flags_set_the_settings() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    register(parser.add_subparsers())
    args = parser.parse_args(["mock", "--refuse-stream", "--refuse-stream-options"])
    settings = settings_from_args(args)
    assert settings.refuse_stream and settings.refuse_stream_options


def _summary(root: Path, run_id: str) -> dict[str, Any]:
    summary = json.loads((run_dir(root, run_id) / "summary.json").read_text("utf-8"))
    assert isinstance(summary, dict)
    return dict(summary["summary"])


def test_ladder_against_a_server_that_refuses_streaming_is_measured_unstreamed(
    cli, isolated: Path
) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005, refuse_stream=True) as mock:
        open_gate(isolated, mock.base_url, LADDER)
        result = cli("ladder", "--json")
        admitted = mock.model.snapshot().requests_total
    assert result.code == 0, result.err
    # both tiers kept (the setting is 1 or 2: one wave each may leave 2's gain in the noise)
    assert result.json["max_in_flight"] == 2 and result.json["stopped_by"] == "completed"
    assert result.err.count(REFUSED) == 1, result.err
    assert "E2E and throughput are" in result.err
    assert "answered the streamed requests without streaming" not in result.err
    assert "not streamed; workload" in result.err  # the announcement says what is sent
    run = run_dir(isolated, result.json["run_id"])
    records = jsonl(run / "records.jsonl")
    assert len(records) == 2 * (1 + 2) and all(r["ok"] for r in records)
    assert all(r["ttft_s"] is None for r in records)
    assert admitted == len(records) + 1, "the one answered probe is counted in no tier"
    summary = _summary(isolated, result.json["run_id"])
    assert summary["streaming"]["stream"] is False
    assert summary["notes"][0].startswith(REFUSED)
    shown = cli("report", str(run), "--no-plot", "--json")
    assert shown.code == 0 and REFUSED in shown.err
    assert shown.json["notes"][0].startswith(REFUSED)


def test_sweep_against_a_server_that_refuses_streaming_is_measured_unstreamed(
    cli, isolated: Path
) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005, refuse_stream=True) as mock:
        open_gate(isolated, mock.base_url, SWEEP, "ladder")
        result = cli("sweep", "--json")
    assert result.code == 0, result.err
    assert result.err.count(REFUSED) == 1, result.err
    assert "4×C requests, not streamed" in result.err
    records = jsonl(run_dir(isolated, result.json["run_id"]) / "records.jsonl")
    assert records and all(r["ok"] and r["ttft_s"] is None for r in records)
    assert result.json["notes"][0].startswith(REFUSED)
    assert [lv["ttft_p50_s"] for lv in result.json["levels_detail"]] == [None, None]


def test_a_server_that_refuses_only_stream_options_is_still_measured_streamed(
    cli, isolated: Path
) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005, refuse_stream_options=True) as mock:
        open_gate(isolated, mock.base_url, LADDER)
        result = cli("ladder", "--json")
    assert result.code == 0, result.err
    assert result.err.count(OPTIONS_REFUSED) == 1, result.err
    assert "output tokens counted from stream chunks" in result.err
    records = jsonl(run_dir(isolated, result.json["run_id"]) / "records.jsonl")
    assert records and all(r["ok"] and r["ttft_s"] is not None for r in records)
    assert all(t["ttft_p50_s"] is not None for t in result.json["tiers_detail"])
    assert result.json["streaming"] == {
        "stream": True,
        "stream_options": False,
        "refused": "HTTP 400: Unrecognized request argument supplied: stream_options",
    }


def test_no_stream_sends_no_probe_and_says_nothing(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005, refuse_stream=True) as mock:
        open_gate(isolated, mock.base_url, LADDER)
        result = cli("ladder", "--no-stream", "--json")
        admitted = mock.model.snapshot().requests_total
    assert result.code == 0, result.err
    assert "refused" not in result.err and "warning: the server" not in result.err
    assert "streaming" not in result.json and "notes" not in result.json
    assert admitted == 2 * (1 + 2), "no probe: every request is a measured one"


def test_a_server_refusing_every_request_with_400_fails_the_ladder_as_before(
    cli, isolated: Path
) -> None:
    """Not about streaming: the unstreamed probe is refused too, so the first tier fails with
    the server's own words and nothing says it was measured unstreamed."""
    with start_mock(ttft_s=0.002, per_token_s=0.0005, unknown_model_status=400) as mock:
        open_gate(isolated, mock.base_url, LADDER)
        result = cli("ladder", "--force", "--model", "not-served", "--json")
    assert result.code == 1
    assert result.json["last_passing"] is None and result.json["stopped_by"] == "failure"
    assert "refused" not in result.err
    assert "http_4xx" in result.err and "The model `not-served` does not exist." in result.err
    assert result.json["streaming"] == {"stream": True, "stream_options": True, "refused": None}
    records = jsonl(run_dir(isolated, result.json["run_id"]) / "records.jsonl")
    assert records and all(r["error"]["kind"] == "http_4xx" for r in records)


def test_single_stream_says_the_server_refused_the_streamed_request(cli, isolated: Path) -> None:
    """``single --stream`` asked for streaming by name: no fallback, a diagnosis that says why."""
    with start_mock(ttft_s=0.002, per_token_s=0.0005, refuse_stream=True) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url)
        result = cli("single", "--stream")
    assert result.code == 1
    assert "the streamed request was refused (HTTP 400: streaming is not supported" in result.err
    assert "try without --stream" in result.err


def test_a_ttft_slo_against_a_server_that_cannot_stream_is_said_to_be_unmeetable(
    cli, isolated: Path
) -> None:
    """The SLO asks for streaming even with --no-stream; refused, it cannot be judged: said."""
    with start_mock(ttft_s=0.002, per_token_s=0.0005, refuse_stream=True) as mock:
        open_gate(isolated, mock.base_url, LADDER)
        result = cli("ladder", "--no-stream", "--slo", "ttft:5", "--json")
    assert result.err.count(REFUSED) == 1, result.err
    assert "TTFT and TPOT SLOs cannot be met unstreamed" in result.err
    records = jsonl(run_dir(isolated, result.json["run_id"]) / "records.jsonl")
    assert records and all(r["ok"] and r["ttft_s"] is None for r in records)
    # the tier cannot show its TTFT p99 met: stop: slo, not a pass nobody measured
    first = result.json["tiers_detail"][0]
    assert first["verdict"] == "stop: slo", first
    assert result.code == 1 and result.json["passed"] is False
    assert "ttft p99 not measured" in result.err.lower()


@pytest.mark.parametrize(
    "hostile", [{"fail_rate": 1.0}, {"malformed_rate": 1.0}, {"reset_rate": 1.0}]
)
def test_every_streamed_request_failing_is_not_called_answered_without_streaming(
    cli, isolated: Path, hostile: dict[str, Any]
) -> None:
    """Every request fails (the probe too: not a refusal of streaming, so the stage streams as
    asked): nothing was answered, so nothing can be said about how it was answered."""
    with start_mock(ttft_s=0.002, per_token_s=0.0005, **hostile) as mock:
        open_gate(isolated, mock.base_url, LADDER)
        result = cli("ladder")
    assert result.code == 1, result.err
    assert "without streaming" not in result.err
