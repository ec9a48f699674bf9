"""A hand-written stand-in for the ``pynvml`` module: GPUs, MIG instances, memory, processes.

A handle is the ``FakeGpu`` itself. Pass an instance as ``nvml=`` wherever calibrate takes the
module; nothing is patched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

MIB = 1024 * 1024


@dataclass
class FakeGpu:
    """A GPU, or a MIG instance of one (``migs`` is None: MIG off; a list: MIG on, its slots)."""

    uuid: str
    used_mib: float
    total_mib: float
    procs: list[tuple[int, float]] = field(default_factory=list)
    migs: list[FakeGpu | None] | None = None
    is_mig: bool = False
    energy_mj: int | None = None  # the total-energy counter; None: Not Supported (a MIG instance)
    power_mw: int | None = None  # the power draw now; None: Not Supported


def mig(uuid: str, used_mib: float, total_mib: float, *procs: tuple[int, float]) -> FakeGpu:
    return FakeGpu(uuid, used_mib, total_mib, list(procs), is_mig=True)


class FakeNvml:
    """Shaped like pynvml: module-level functions, NVMLError, nvmlMemory_v2."""

    class NVMLError(Exception):
        pass

    class NVMLLibraryMismatchError(Exception):  # not an NVMLError subclass, as in pynvml
        pass

    nvmlMemory_v2 = 0x02000028

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        v2: bool = True,
        init_error: type[Exception] | None = None,
        mig_uuid_lookup: bool = True,
    ) -> None:
        self.gpus = gpus
        self.v2 = v2
        self.init_error = init_error
        self.mig_uuid_lookup = mig_uuid_lookup  # recent drivers find MIG UUIDs; old ones do not
        self.calls: list[str] = []
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if index >= len(self.gpus):
            raise self.NVMLError("Invalid Argument")
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
            for instance in gpu.migs or []:
                if instance is not None and instance.uuid == uuid and self.mig_uuid_lookup:
                    return instance
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> bytes:
        return handle.uuid.encode()

    def nvmlDeviceGetMigMode(self, handle: FakeGpu) -> list[int]:
        if handle.is_mig:
            raise self.NVMLError("Invalid Argument")
        if handle.migs is None:
            raise self.NVMLError("Not Supported")
        return [1, 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeGpu) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeGpu, index: int) -> FakeGpu:
        slots = handle.migs or []
        found = slots[index] if index < len(slots) else None
        if found is None:
            raise self.NVMLError("Not Found")
        return found

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu, version: int | None = None) -> Any:
        if version is not None and not self.v2:
            raise self.NVMLError("Function Not Found")
        self.calls.append(("v2" if version else "v1") + (" mig" if handle.is_mig else ""))
        used, total = int(handle.used_mib * MIB), int(handle.total_mib * MIB)
        return SimpleNamespace(used=used, total=total, free=total - used, reserved=0)

    def nvmlDeviceGetName(self, handle: FakeGpu) -> bytes:
        return b"NVIDIA Fake 80GB"

    def nvmlSystemGetDriverVersion(self) -> str:
        return "999.99"

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "12.999"

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=int(m * MIB)) for p, m in handle.procs]

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeGpu) -> int:
        if handle.energy_mj is None:
            raise self.NVMLError("Not Supported")
        return handle.energy_mj

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        if handle.power_mw is None:
            raise self.NVMLError("Not Supported")
        return handle.power_mw
