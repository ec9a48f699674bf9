"""One merged VRAM sample: each chosen source's reading of one poll made one view of device
memory, KV usage, the pressure that counts and the server's queue (``merge``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from calibrate.gpu.reading import (
    DeviceMemory,
    Pressure,
    VramReading,
    choose_pressure,
    devices_total_mib,
    devices_used_mib,
)


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
