"""What a window of VRAM samples peaked at: memory per device, pressure, KV usage (and how
much higher it may have peaked than read), the queue and the server's running count.

A window is a round of the ladder or a level of the sweep (``VramMonitor.close_window``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from calibrate.gpu.energy import EnergyWindow
from calibrate.gpu.reading import DeviceMemory, Pressure
from calibrate.gpu.vram.sample import VramSample


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
