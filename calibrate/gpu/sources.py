"""Where VRAM readings come from: NVML, the server's /metrics, ``--gpu-metrics-url``; each tried on
its own, the ones that work used, each one that does not named with why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from calibrate.gpu.energy import EnergyReader, choose_energy
from calibrate.gpu.engine_metrics import MetricsSampler, reading_from_metrics
from calibrate.gpu.nvml import NvmlSampler
from calibrate.gpu.prometheus import parse_prometheus
from calibrate.gpu.reading import VramSampler
from calibrate.redact import redact_url

SourceChoice = Literal["auto", "nvml", "metrics", "none"]


@dataclass(frozen=True)
class MetricsEndpoint:
    """One Prometheus text source: the server's own ``/metrics`` or ``--gpu-metrics-url``."""

    label: str  # how a user names it: "the server's /metrics", "--gpu-metrics-url"
    url: str  # shown (credentials already redacted)
    fetch: Callable[[], str]
    explicit: bool = False  # asked for by a flag: its failure is always a warning

    def named(self) -> str:
        return self.label if self.label == self.url else f"{self.label} {self.url}"


def _why(exc: BaseException) -> str:
    info = getattr(exc, "info", None)  # a RequestError: its kind and (scrubbed) message
    message = getattr(info, "message", None) or str(exc) or type(exc).__name__
    return " ".join(str(message).split())


class MetricsFetch:
    """Each endpoint scraped on its own, the texts that came back joined: one that fails (a dead
    DCGM exporter) leaves the others measured. ``failures`` holds the last error of each."""

    def __init__(self, endpoints: Sequence[MetricsEndpoint]) -> None:
        self.endpoints = tuple(endpoints)
        self.failures: dict[str, str] = {}
        self.last_text: str | None = None  # the last scrape, read again for DCGM energy gauges

    def __call__(self) -> str:
        self.last_text = None
        texts: list[str] = []
        for endpoint in self.endpoints:
            try:
                texts.append(endpoint.fetch())
            except Exception as exc:  # sampler thread boundary: a failed scrape is no text
                self.failures[endpoint.named()] = _why(exc)
            else:
                self.failures.pop(endpoint.named(), None)
        if not texts:
            raise OSError("; ".join(f"{k}: {v}" for k, v in self.failures.items()))
        self.last_text = "\n".join(texts)
        return self.last_text


@dataclass(frozen=True)
class SourceProblem:
    """A memory source that was tried and gave nothing: named, with its URL and the reason."""

    source: str  # "NVML", "the server's /metrics http://…", "--gpu-metrics-url http://…"
    reason: str
    explicit: bool = False

    def text(self) -> str:
        return f"{self.source}: {self.reason}"


@dataclass(frozen=True)
class Sources:
    samplers: tuple[VramSampler, ...]
    problems: tuple[SourceProblem, ...] = ()


def _probe(endpoint: MetricsEndpoint) -> SourceProblem | None:
    """One endpoint alone: does it answer, and with a memory, KV-cache or queue figure?"""
    try:
        text = endpoint.fetch()
    except Exception as exc:  # any failure of this one source is named, never fatal
        reason = redact_url(_why(exc)).replace(endpoint.url, "that URL")
        return SourceProblem(endpoint.named(), reason, endpoint.explicit)
    reading = reading_from_metrics(parse_prometheus(text))
    if reading is None:
        return SourceProblem(
            endpoint.named(), "no memory, KV-cache or queue figure in it", endpoint.explicit
        )
    return None


def open_sources(
    choice: SourceChoice,
    endpoints: Sequence[MetricsEndpoint],
    *,
    devices: Sequence[str] | None = None,
    nvml: Any = None,
) -> Sources:
    """NVML, the server's /metrics and ``--gpu-metrics-url`` each tried on its own: the ones
    that work are used, each one that does not is named with its URL and why."""
    samplers: list[VramSampler] = []
    problems: list[SourceProblem] = []
    if choice in ("auto", "nvml"):
        sampler = NvmlSampler.open(devices, nvml=nvml)
        if sampler is not None:
            samplers.append(sampler)
        else:
            problems.append(SourceProblem("NVML", "not available (no NVIDIA driver, or no GPU)"))
    if choice in ("auto", "metrics"):
        failed = {e.named(): p for e in endpoints if (p := _probe(e)) is not None}
        problems.extend(failed.values())
        working = [e for e in endpoints if e.named() not in failed]
        if working:
            metrics = MetricsSampler(MetricsFetch(working))
            if metrics.read() is not None:
                samplers.append(metrics)
    return Sources(tuple(samplers), tuple(problems))


def energy_reader(
    samplers: Sequence[VramSampler], devices: Sequence[str] | None = None
) -> EnergyReader | None:
    """The energy source beside these VRAM samplers: NVML's (on its devices), else the DCGM
    gauges in the metrics sampler's scrapes (of ``devices`` when given); None when neither."""
    nvml = next((s for s in samplers if isinstance(s, NvmlSampler)), None)
    metrics = next((s for s in samplers if isinstance(s, MetricsSampler)), None)
    fetch = metrics.fetch if metrics is not None else None
    return choose_energy(
        (nvml.nvml, [h for _, h in nvml.devices], nvml.errors) if nvml is not None else None,
        (lambda: fetch.last_text) if isinstance(fetch, MetricsFetch) else None,
        devices,
    )
