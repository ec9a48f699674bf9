"""VRAM sampling (SPEC §8): one interface, three sources — nvml, metrics, none.

``pynvml`` is imported here only, lazily, so ``--help``, tests and the mock work without a
driver. A sampler reads once (``read``); ``VramMonitor`` polls the chosen samplers on one daemon
thread and keeps the peak of the current window (a round, a sweep level).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

log = logging.getLogger("calibrate")

MIB = 1024 * 1024
VramSource = Literal["nvml", "metrics", "none"]
PressureSource = Literal["kv_cache", "nvml", "metrics", "none"]
# Engines that reserve their KV cache at start: NVML shows flat usage whatever the load.
PREALLOCATING_KINDS = frozenset({"vllm", "sglang", "lmdeploy"})
KV_METRICS = ("vllm:kv_cache_usage_perc", "sglang:token_usage", "lmdeploy:gpu_cache_usage_perc")


@dataclass(frozen=True)
class VramReading:
    """One sample; a field is None when this source does not measure it."""

    source: VramSource
    used_mib: float | None = None
    total_mib: float | None = None
    kv_usage: float | None = None  # 0–1 KV-cache usage reported by the engine
    preallocated: bool = False  # the engine reserves memory at start (pressure = KV usage)


@dataclass(frozen=True)
class Pressure:
    value: float | None
    source: PressureSource


def choose_pressure(
    *, used_mib: float | None, total_mib: float | None, kv_usage: float | None, preallocated: bool
) -> Pressure:
    """KV-cache usage when the engine pre-allocates (or nothing else is known), else used/total."""
    if kv_usage is not None and preallocated:
        return Pressure(kv_usage, "kv_cache")
    if used_mib is not None and total_mib:
        return Pressure(min(1.0, used_mib / total_mib), "nvml")
    if kv_usage is not None:
        return Pressure(kv_usage, "kv_cache")
    return Pressure(None, "none")


class VramSampler(Protocol):
    source: VramSource

    def read(self) -> VramReading | None: ...

    def close(self) -> None: ...


class NullSampler:
    """No source: the ladder still runs and the report says "VRAM not measured"."""

    source: VramSource = "none"

    def read(self) -> VramReading | None:
        return None

    def close(self) -> None:
        return None


def _nvml_errors(nvml: Any) -> tuple[type[BaseException], ...]:
    # The library-mismatch error is not an NVMLError subclass; a missing .so is an OSError.
    found = [getattr(nvml, n, None) for n in ("NVMLError", "NVMLLibraryMismatchError")]
    return (OSError, AttributeError, *(e for e in found if isinstance(e, type)))


class NvmlSampler:
    """Device memory through NVML (memory info v2 when available), summed over the devices."""

    source: VramSource = "nvml"

    def __init__(self, nvml: Any, devices: Sequence[str] | None = None) -> None:
        self.nvml = nvml
        self.errors = _nvml_errors(nvml)
        nvml.nvmlInit()
        self.handles = [self._handle(d) for d in devices] if devices else self._all()
        self._v2 = getattr(nvml, "nvmlMemory_v2", None)

    @classmethod
    def open(cls, devices: Sequence[str] | None = None, nvml: Any = None) -> NvmlSampler | None:
        """The sampler, or None when there is no NVML library, driver or device."""
        try:
            module = nvml if nvml is not None else _import_pynvml()
        except ImportError:
            return None
        try:
            sampler = cls(module, devices)
        except _nvml_errors(module) as exc:
            log.debug("NVML unavailable: %s", exc)
            return None
        return sampler if sampler.handles else None

    def _all(self) -> list[Any]:
        return [
            self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.nvml.nvmlDeviceGetCount())
        ]

    def _handle(self, selector: str) -> Any:
        # NVML numbers devices in nvidia-smi order and ignores CUDA_VISIBLE_DEVICES: UUIDs are safe.
        if selector.isdigit():
            return self.nvml.nvmlDeviceGetHandleByIndex(int(selector))
        return self.nvml.nvmlDeviceGetHandleByUUID(selector)

    def memory(self, handle: Any) -> tuple[float, float]:
        """(used, total) MiB of one device."""
        info: Any = None
        if self._v2 is not None:
            try:
                info = self.nvml.nvmlDeviceGetMemoryInfo(handle, version=self._v2)
            except self.errors:
                self._v2 = None  # old driver: v1 from now on
        if info is None:
            info = self.nvml.nvmlDeviceGetMemoryInfo(handle)
        return info.used / MIB, info.total / MIB

    def read(self) -> VramReading | None:
        try:
            pairs = [self.memory(h) for h in self.handles]
        except self.errors as exc:
            log.debug("NVML read failed: %s", exc)
            return None
        return VramReading("nvml", sum(u for u, _ in pairs), sum(t for _, t in pairs))

    def processes(self, handle: Any) -> list[tuple[int, float]]:
        """(pid, used MiB) of the compute processes on one device; slow, so called rarely."""
        try:
            procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except self.errors:
            return []
        out: list[tuple[int, float]] = []
        for proc in procs:
            used = getattr(proc, "usedGpuMemory", None)
            out.append((int(proc.pid), used / MIB if isinstance(used, int) else 0.0))
        return out

    def close(self) -> None:
        with contextlib.suppress(*self.errors):
            self.nvml.nvmlShutdown()


def _import_pynvml() -> Any:
    import pynvml

    return pynvml


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """Metric name → value, summed over label sets (several GPUs or models add up)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line.strip())
        if not match:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        out[match.group(1)] = out.get(match.group(1), 0.0) + value
    return out


