"""What a server's Prometheus ``/metrics`` says about memory: KV-cache usage, the queue gauge,
and device memory (the mock's simulated VRAM, or a DCGM exporter for GPUs on another machine).

Every gauge is the **maximum** over its label sets: two engines at 0.6 KV usage are at 0.6, not
1.2; one waiting request in each of two engines is a queue of 1 per engine, not 2.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Sequence
from itertools import pairwise
from typing import NamedTuple

# The engines' names (``Engine.metrics``), in the order they are preferred; the KV gauges are
# fractions (1 means 100 %) where documented. A rise of a preemption counter (vLLM's preempted,
# SGLang's retracted requests: its KV cache was full) during a ladder tier means the tier does
# not fit (SPEC §5.3 ``stop: preempt``).
from calibrate.engines import (
    KV_METRICS,
    PREEMPTION_METRICS,
    PREFIX_CACHES,
    QUEUE_METRICS,
    RUNNING_METRICS,
    WAITING_REASON_METRICS,
)
from calibrate.gpu.prometheus import Scrape, Series, max_value, parse_prometheus
from calibrate.gpu.reading import MIB, DeviceMemory, VramReading, VramSource

log = logging.getLogger("calibrate")

MAX_QUEUE = 1e9  # requests waiting; past it (or negative) a gauge says nothing
MAX_DEVICE_MIB = 1 << 30  # 1 PiB of memory on one device: past it (or negative), no reading


class Gauge(NamedTuple):
    metric: str
    value: float


class KvUsage(NamedTuple):
    metric: str
    usage: float  # 0–1
    percent: bool  # the engine wrote 0–100 (seen above 1), normalised here


def kv_usage(scrape: Scrape, *, percent_metrics: Collection[str] = ()) -> KvUsage | None:
    """The first KV metric present, maximum over label sets, as a 0–1 fraction.

    The engines above document a fraction; a value above 1 can only be a percentage (some
    exporters and older builds write 0–100), and once seen so a metric stays read as percent
    (``percent_metrics``), so its low values later are not mistaken for a nearly full cache.
    """
    for name in KV_METRICS:
        raw = max_value(scrape, name)
        if raw is None or not 0.0 <= raw <= 100.0:  # neither a fraction nor a percentage: ignored
            continue
        percent = name in percent_metrics or raw > 1.0
        usage = raw / 100 if percent else raw
        return KvUsage(name, min(1.0, max(0.0, usage)), percent)
    return None


def queue_depth(scrape: Scrape) -> Gauge | None:
    """Requests the server holds waiting for a slot: the first queue gauge present, max over
    label sets."""
    for name in QUEUE_METRICS:
        value = max_value(scrape, name)
        if value is not None and 0.0 <= value <= MAX_QUEUE:  # negative or huge: ignored
            return Gauge(name, value)
    return None


def running_count(scrape: Scrape) -> Gauge | None:
    """Requests the server executes now (its own count: vLLM ``num_requests_running``, SGLang,
    TGI, llama.cpp ``requests_processing``): the first running gauge present, max over label
    sets, as the queue gauge is read."""
    for name in RUNNING_METRICS:
        value = max_value(scrape, name)
        if value is not None and 0.0 <= value <= MAX_QUEUE:
            return Gauge(name, value)
    return None


def deferred_count(scrape: Scrape) -> float | None:
    """Requests waiting for another reason than capacity (vLLM's ``reason="deferred"``: a LoRA
    budget, a KV transfer, a blocked request), max over engines; None without the gauge."""
    for name in WAITING_REASON_METRICS:
        series = [s for s in scrape.get(name, ()) if math.isfinite(s.value) and s.label("reason")]
        if series:
            found = [s.value for s in series if s.label("reason") == "deferred"]
            return max(found, default=0.0)
    return None


def preemptions(scrape: Scrape) -> Gauge | None:
    """The first preemption counter present, summed over its label sets (one per engine; a
    per-priority child of SGLang's counter is left out, its unlabelled total counts)."""
    for name in PREEMPTION_METRICS:
        series = [
            s for s in scrape.get(name, ()) if math.isfinite(s.value) and not s.label("priority")
        ]
        if series:
            return Gauge(name, sum(s.value for s in series))
    return None


def counted_rise(readings: Sequence[Gauge | None]) -> Gauge | None:
    """A counter's rise over successive readings (None: a scrape that failed), across a
    restart of the server: a reading below the one before belongs to a new process counting
    from 0, so all of it happened since that reading and counts; what the old process counted
    after its last reading is not known, and is never invented. None under two readings."""
    seen = [g for g in readings if g is not None]
    if len(seen) < 2:
        return None
    rise = sum(b.value - a.value if b.value >= a.value else b.value for a, b in pairwise(seen))
    return Gauge(seen[-1].metric, rise)


def read_preemptions(fetch: Callable[[], str]) -> Gauge | None:
    """The preemption counter of the server's /metrics now; None when it has none or the
    scrape failed (a ladder without the counter has no ``stop: preempt``)."""
    try:
        return preemptions(parse_prometheus(fetch()))
    except Exception as exc:  # a scrape failure is "no counter", never a failed tier
        log.debug("preemption counter scrape failed: %s", exc)
        return None


class PrefixCounters(NamedTuple):
    """An engine's prefix-cache counters now: prompt tokens found (``hits``) and looked up
    (``queries``), summed over engines; ``enabled`` as its info gauge says (None: not said)."""

    cache: str  # the engine's own name for it: "vLLM's automatic prefix caching"
    metric: str  # the hits counter read
    hits: float
    queries: float
    enabled: bool | None
    switch: str = ""  # how a user turns it on


def prefix_counters(scrape: Scrape) -> PrefixCounters | None:
    """The first engine's prefix-cache counters present in the scrape; None without them."""
    for info in PREFIX_CACHES:
        for hits_name, queries_name in zip(info.hits, info.queries, strict=True):
            hits, queries = _summed(scrape, hits_name), _summed(scrape, queries_name)
            if hits is None or queries is None:
                continue
            enabled = None
            for series in scrape.get(info.state, ()):
                said = (series.label(info.state_label) or "").lower()
                enabled = (
                    True if said in ("true", "1") else False if said in ("false", "0") else None
                )
            return PrefixCounters(info.name, hits_name, hits, queries, enabled, info.switch)
    return None


def read_prefix_counters(fetch: Callable[[], str]) -> PrefixCounters | None:
    """The prefix-cache counters of the server's /metrics now; None when it has none or the
    scrape failed (nothing is said of a cache calibrate cannot read)."""
    try:
        return prefix_counters(parse_prometheus(fetch()))
    except Exception as exc:  # a scrape failure is "no counters", never a failed stage
        log.debug("prefix-cache counter scrape failed: %s", exc)
        return None


def _summed(scrape: Scrape, name: str) -> float | None:
    """A counter summed over its label sets (one per engine); None when absent or broken."""
    values = [s.value for s in scrape.get(name, ()) if math.isfinite(s.value) and s.value >= 0]
    return sum(values) if values else None


def _device_name(series: Series, position: int) -> str:
    name = series.label("UUID") or series.label("gpu") or series.label("device") or str(position)
    instance = series.label("GPU_I_ID")  # a DCGM exporter on a MIG GPU: one series per instance
    return f"{name}/mig{instance}" if instance else name


def _paired(used: list[Series], other: list[Series]) -> list[tuple[Series, Series | None]]:
    """Each ``used`` series with the ``other`` series of the same label set."""
    by_labels = {tuple(sorted(s.labels)): s for s in other}
    return [(s, by_labels.get(tuple(sorted(s.labels)))) for s in used]


def _plausible(devices: tuple[DeviceMemory, ...]) -> bool:
    """Every figure a size in [0, MAX_DEVICE_MIB] MiB."""
    for device in devices:
        sizes = (device.used_mib, device.total_mib if device.total_mib is not None else 0.0)
        if not all(0.0 <= size <= MAX_DEVICE_MIB for size in sizes):
            return False
    return True


def device_memory(scrape: Scrape) -> tuple[str, tuple[DeviceMemory, ...]] | None:
    """(metric, per-device memory) from the mock's simulated VRAM or a DCGM exporter; None also
    when a figure is negative or past any device's size (a broken exporter measures nothing)."""
    found = _device_memory(scrape)
    return found if found is None or _plausible(found[1]) else None


def _device_memory(scrape: Scrape) -> tuple[str, tuple[DeviceMemory, ...]] | None:
    if "mock_vram_used_bytes" in scrape:
        pairs = _paired(scrape["mock_vram_used_bytes"], scrape.get("mock_vram_total_bytes", []))
        devices = tuple(
            DeviceMemory(_device_name(u, i), u.value / MIB, t.value / MIB if t else None)
            for i, (u, t) in enumerate(pairs)
        )
        return "mock_vram_used_bytes", devices
    if "DCGM_FI_DEV_FB_USED" in scrape:  # DCGM reports MiB
        pairs = _paired(scrape["DCGM_FI_DEV_FB_USED"], scrape.get("DCGM_FI_DEV_FB_FREE", []))
        devices = tuple(
            DeviceMemory(_device_name(u, i), u.value, u.value + f.value if f else None)
            for i, (u, f) in enumerate(pairs)
        )
        return "DCGM_FI_DEV_FB_USED", devices
    return None


def reading_from_metrics(
    scrape: Scrape, *, percent_metrics: Collection[str] = ()
) -> VramReading | None:
    """KV usage, device memory and the queue gauge of one scrape; None when it has none."""
    kv = kv_usage(scrape, percent_metrics=percent_metrics)
    memory = device_memory(scrape)
    queue = queue_depth(scrape)
    running = running_count(scrape)
    if kv is None and memory is None and queue is None and running is None:
        return None
    simulated = memory is not None and memory[0] == "mock_vram_used_bytes"
    # The mock's memory grows with load unless it says it reserved it (``--preallocate``); a
    # real engine exposing KV usage reserved it at start. Either way the KV gauge is pressure.
    reserved = max_value(scrape, "mock_vram_preallocated") == 1
    return VramReading(
        "metrics",
        devices=memory[1] if memory else (),
        kv_usage=kv.usage if kv else None,
        preallocated=kv is not None and (reserved or not simulated),
        kv_metric=kv.metric if kv else None,
        device_metric=memory[0] if memory else None,
        server_queue=queue.value if queue else None,
        queue_metric=queue.metric if queue else None,
        server_running=running.value if running else None,
        running_metric=running.metric if running else None,
        server_deferred=deferred_count(scrape),
    )


class MetricsSampler:
    """The server's Prometheus ``/metrics`` (and a DCGM exporter URL, appended by ``fetch``).

    ``source`` is ``metrics`` once a scrape measured memory or KV usage; a server exporting only
    a queue gauge stays ``none`` (VRAM not measured) while its queue is still sampled.
    """

    def __init__(self, fetch: Callable[[], str]) -> None:
        self.fetch = fetch
        self.source: VramSource = "none"
        self.percent_metrics: set[str] = set()

    def read(self) -> VramReading | None:
        try:
            scrape = parse_prometheus(self.fetch())
        except Exception as exc:  # sampler thread boundary: any scrape failure is "no sample"
            log.debug("metrics scrape failed: %s", exc)
            return None
        kv = kv_usage(scrape, percent_metrics=self.percent_metrics)
        if kv is not None and kv.percent:
            self.percent_metrics.add(kv.metric)
        reading = reading_from_metrics(scrape, percent_metrics=self.percent_metrics)
        if reading is not None and reading.measures_vram:
            self.source = "metrics"
        return reading

    def close(self) -> None:
        return None
