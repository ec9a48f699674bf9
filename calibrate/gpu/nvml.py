"""VRAM sampling (SPEC §8): the reading types, the pressure rule, and the NVML source.

``pynvml`` is imported here only, lazily, so ``--help``, tests and the mock work without a
driver. A sampler reads once (``read``); ``calibrate.gpu.vram.VramMonitor`` polls the chosen samplers
on one daemon thread. The server's ``/metrics`` source lives in ``calibrate.gpu.engine_metrics``.

Pressure is the fullest device's used/total — the **maximum** over the devices the server uses,
never a sum (a sum of two GPUs at 95 % and 10 % reads 52 % and the VRAM rule goes blind). A MIG
instance is its own device: its memory, not its parent GPU's.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from calibrate.engines import PREALLOCATING_KINDS as PREALLOCATING_KINDS  # gpu.vram reads it

log = logging.getLogger("calibrate")

MIB = 1024 * 1024
VramSource = Literal["nvml", "metrics", "none"]
PressureSource = Literal["kv_cache", "nvml", "metrics", "none"]
MIG_ENABLED = 1  # pynvml.NVML_DEVICE_MIG_ENABLE


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


def _nvml_errors(nvml: Any) -> tuple[type[BaseException], ...]:
    # The library-mismatch error is not an NVMLError subclass; a missing .so is an OSError.
    found = [getattr(nvml, n, None) for n in ("NVMLError", "NVMLLibraryMismatchError")]
    return (OSError, AttributeError, *(e for e in found if isinstance(e, type)))


class NvmlSampler:
    """Device memory through NVML (memory info v2 when available), one figure per device."""

    source: VramSource = "nvml"

    def __init__(self, nvml: Any, devices: Sequence[str] | None = None) -> None:
        self.nvml = nvml
        self.errors = _nvml_errors(nvml)
        nvml.nvmlInit()
        self.devices: list[tuple[str, Any]] = (
            [(d, self._handle(d)) for d in devices] if devices else self._all()
        )
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
        return sampler if sampler.devices else None

    def _all(self) -> list[tuple[str, Any]]:
        """Every GPU; one with MIG enabled counts as its instances, each its own device."""
        out: list[tuple[str, Any]] = []
        for index in range(self.nvml.nvmlDeviceGetCount()):
            parent = self.nvml.nvmlDeviceGetHandleByIndex(index)
            instances = self._mig_instances(parent)
            out += [(self.uuid(h) or f"{index}/mig{i}", h) for i, h in instances] or [
                (str(index), parent)
            ]
        return out

    def _mig_instances(self, parent: Any) -> list[tuple[int, Any]]:
        """(slot, handle) of the MIG instances of a GPU in MIG mode; [] otherwise."""
        try:
            current, _pending = self.nvml.nvmlDeviceGetMigMode(parent)
            if current != MIG_ENABLED:
                return []
            slots = int(self.nvml.nvmlDeviceGetMaxMigDeviceCount(parent))
        except self.errors:  # not MIG-capable (NotSupported), or an old library
            return []
        found: list[tuple[int, Any]] = []
        for slot in range(slots):
            try:
                found.append((slot, self.nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)))
            except self.errors:  # an empty slot (NotFound)
                continue
        return found

    def _handle(self, selector: str) -> Any:
        # NVML numbers devices in nvidia-smi order and ignores CUDA_VISIBLE_DEVICES: UUIDs are safe.
        if selector.isdigit():
            return self.nvml.nvmlDeviceGetHandleByIndex(int(selector))
        try:
            return self.nvml.nvmlDeviceGetHandleByUUID(selector)
        except self.errors:
            if not selector.startswith("MIG-"):
                raise
            # Older drivers do not look MIG UUIDs up: walk the instances of every GPU.
            for index in range(self.nvml.nvmlDeviceGetCount()):
                parent = self.nvml.nvmlDeviceGetHandleByIndex(index)
                for _, handle in self._mig_instances(parent):
                    if self.uuid(handle) == selector:
                        return handle
            raise

    def uuid(self, handle: Any) -> str | None:
        try:
            value = self.nvml.nvmlDeviceGetUUID(handle)
        except self.errors:
            return None
        return value.decode() if isinstance(value, bytes) else str(value)

    def memory(self, handle: Any) -> tuple[float, float]:
        """(used, total) MiB of one device (or MIG instance)."""
        info: Any = None
        if self._v2 is not None:
            try:
                info = self.nvml.nvmlDeviceGetMemoryInfo(handle, version=self._v2)
            except self.errors:
                self._v2 = None  # old driver (or a MIG instance without v2): v1 from now on
        if info is None:
            info = self.nvml.nvmlDeviceGetMemoryInfo(handle)
        return info.used / MIB, info.total / MIB

    def read(self) -> VramReading | None:
        try:
            devices = tuple(DeviceMemory(name, *self.memory(h)) for name, h in self.devices)
        except self.errors as exc:
            log.debug("NVML read failed: %s", exc)
            return None
        return VramReading("nvml", devices)

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
        for name, handle in sampler.devices:
            try:
                memory = DeviceMemory(name, *sampler.memory(handle))
            except sampler.errors:
                continue
            rows.append({**memory.to_json(), "uuid": sampler.uuid(handle)})
            procs.extend(sampler.processes(handle))
        return GpuSnapshot(tuple(rows), tuple(procs))
    finally:
        sampler.close()