def reading_from_metrics(metrics: dict[str, float]) -> VramReading | None:
    """KV usage from the engine's metrics, device memory from the mock or a DCGM exporter."""
    kv = next((metrics[name] for name in KV_METRICS if name in metrics), None)
    used = total = None
    simulated = "mock_vram_used_bytes" in metrics
    if simulated:
        used = metrics["mock_vram_used_bytes"] / MIB
        total = metrics.get("mock_vram_total_bytes", 0.0) / MIB or None
    elif "DCGM_FI_DEV_FB_USED" in metrics:
        used = metrics["DCGM_FI_DEV_FB_USED"]  # DCGM reports MiB
        total = used + metrics.get("DCGM_FI_DEV_FB_FREE", 0.0) or None
    if kv is None and used is None:
        return None
    # The mock's memory grows with load; a real engine exposing KV usage reserved it at start.
    return VramReading("metrics", used, total, kv, preallocated=kv is not None and not simulated)


class MetricsSampler:
    """The server's Prometheus ``/metrics`` (or a DCGM exporter URL)."""

    source: VramSource = "metrics"

    def __init__(self, fetch: Callable[[], str]) -> None:
        self.fetch = fetch

    def read(self) -> VramReading | None:
        try:
            return reading_from_metrics(parse_prometheus(self.fetch()))
        except Exception as exc:  # any scrape failure just means "no sample"
            log.debug("metrics scrape failed: %s", exc)
            return None

    def close(self) -> None:
        return None


@dataclass(frozen=True)
class GpuSnapshot:
    """Per-device used/total MiB and per-process (pid, used MiB), for incidents and rollback."""

    devices: tuple[dict[str, Any], ...]
    processes: tuple[tuple[int, float], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "source": "nvml",
            "devices": list(self.devices),
            "processes": [{"pid": p, "used_mib": round(m, 1)} for p, m in self.processes],
        }


def gpu_snapshot(devices: Sequence[str] | None = None, *, nvml: Any = None) -> GpuSnapshot | None:
    """One NVML snapshot of the selected devices (default all); None without NVML."""
    sampler = NvmlSampler.open(devices, nvml=nvml)
    if sampler is None:
        return None
    try:
        rows: list[dict[str, Any]] = []
        procs: list[tuple[int, float]] = []
        for index, handle in enumerate(sampler.handles):
            try:
                used, total = sampler.memory(handle)
            except sampler.errors:
                continue
            uuid = _uuid(sampler, handle)
            rows.append({"index": index, "uuid": uuid, "used_mib": round(used, 1),
                         "total_mib": round(total, 1)})  # fmt: skip
            procs.extend(sampler.processes(handle))
        return GpuSnapshot(tuple(rows), tuple(procs))
    finally:
        sampler.close()


def _uuid(sampler: NvmlSampler, handle: Any) -> str | None:
    try:
        value = sampler.nvml.nvmlDeviceGetUUID(handle)
    except sampler.errors:
        return None
    return value.decode() if isinstance(value, bytes) else value
