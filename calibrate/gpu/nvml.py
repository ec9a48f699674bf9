"""The NVML source of VRAM readings (SPEC §8), and the GPU snapshot an incident keeps.

``pynvml`` is imported here only, lazily, so ``--help``, tests and the mock work without a
driver. A sampler reads once (``read``); ``calibrate.gpu.vram.VramMonitor`` polls the chosen
samplers on one daemon thread. The server's ``/metrics`` source lives in
``calibrate.gpu.engine_metrics``; the reading types in ``calibrate.gpu.reading``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from calibrate.gpu.reading import MIB, DeviceMemory, VramReading, VramSource

log = logging.getLogger("calibrate")

MIG_ENABLED = 1  # pynvml.NVML_DEVICE_MIG_ENABLE


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
