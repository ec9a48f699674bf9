"""Memory sources are independent (issue 26): NVML, the server's /metrics and --gpu-metrics-url
are each tried on their own; a failing one is named with its URL, the others are still used."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from calibrate.gpu.sources import MetricsEndpoint, MetricsFetch, open_sources
from calibrate.gpu.vram import VramMonitor
from tests.fakes import free_port
from tests.fakes.nvml import FakeGpu, FakeNvml
from tests.mockserver import start_mock
from tests.tier_helpers import FAST, open_gate

DCGM = (
    'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a"} 30000\n'
    'DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-a"} 50000\n'
)
LADDER = FAST + "batch_sizes = [1, 2]\nrounds = 1\n"


class _Exporter(BaseHTTPRequestHandler):
    status = 200
    body = ""

    def do_GET(self) -> None:
        data = self.body.encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        return None


def _serve(status: int, body: str) -> Iterator[str]:
    handler = type("Handler", (_Exporter,), {"status": status, "body": body})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # a short poll: shutdown() waits for the next one (0.5 s at the default)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}/metrics"  # nothing listens there


@pytest.fixture
def html_exporter() -> Iterator[str]:
    yield from _serve(200, "<html>not prometheus</html>")


@pytest.fixture
def broken_exporter() -> Iterator[str]:
    yield from _serve(500, "exporter crashed")


@pytest.fixture
def dcgm_exporter() -> Iterator[str]:
    yield from _serve(200, DCGM)


@pytest.mark.parametrize(
    ("exporter", "reason"),
    [
        ("dead_url", ""),
        ("html_exporter", "no memory, KV-cache or queue figure in it"),
        ("broken_exporter", "500"),
    ],
)
def test_a_failing_gpu_metrics_url_is_named_and_the_server_metrics_still_measure(
    cli, isolated: Path, request: pytest.FixtureRequest, exporter: str, reason: str
) -> None:
    url = request.getfixturevalue(exporter)
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        open_gate(isolated, mock.base_url, LADDER)
        result = cli("ladder", "--gpu-metrics-url", url, "--json")
    assert result.code == 0, result.err
    err = " ".join(result.err.split())
    assert "VRAM not measured" not in err
    assert "VRAM source: metrics" in err
    warning = next(line for line in result.err.splitlines() if url in line)
    assert warning.count(url) == 1 and "--gpu-metrics-url" in warning
    assert reason in warning and "measuring without it, from metrics" in warning
    # every tier's pressure read from the server's metrics — or, where a busy machine kept the
    # sampler from reading while a tier ran (0.02 s apart), that tier said unread, never a guess
    tiers = result.json["tiers_detail"]
    unread = [str(t["batch_size"]) for t in tiers if t["pressure"] is None]
    assert len(unread) < len(tiers), result.err
    if unread:
        assert f"batch {', '.join(unread)}: VRAM not read while" in err, result.err


def test_a_working_gpu_metrics_url_adds_its_devices(
    cli, isolated: Path, dcgm_exporter: str
) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        open_gate(isolated, mock.base_url, LADDER)
        result = cli("ladder", "--gpu-metrics-url", dcgm_exporter, "--json")
    assert result.code == 0, result.err
    assert dcgm_exporter not in result.err  # nothing failed: nothing named
    assert "VRAM source: metrics" in result.err


def _endpoint(label: str, url: str, text: str | None, explicit: bool = False) -> MetricsEndpoint:
    def fetch() -> str:
        if text is None:
            raise OSError(f"connection refused by {url}")
        return text

    return MetricsEndpoint(label, url, fetch, explicit)


def test_nvml_still_measures_when_both_metrics_sources_fail() -> None:
    nvml = FakeNvml([FakeGpu("GPU-a", 1000, 80000)])
    server = _endpoint("the server's /metrics", "http://h:8000/metrics", None)
    dcgm = _endpoint("--gpu-metrics-url", "http://dcgm:9400/metrics", None, explicit=True)
    sources = open_sources("auto", [server, dcgm], nvml=nvml)
    assert [s.source for s in sources.samplers] == ["nvml"]
    monitor = VramMonitor(sources.samplers, problems=sources.problems)
    assert monitor.measured
    assert monitor.warnings() == [
        "--gpu-metrics-url http://dcgm:9400/metrics: connection refused by that URL: "
        "measuring without it, from nvml"
    ]


def test_nothing_measured_names_every_source_tried() -> None:
    server = _endpoint("the server's /metrics", "http://h:8000/metrics", "other_metric 1\n")
    dcgm = _endpoint("--gpu-metrics-url", "http://dcgm:9400/metrics", None, explicit=True)
    sources = open_sources("auto", [server, dcgm], nvml=FakeNvml([], init_error=OSError))
    monitor = VramMonitor(sources.samplers, problems=sources.problems)
    [line] = monitor.warnings()
    assert line.startswith("VRAM not measured (NVML: not available")
    assert (
        "the server's /metrics http://h:8000/metrics: no memory, KV-cache or queue figure" in line
    )
    assert "--gpu-metrics-url http://dcgm:9400/metrics: connection refused" in line


def test_a_source_that_dies_mid_run_leaves_the_others_in_the_scrape() -> None:
    alive = {"dcgm": True}

    def dcgm() -> str:
        if not alive["dcgm"]:
            raise OSError("connection reset")
        return DCGM

    server = _endpoint("the server's /metrics", "/metrics", "vllm:kv_cache_usage_perc 0.5\n")
    fetch = MetricsFetch([server, MetricsEndpoint("--gpu-metrics-url", "http://d/m", dcgm, True)])
    assert "DCGM_FI_DEV_FB_USED" in fetch() and not fetch.failures
    alive["dcgm"] = False
    assert fetch().strip() == "vllm:kv_cache_usage_perc 0.5"
    assert fetch.failures == {"--gpu-metrics-url http://d/m": "connection reset"}


def test_tune_names_a_dead_gpu_metrics_url_and_still_measures(
    cli, isolated: Path, dead_url: str
) -> None:
    from tests.tune_helpers import tune_config

    tune_config(isolated, 'grid = ["slots=2", "kv_tokens=50000"]\nmemory_fractions = [0.8]\n')
    result = cli("tune", "--gpu-metrics-url", dead_url, "--json")
    assert result.code == 0, result.err
    warned = [line for line in result.err.splitlines() if dead_url in line]
    assert warned and all("c01: warning: --gpu-metrics-url" in line for line in warned)
    assert result.json["candidates"][0]["peak_vram_mib"] is not None
