"""The VRAM monitor: the chosen samplers polled on one daemon thread, peaks kept per window.

A window is a round of the ladder or a level of the sweep: ``open_window`` samples the idle
value just before it, ``close_window`` returns the peak seen while it ran — per device, the
pressure that counts, and the most requests the server held in its queue. A poll's merged
sample is ``vram.sample``; what a window peaked at, ``vram.peaks``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from calibrate.engines import PREALLOCATING_KINDS, find
from calibrate.gpu.energy import EnergyReader, EnergySample, window_energy
from calibrate.gpu.nvml import NvmlSampler
from calibrate.gpu.reading import (
    NullSampler,
    Pressure,
    VramSampler,
    devices_total_mib,
    devices_used_mib,
)
from calibrate.gpu.sources import SourceProblem
from calibrate.gpu.vram.peaks import RunningPeak, WindowPeak, device_peaks, kv_peak_margin
from calibrate.gpu.vram.sample import VramSample, merge


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
