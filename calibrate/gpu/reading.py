"""VRAM readings (SPEC §8): per-device memory, one sampler's reading, and the pressure rule.

Pressure is the fullest device's used/total — the **maximum** over the devices the server uses,
never a sum (a sum of two GPUs at 95 % and 10 % reads 52 % and the VRAM rule goes blind). A MIG
instance is its own device: its memory, not its parent GPU's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

MIB = 1024 * 1024
VramSource = Literal["nvml", "metrics", "none"]
PressureSource = Literal["kv_cache", "nvml", "metrics", "none"]


@dataclass(frozen=True)
class DeviceMemory:
    """One device's memory: ``device`` is the NVML index, a GPU-/MIG- UUID, or an exporter label."""

    device: str
    used_mib: float
    total_mib: float | None

    @property
    def pressure(self) -> float | None:
        return min(1.0, self.used_mib / self.total_mib) if self.total_mib else None

    def to_json(self) -> dict[str, Any]:
        pressure = self.pressure
        return {
            "device": self.device,
            "used_mib": round(self.used_mib, 1),
            "total_mib": round(self.total_mib, 1) if self.total_mib is not None else None,
            "pressure": round(pressure, 4) if pressure is not None else None,
        }


def fullest_device(devices: Sequence[DeviceMemory]) -> DeviceMemory | None:
    """The device that runs out first: the highest used/total; without totals, the most used."""
    known = [d for d in devices if d.pressure is not None]
    if known:
        return max(known, key=lambda d: d.pressure or 0.0)
    return max(devices, key=lambda d: d.used_mib, default=None)


def devices_used_mib(devices: Sequence[DeviceMemory]) -> float | None:
    """The fullest device's use (None when none was read): never a sum — 85,000 MiB "used" on
    two 80 GiB cards is no number a user can act on; each device's own is in ``per_device``."""
    fullest = fullest_device(devices)
    return fullest.used_mib if fullest is not None else None


def devices_total_mib(devices: Sequence[DeviceMemory]) -> float | None:
    """The fullest device's capacity, the total its use is read against."""
    fullest = fullest_device(devices)
    return fullest.total_mib if fullest is not None and fullest.total_mib else None


@dataclass(frozen=True)
class VramReading:
    """One sample of one source; a field is None (or empty) when the source does not measure it."""

    source: VramSource
    devices: tuple[DeviceMemory, ...] = ()
    kv_usage: float | None = None  # 0–1 KV-cache usage, the maximum over label sets
    preallocated: bool = False  # the engine reserves memory at start (pressure = KV usage)
    kv_metric: str | None = None  # which metric the KV usage came from
    device_metric: str | None = None  # "mock_vram_used_bytes", "DCGM_FI_DEV_FB_USED"; None: NVML
    server_queue: float | None = None  # requests the server holds waiting (its queue gauge)
    queue_metric: str | None = None
    server_running: float | None = None  # requests it executes now (its running gauge)
    running_metric: str | None = None
    server_deferred: float | None = None  # of the waiting: not for capacity (vLLM's reason)

    @property
    def used_mib(self) -> float | None:
        """The fullest device's use, as pressure is the fullest device's (never a sum)."""
        return devices_used_mib(self.devices)

    @property
    def total_mib(self) -> float | None:
        return devices_total_mib(self.devices)

    @property
    def fullest(self) -> DeviceMemory | None:
        """The device with the highest used/total: the one that runs out first."""
        known = [d for d in self.devices if d.pressure is not None]
        return fullest_device(known) if known else None

    @property
    def measures_vram(self) -> bool:
        return bool(self.devices) or self.kv_usage is not None


@dataclass(frozen=True)
class Pressure:
    value: float | None
    source: PressureSource
    metric: str | None = None  # what exactly: "vllm:kv_cache_usage_perc", "device 1", …

    @property
    def text(self) -> str:
        """``metrics: vllm:kv_cache_usage_perc``, ``nvml: device 1``; named in every report."""
        if self.metric is None:
            return self.source
        return f"{'nvml' if self.source == 'nvml' else 'metrics'}: {self.metric}"


def choose_pressure(
    device: VramReading | None, kv: VramReading | None, *, preallocated: bool
) -> Pressure:
    """KV-cache usage when the engine pre-allocates (or nothing else is known), else the fullest
    device's used/total."""
    kv_usage = kv.kv_usage if kv is not None else None
    kv_metric = kv.kv_metric if kv is not None else None
    if kv_usage is not None and preallocated:
        return Pressure(kv_usage, "kv_cache", kv_metric)
    fullest = device.fullest if device is not None else None
    if device is not None and fullest is not None and fullest.pressure is not None:
        if device.source == "nvml":
            return Pressure(fullest.pressure, "nvml", f"device {fullest.device}")
        where = device.device_metric or "device memory"
        if len(device.devices) > 1:
            where += f" (device {fullest.device})"
        return Pressure(fullest.pressure, "metrics", where)
    if kv_usage is not None:
        return Pressure(kv_usage, "kv_cache", kv_metric)
    return Pressure(None, "none")


class VramSampler(Protocol):
    source: VramSource  # "none" for a source that answers but measures no VRAM (a queue only)

    def read(self) -> VramReading | None: ...

    def close(self) -> None: ...


class NullSampler:
    """No source: the ladder still runs and the report says "VRAM not measured"."""

    source: VramSource = "none"

    def read(self) -> VramReading | None:
        return None

    def close(self) -> None:
        return None
