"""The VRAM monitor: the chosen samplers polled on one daemon thread, peaks kept per window.

A window is a round of the ladder or a level of the sweep: ``open_window`` samples the idle
value just before it, ``close_window`` returns the peak seen while it ran.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from calibrate.gpu import (
    PREALLOCATING_KINDS,
    MetricsSampler,
    NullSampler,
    NvmlSampler,
    Pressure,
    VramReading,
    VramSampler,
    choose_pressure,
)

SourceChoice = Literal["auto", "nvml", "metrics", "none"]


@dataclass(frozen=True)
class VramSample:
    """The merged view of one poll: device memory, KV usage, and the pressure that counts."""

    used_mib: float | None
    total_mib: float | None
    kv_usage: float | None
    pressure: Pressure
    nvml_used_mib: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "used_mib": _r(self.used_mib),
            "total_mib": _r(self.total_mib),
            "kv_usage": _r(self.kv_usage, 4),
            "pressure": _r(self.pressure.value, 4),
            "pressure_source": self.pressure.source,
            "nvml_used_mib": _r(self.nvml_used_mib),
        }


@dataclass(frozen=True)
class WindowPeak:
    idle: VramSample | None
    peak_used_mib: float | None
    peak_pressure: Pressure
    peak_kv_usage: float | None
    total_mib: float | None
    samples: int


def _r(value: float | None, digits: int = 1) -> float | None:
    return round(value, digits) if value is not None else None


def merge(
    readings: Sequence[VramReading], *, preallocating_kind: bool = False
) -> VramSample | None:
    """Device memory from the server's own metrics (mock, DCGM) before local NVML; KV from metrics."""
    if not readings:
        return None
    metrics = next((r for r in readings if r.source == "metrics"), None)
    nvml = next((r for r in readings if r.source == "nvml"), None)
    device = metrics if metrics is not None and metrics.used_mib is not None else nvml
    kv = metrics.kv_usage if metrics is not None else None
    preallocated = preallocating_kind or (metrics is not None and metrics.preallocated)
    used = device.used_mib if device else None
    total = device.total_mib if device else None
    pressure = choose_pressure(
        used_mib=used, total_mib=total, kv_usage=kv, preallocated=preallocated
    )
    if pressure.source == "nvml" and device is metrics:
        pressure = Pressure(pressure.value, "metrics")
    return VramSample(used, total, kv, pressure, nvml.used_mib if nvml else None)


class VramMonitor:
    """Polls every ``interval_s`` on one daemon thread; thread-safe windows."""

    def __init__(
        self,
        samplers: Sequence[VramSampler],
        interval_s: float = 0.05,
        *,
        server_kind: str | None = None,
    ) -> None:
        self.samplers = [s for s in samplers if not isinstance(s, NullSampler)]
        self.interval_s = interval_s
        self.preallocating_kind = server_kind in PREALLOCATING_KINDS
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: VramSample | None = None
        self._window: list[VramSample] = []

    @property
    def source(self) -> str:
        """``nvml``, ``metrics``, ``nvml+metrics`` or ``none`` — named in every report."""
        return "+".join(s.source for s in self.samplers) or "none"

    @property
    def measured(self) -> bool:
        return bool(self.samplers)

    @property
    def last(self) -> VramSample | None:
        with self._lock:
            return self._last

    def nvml(self) -> NvmlSampler | None:
        return next((s for s in self.samplers if isinstance(s, NvmlSampler)), None)

    def sample(self) -> VramSample | None:
        readings = [r for s in self.samplers if (r := s.read()) is not None]
        merged = merge(readings, preallocating_kind=self.preallocating_kind)
        if merged is not None:
            with self._lock:
                self._last = merged
                self._window.append(merged)
        return merged

    def open_window(self) -> VramSample | None:
        """Start a new window; the sample taken now is its idle value."""
        with self._lock:
            self._window = []
        return self.sample() if self.measured else None

    def close_window(self, idle: VramSample | None) -> WindowPeak:
        if self.measured:
            self.sample()  # the end state counts too, however short the window
        with self._lock:
            window, self._window = self._window, []
        used = [s.used_mib for s in window if s.used_mib is not None]
        kv = [s.kv_usage for s in window if s.kv_usage is not None]
        top = max(window, key=lambda s: s.pressure.value or 0.0, default=None)
        pressure = top.pressure if top else Pressure(None, "none")
        total = next((s.total_mib for s in window if s.total_mib), None)
        return WindowPeak(idle, max(used, default=None), pressure, max(kv, default=None),
                          total, len(window))  # fmt: skip

    def start(self) -> VramMonitor:
        if self.measured and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="vram-sampler", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        for sampler in self.samplers:
            sampler.close()


def choose_samplers(
    choice: SourceChoice,
    fetch_metrics: Callable[[], str],
    *,
    devices: Sequence[str] | None = None,
    nvml: Any = None,
) -> list[VramSampler]:
    """Automatic: NVML when it works and the server's /metrics when it answers; both if both."""
    out: list[VramSampler] = []
    if choice in ("auto", "nvml"):
        sampler = NvmlSampler.open(devices, nvml=nvml)
        if sampler is not None:
            out.append(sampler)
    if choice in ("auto", "metrics"):
        metrics = MetricsSampler(fetch_metrics)
        if metrics.read() is not None:
            out.append(metrics)
    return out
