"""A server's /metrics as Prometheus text fixtures: label sets, KV names, percent, DCGM, queues."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from calibrate.gpu.engine_metrics import MetricsSampler, kv_usage, queue_depth, reading_from_metrics
from calibrate.gpu.prometheus import Series, parse_prometheus
from calibrate.gpu.reading import MIB, DeviceMemory, Pressure, VramReading, VramSampler
from calibrate.gpu.sources import MetricsEndpoint, SourceChoice, open_sources
from calibrate.gpu.vram import VramMonitor
from calibrate.gpu.vram.sample import merge


def choose_samplers(
    choice: SourceChoice, fetch_metrics: Callable[[], str], *, nvml: Any
) -> list[VramSampler]:
    """The samplers ``open_sources`` opens for ``choice`` over one server /metrics: NVML when
    it works and /metrics when it answers, both if both (a queue-only /metrics is kept too)."""
    endpoint = MetricsEndpoint("/metrics", "/metrics", fetch_metrics)
    return list(open_sources(choice, (endpoint,), nvml=nvml).samplers)


TWO_VLLM_ENGINES = """# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.6
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.6
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
vllm:num_requests_waiting{engine="1",model_name="m"} 3.0
"""

OLD_VLLM = """# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
vllm:gpu_cache_usage_perc{model_name="n"} 0.75
"""


def test_parser_keeps_label_sets_apart_and_reads_awkward_lines() -> None:
    scrape = parse_prometheus(
        'm{a="x,y}",b="say \\"hi\\""} 1.5 1700000000000\n'
        "plain 2\n"
        "nan_one NaN\n"
        "# a comment 7\n"
        "broken{a=} 3\n"
        "novalue\n"
        'm{a="z"} +Inf\n'
    )
    assert scrape["m"][0] == Series((("a", "x,y}"), ("b", 'say "hi"')), 1.5)
    assert scrape["m"][0].label("b") == 'say "hi"' and len(scrape["m"]) == 2
    assert scrape["plain"] == [Series((), 2.0)]
    assert "broken" not in scrape and "novalue" not in scrape


def test_two_engines_at_60_percent_read_60_not_120() -> None:
    reading = reading_from_metrics(parse_prometheus(TWO_VLLM_ENGINES))
    assert reading is not None
    assert reading.kv_usage == 0.6 and reading.kv_metric == "vllm:kv_cache_usage_perc"
    assert reading.server_queue == 3.0 and reading.queue_metric == "vllm:num_requests_waiting"
    merged = merge([VramReading("nvml", (DeviceMemory("0", 72000, 80000),)), reading])
    assert merged is not None
    assert merged.pressure == Pressure(0.6, "kv_cache", "vllm:kv_cache_usage_perc")
    assert merged.pressure.text == "metrics: vllm:kv_cache_usage_perc"


def test_the_pre_0_10_vllm_name_is_read_and_named() -> None:
    reading = reading_from_metrics(parse_prometheus(OLD_VLLM))
    assert reading is not None and reading.kv_usage == 0.75
    merged = merge([reading])
    assert merged is not None and merged.pressure.text == "metrics: vllm:gpu_cache_usage_perc"


@pytest.mark.parametrize(
    ("text", "metric", "usage"),
    [
        ('sglang:token_usage{model_name="m",tp_rank="0"} 0.28\n', "sglang:token_usage", 0.28),
        (
            'lmdeploy:gpu_cache_usage_perc{model_name="m"} 0.5\n',
            "lmdeploy:gpu_cache_usage_perc",
            0.5,
        ),
        ("llamacpp:kv_cache_usage_ratio 0.63\n", "llamacpp:kv_cache_usage_ratio", 0.63),
        # an exporter writing percent: 0–100 is normalised, never read as 62 times full
        ('sglang:token_usage{model_name="m"} 62.5\n', "sglang:token_usage", 0.625),
    ],
)
def test_every_engines_kv_metric(text: str, metric: str, usage: float) -> None:
    found = kv_usage(parse_prometheus(text))
    assert found is not None and found.metric == metric and found.usage == pytest.approx(usage)


def test_a_metric_seen_as_percent_stays_percent() -> None:
    scrapes = iter(["sglang:token_usage 40\n", "sglang:token_usage 0.8\n"])
    sampler = MetricsSampler(lambda: next(scrapes))
    first, later = sampler.read(), sampler.read()
    assert first is not None and first.kv_usage == pytest.approx(0.4)
    # 0.8 from the same engine is 0.8 %, not a nearly full cache that would stop the ladder
    assert later is not None and later.kv_usage == pytest.approx(0.008)


@pytest.mark.parametrize(
    ("text", "metric", "depth"),
    [
        ('sglang:num_queue_reqs{model_name="m"} 5\n', "sglang:num_queue_reqs", 5.0),
        ("llamacpp:requests_deferred 2\n", "llamacpp:requests_deferred", 2.0),
        ("tgi_queue_size 7\n", "tgi_queue_size", 7.0),
        (TWO_VLLM_ENGINES, "vllm:num_requests_waiting", 3.0),
    ],
)
def test_queue_gauges_max_over_label_sets(text: str, metric: str, depth: float) -> None:
    assert queue_depth(parse_prometheus(text)) == (metric, depth)


def test_no_queue_gauge_is_none() -> None:
    assert queue_depth(parse_prometheus(OLD_VLLM)) is None
    reading = reading_from_metrics(parse_prometheus(OLD_VLLM))
    assert reading is not None and reading.server_queue is None


def test_dcgm_devices_are_per_gpu_and_pressure_is_the_fullest() -> None:
    dcgm = parse_prometheus(
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a"} 76000\n'
        'DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-b"} 8000\n'
        'DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-b"} 72000\n'
        'DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-a"} 4000\n'
    )
    reading = reading_from_metrics(dcgm)
    assert reading is not None
    assert reading.devices == (
        DeviceMemory("GPU-a", 76000, 80000),
        DeviceMemory("GPU-b", 8000, 80000),
    )
    merged = merge([reading])
    assert merged is not None
    assert merged.pressure == Pressure(0.95, "metrics", "DCGM_FI_DEV_FB_USED (device GPU-a)")


def test_mock_memory_is_one_device_beside_its_kv_gauge() -> None:
    mock = parse_prometheus(
        f"mock_vram_used_bytes {6000 * MIB}\nmock_vram_total_bytes {8000 * MIB}\n"
        'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
    )
    reading = reading_from_metrics(mock)
    assert reading is not None and not reading.preallocated
    assert reading.devices == (DeviceMemory("0", 6000.0, 8000.0),)
    merged = merge([reading])
    assert merged is not None and merged.pressure == Pressure(
        0.75, "metrics", "mock_vram_used_bytes"
    )
    assert reading_from_metrics(parse_prometheus("other_metric 1\n")) is None


def test_a_server_with_only_a_queue_gauge_is_sampled_but_vram_is_not_measured() -> None:
    def no_nvml_here() -> str:
        return "llamacpp:requests_deferred 0\nllamacpp:requests_processing 1\n"

    samplers = choose_samplers("auto", no_nvml_here, nvml=_NoNvml())
    assert len(samplers) == 1
    monitor = VramMonitor(samplers)
    assert not monitor.measured and monitor.source == "none"
    assert monitor.describe().endswith(
        "server queue: llamacpp:requests_deferred; running: llamacpp:requests_processing"
    )


def test_automatic_choice() -> None:
    from tests.fakes.nvml import FakeGpu, FakeNvml

    def no_metrics() -> str:
        raise OSError("nothing there")

    gpus = [FakeGpu("GPU-a", 1000, 80000)]
    assert choose_samplers("auto", no_metrics, nvml=FakeNvml(gpus, init_error=OSError)) == []
    both = choose_samplers("auto", lambda: TWO_VLLM_ENGINES, nvml=FakeNvml(gpus))
    assert [s.source for s in both] == ["nvml", "metrics"]
    only = choose_samplers("metrics", lambda: TWO_VLLM_ENGINES, nvml=FakeNvml(gpus))
    assert [s.source for s in only] == ["metrics"]
    assert choose_samplers("none", lambda: TWO_VLLM_ENGINES, nvml=FakeNvml(gpus)) == []
    assert VramMonitor([]).source == "none"
    line = VramMonitor(both).describe()
    assert line == (
        "nvml+metrics (every 0.05 s); pressure from metrics: vllm:kv_cache_usage_perc; "
        "server queue: vllm:num_requests_waiting"
    )


class _NoNvml:
    """A pynvml whose driver is missing."""

    def nvmlInit(self) -> None:
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")
