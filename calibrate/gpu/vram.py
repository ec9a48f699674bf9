"""The VRAM monitor: the chosen samplers polled on one daemon thread, peaks kept per window.

A window is a round of the ladder or a level of the sweep: ``open_window`` samples the idle
value just before it, ``close_window`` returns the peak seen while it ran — per device, the
pressure that counts, and the most requests the server held in its queue.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

from calibrate.engines import PREALLOCATING_KINDS, find
from calibrate.gpu.energy import (
    EnergyReader,
    EnergySample,
    EnergyWindow,
    window_energy,
)
from calibrate.gpu.nvml import NvmlSampler
from calibrate.gpu.reading import (
    DeviceMemory,
    NullSampler,
    Pressure,
    VramReading,
    VramSampler,
    choose_pressure,
    devices_total_mib,
    devices_used_mib,
)
from calibrate.gpu.sources import SourceProblem


@dataclass(frozen=True)
class VramSample:
    """The merged view of one poll: device memory, KV usage, the pressure that counts, the queue."""

    devices: tuple[DeviceMemory, ...]
    kv_usage: float | None
    pressure: Pressure
    nvml_used_mib: float | None = None
    server_queue: float | None = None
    queue_metric: str | None = None
    server_running: float | None = None
    running_metric: str | None = None
    server_deferred: float | None = None
    at_s: float | None = None  # when it was read (the monitor's clock)

    @property
    def used_mib(self) -> float | None:
        return devices_used_mib(self.devices)

    @property
    def total_mib(self) -> float | None:
        return devices_total_mib(self.devices)

    def to_json(self) -> dict[str, Any]:
        return {
            "used_mib": _r(self.used_mib),
            "total_mib": _r(self.total_mib),
            "devices": [d.to_json() for d in self.devices],
            "kv_usage": _r(self.kv_usage, 4),
            "pressure": _r(self.pressure.value, 4),
            "pressure_source": self.pressure.source,
            "pressure_metric": self.pressure.text,
            "nvml_used_mib": _r(self.nvml_used_mib),
            "server_queue": self.server_queue,
            "server_running": self.server_running,
        }


@dataclass(frozen=True)
class RunningPeak:
    """What the server's own running gauge said over a window (SPEC §6.1): the most requests it
    ran at once, the most it ran at a moment when others waited (None: none waited then), and
    how far apart its samples actually came — a busy machine or a slow ``/metrics`` spaces them
    wider than ``sample_interval_s`` asks, and a count read less often sees less (seen on real
    vLLM's CPU build: asked every 50 ms, a cap of 4 never seen at batch 8)."""

    metric: str  # "vllm:num_requests_running"
    most: float
    while_waiting: float | None = None
    deferred_most: float | None = None  # of the waiting, the most not waiting for capacity
    gap_s: float | None = None  # the mean time between its samples (None: fewer than two)

    @classmethod
    def over(cls, window: Sequence[VramSample]) -> RunningPeak | None:
        seen = [s for s in window if s.server_running is not None and s.running_metric]
        if not seen:
            return None
        waiting = [s.server_running or 0.0 for s in seen if (s.server_queue or 0.0) >= 1]
        deferred = [s.server_deferred for s in seen if s.server_deferred is not None]
        return cls(
            seen[-1].running_metric or "",
            max(s.server_running or 0.0 for s in seen),
            max(waiting, default=None),
            max(deferred, default=None),
            mean_gap_s([s.at_s for s in seen if s.at_s is not None]),
        )


# /metrics samples an answer must last for what its gauges show of it to be seen: its running
# count whole (``server_account.cap.running_unseen``), its KV usage's growth (``kv_doubt``)
SAMPLES_PER_ANSWER = 3


def kv_peak_margin(window: Sequence[VramSample]) -> float | None:
    """How much higher the KV-cache usage may have peaked than its highest reading: the most it
    rose from one sample to the next while the same number of requests ran (their answers
    growing, not new ones admitted; None: fewer than two readings). A usage that grows while
    answers run is read low by what it grew since the last sample — beside CPU burners the
    mock's 83 % read 73 %, and the queue was called a cap — so a rule that reads the peak
    carries this doubt with it (``server_account.kv.no_room_for_one_more``). A usage that never
    grew under a steady running count has none; a long gap between samples shows as a large
    rise across it."""
    seen = [s for s in window if s.at_s is not None and s.kv_usage is not None]
    if len(seen) < 2:
        return None
    rises = [
        (b.kv_usage or 0.0) - (a.kv_usage or 0.0)
        for a, b in pairwise(seen)
        if a.server_running is None or a.server_running == b.server_running
    ]
    peak = max(s.kv_usage or 0.0 for s in seen)
    return min(max([0.0, *rises]), max(0.0, 1.0 - peak))


def kv_doubt(
    peak: float | None,
    window_margin: float | None,
    *,
    answer_s: float | None,
    gap_s: float | None,
    input_tokens: float | None,
    output_tokens: float | None,
) -> float | None:
    """How much higher a tier's KV usage may have peaked than its highest reading (None: no
    reading): its windows' own margin (``kv_peak_margin``), and where its answers (p50
    ``answer_s``) lasted fewer than ``SAMPLES_PER_ANSWER`` samples ``gap_s`` apart, all an
    answer grows — read at its admission, k requests' prompts of ``input_tokens`` grow by their
    ``output_tokens`` more. Two samples an answer cannot follow its growth: a /metrics read every
    0.1 s put the mock's 83 % at 55 %, and its samples' own rises said 15 points, not 30. Where
    the tokens are not known (a prompt list reports one usage for all its prompts) the windows'
    own rises are all there is: a usage read at 0 % holds no doubt of 100 points."""
    if peak is None:
        return None
    margin = window_margin or 0.0
    sparse = answer_s is not None and gap_s and answer_s < SAMPLES_PER_ANSWER * gap_s
    if sparse and input_tokens and output_tokens:
        margin = max(margin, peak * output_tokens / input_tokens)
    return min(margin, max(0.0, 1.0 - peak))


def mean_gap_s(times: Sequence[float]) -> float | None:
    """The mean time between consecutive samples (None: fewer than two)."""
    if len(times) < 2:
        return None
    return (max(times) - min(times)) / (len(times) - 1)


@dataclass(frozen=True)
class WindowPeak:
    idle: VramSample | None
    peak_used_mib: float | None
    peak_pressure: Pressure
    peak_kv_usage: float | None
    total_mib: float | None
    samples: int
    devices: tuple[DeviceMemory, ...] = ()  # each device's own peak
    server_queue_max: float | None = None  # None: the server exports no queue gauge
    energy: EnergyWindow | None = None  # None: no energy source (calibrate.gpu.energy)
    price_per_hour: float | None = None  # --gpu-price-per-hour / [cost], for $ per 1M tokens
    running: RunningPeak | None = None  # the server's running count (None: it exports none)
    kv_peak_margin: float | None = None  # how much higher the KV usage may have peaked (0–1)
    unread: bool = False  # memory never read while the window ran: no peak (``close_window``)


def _r(value: float | None, digits: int = 1) -> float | None:
    return round(value, digits) if value is not None else None


def merge(
    readings: Sequence[VramReading], *, preallocating_kind: bool = False
) -> VramSample | None:
    """Device memory from the server's own metrics (mock, DCGM) before local NVML; KV and the
    queue from metrics."""
    if not readings:
        return None
    metrics = next((r for r in readings if r.source == "metrics"), None)
    nvml = next((r for r in readings if r.source == "nvml"), None)
    device = metrics if metrics is not None and metrics.devices else nvml
    preallocated = preallocating_kind or (metrics is not None and metrics.preallocated)
    pressure = choose_pressure(device, metrics, preallocated=preallocated)
    return VramSample(
        device.devices if device else (),
        metrics.kv_usage if metrics else None,
        pressure,
        nvml.used_mib if nvml else None,
        metrics.server_queue if metrics else None,
        metrics.queue_metric if metrics else None,
        metrics.server_running if metrics else None,
        metrics.running_metric if metrics else None,
        metrics.server_deferred if metrics else None,
    )


def device_peaks(seen_sets: Iterable[Sequence[DeviceMemory]]) -> tuple[DeviceMemory, ...]:
    """Each device's highest use over samples (or windows), in the order devices first appear."""
    peaks: dict[str, DeviceMemory] = {}
    for devices in seen_sets:
        for d in devices:
            seen = peaks.get(d.device)
            if seen is None or d.used_mib > seen.used_mib:
                peaks[d.device] = DeviceMemory(
                    d.device, d.used_mib, d.total_mib or (seen.total_mib if seen else None)
                )
    return tuple(peaks.values())


class VramMonitor:
    """Polls every ``interval_s`` on one daemon thread; thread-safe windows. Each sample is
    stamped by ``clock`` (monotonic seconds), so a window knows how often it was really read."""

    def __init__(
        self,
        samplers: Sequence[VramSampler],
        interval_s: float = 0.05,
        *,
        server_kind: str | None = None,
        problems: Sequence[SourceProblem] = (),
        energy: EnergyReader | None = None,
        price_per_hour: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.samplers = [s for s in samplers if not isinstance(s, NullSampler)]
        self.clock = clock
        self.energy = energy  # read beside each VRAM sample, over the same windows
        self.price_per_hour = price_per_hour
        self._energy: list[EnergySample] = []
        self.problems = tuple(problems)  # the sources tried that gave nothing, and why
        self.interval_s = interval_s
        self.preallocating_kind = server_kind in PREALLOCATING_KINDS
        self.server_kind = server_kind
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: VramSample | None = None
        self._window: list[VramSample] = []

    @property
    def source(self) -> str:
        """``nvml``, ``metrics``, ``nvml+metrics`` or ``none`` — named in every report."""
        return "+".join(s.source for s in self.samplers if s.source != "none") or "none"

    @property
    def measured(self) -> bool:
        return self.source != "none"

    @property
    def last(self) -> VramSample | None:
        with self._lock:
            return self._last

    def nvml(self) -> NvmlSampler | None:
        return next((s for s in self.samplers if isinstance(s, NvmlSampler)), None)

    def describe(self) -> str:
        """The "VRAM source:" line: sources, what the pressure is read from, the queue gauge."""
        sample = self.last or self.sample()
        parts = [f"{self.source} (every {self.interval_s:g} s)"]
        if sample is not None and sample.pressure.source != "none":
            count = len(sample.devices)
            fullest = count > 1 and sample.pressure.source != "kv_cache"
            parts.append(
                f"pressure from {sample.pressure.text}"
                + (f", the fullest of {count} devices" if fullest else "")
            )
        if sample is not None and sample.queue_metric:
            parts.append(f"server queue: {sample.queue_metric}")
        if sample is not None and sample.running_metric:
            parts.append(f"running: {sample.running_metric}")
        return "; ".join(parts)

    def warnings(self) -> list[str]:
        """One line per source that failed: all of them when nothing is measured (the VRAM rule
        is off), else those asked for by a flag — the others are still used."""
        if not self.measured:
            tried = "; ".join(p.text() for p in self.problems) or "no source asked for"
            skipped = f"VRAM not measured ({tried}): the VRAM stop rule is skipped"
            return [skipped, *self._no_kv_gauge()]
        failed = [p for p in self.problems if p.explicit]
        lines = [f"{p.text()}: measuring without it, from {self.source}" for p in failed]
        return [*lines, *self._no_kv_gauge()]

    def _no_kv_gauge(self) -> list[str]:
        """An engine that reserves its memory at start whose /metrics gave no KV-cache gauge:
        its memory reads flat, so the VRAM rule has nothing to go on — and how to turn it on."""
        engine = find(self.server_kind)
        if engine is None or not engine.preallocates or not engine.metrics.kv:
            return []
        sample = self.last or self.sample()
        if sample is not None and sample.kv_usage is not None:
            return []
        hint = engine.metrics_hint or f"check that {engine.name}'s /metrics answers at its address"
        return [
            f"no {engine.metrics.kv[0]} on the server's /metrics: {engine.name} reserves its "
            f"memory at start, so it reads flat and the VRAM rule has little to go on; {hint}"
        ]

    def sample(self) -> VramSample | None:
        readings = [r for s in self.samplers if (r := s.read()) is not None]
        merged = merge(readings, preallocating_kind=self.preallocating_kind)
        if merged is not None:
            merged = replace(merged, at_s=self.clock())
        energy = self.energy.read() if self.energy is not None else None
        with self._lock:
            if energy is not None:
                self._energy.append(energy)
            if merged is not None:
                self._last = merged
                self._window.append(merged)
        return merged

    def open_window(self) -> VramSample | None:
        """Start a new window; the sample taken now is its idle value."""
        with self._lock:
            self._window = []
            self._energy = []
        return self.sample() if self.samplers else None

    def close_window(self, idle: VramSample | None) -> WindowPeak:
        end = self.sample() if self.samplers else None  # the end state counts too
        with self._lock:
            window, self._window = self._window, []
            energy, self._energy = self._energy, []
        # the memory peak is read while the window ran: where the polling thread never read it
        # (a round shorter than the interval), only the idle reading before it and the end one
        # after it are there — the peak is unknown, never the idle memory called the peak
        unread = self._thread is not None and all(s is idle or s is end for s in window)
        memory = [] if unread else window
        kv = [s.kv_usage for s in memory if s.kv_usage is not None]
        queue = [s.server_queue for s in window if s.server_queue is not None]
        top = max(memory, key=lambda s: s.pressure.value or 0.0, default=None)
        pressure = top.pressure if top else Pressure(None, "none")
        peaks = device_peaks(s.devices for s in memory)
        return WindowPeak(
            idle,
            devices_used_mib(peaks),  # the fullest device's own peak, never a sum over devices
            pressure,
            max(kv, default=None),
            devices_total_mib(device_peaks(s.devices for s in window)),
            len(window),
            peaks,
            max(queue, default=None),
            window_energy(energy, self.energy.source) if self.energy is not None else None,
            self.price_per_hour,
            RunningPeak.over(window),
            kv_peak_margin(memory),
            unread,
        )

    def start(self) -> VramMonitor:
        if self.samplers and self._thread is None:
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
