"""VRAM samplers with a fake pynvml-shaped probe (no GPU here), /metrics parsing, pressure."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from calibrate.gpu import (
    MIB,
    NvmlSampler,
    Pressure,
    VramReading,
    choose_pressure,
    gpu_snapshot,
    parse_prometheus,
    reading_from_metrics,
)
from calibrate.vram import VramMonitor, choose_samplers, merge


class FakeNvml:
    """Shaped like pynvml: module-level functions, NVMLError, nvmlMemory_v2."""

    class NVMLError(Exception):
        pass

    class NVMLLibraryMismatchError(Exception):  # not an NVMLError subclass, as in pynvml
        pass

    nvmlMemory_v2 = 0x02000028

    def __init__(self, devices: list[dict[str, Any]], *, v2: bool = True,
                 init_error: type[Exception] | None = None) -> None:  # fmt: skip
        self.devices = devices
        self.v2 = v2
        self.init_error = init_error
        self.calls: list[str] = []
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index >= len(self.devices):
            raise self.NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        for i, d in enumerate(self.devices):
            if d["uuid"] == uuid:
                return i
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return str(self.devices[handle]["uuid"]).encode()

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> Any:
        if version is not None and not self.v2:
            raise self.NVMLError("Function Not Found")
        self.calls.append("v2" if version else "v1")
        d = self.devices[handle]
        return SimpleNamespace(used=d["used"] * MIB, total=d["total"] * MIB)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        return [
            SimpleNamespace(pid=p, usedGpuMemory=m * MIB) for p, m in self.devices[handle]["procs"]
        ]


TWO = [
    {"uuid": "GPU-aaa", "used": 1000, "total": 80000, "procs": [(4242, 900)]},
    {"uuid": "GPU-bbb", "used": 3000, "total": 80000, "procs": [(5151, 2900), (6, 10)]},
]


def test_nvml_sums_devices_with_memory_v2() -> None:
    fake = FakeNvml(TWO)
    sampler = NvmlSampler.open(nvml=fake)
    assert sampler is not None
    assert sampler.read() == VramReading("nvml", 4000.0, 160000.0)
    assert fake.calls == ["v2", "v2"]


def test_nvml_falls_back_to_v1_and_selects_by_uuid_or_index() -> None:
    fake = FakeNvml(TWO, v2=False)
    by_uuid = NvmlSampler.open(["GPU-bbb"], nvml=fake)
    assert by_uuid is not None and by_uuid.read() == VramReading("nvml", 3000.0, 80000.0)
    assert fake.calls == ["v1"]
    by_index = NvmlSampler.open(["0"], nvml=fake)
    assert by_index is not None and by_index.read() == VramReading("nvml", 1000.0, 80000.0)


@pytest.mark.parametrize("error", [FakeNvml.NVMLError, FakeNvml.NVMLLibraryMismatchError, OSError])
def test_no_driver_or_library_mismatch_means_no_sampler(error: type[Exception]) -> None:
    assert NvmlSampler.open(nvml=FakeNvml(TWO, init_error=error)) is None
    assert gpu_snapshot(nvml=FakeNvml(TWO, init_error=error)) is None


def test_gpu_snapshot_lists_devices_and_processes() -> None:
    fake = FakeNvml(TWO)
    snap = gpu_snapshot(nvml=fake)
    assert snap is not None
    assert [d["uuid"] for d in snap.devices] == ["GPU-aaa", "GPU-bbb"]
    assert snap.devices[1]["used_mib"] == 3000.0 and snap.devices[1]["total_mib"] == 80000.0
    assert snap.processes == ((4242, 900.0), (5151, 2900.0), (6, 10.0))
    assert fake.shutdowns == 1
    only = gpu_snapshot(["GPU-aaa"], nvml=FakeNvml(TWO))
    assert only is not None and only.processes == ((4242, 900.0),)


def test_pressure_choice() -> None:
    # pre-allocating engine: NVML is flat near full, the KV cache tells the load
    assert choose_pressure(
        used_mib=76000, total_mib=80000, kv_usage=0.3, preallocated=True
    ) == Pressure(0.3, "kv_cache")
    # memory that grows with load: used/total
    assert choose_pressure(
        used_mib=40000, total_mib=80000, kv_usage=0.3, preallocated=False
    ) == Pressure(0.5, "nvml")
    assert choose_pressure(
        used_mib=None, total_mib=None, kv_usage=0.7, preallocated=False
    ) == Pressure(0.7, "kv_cache")
    assert choose_pressure(used_mib=None, total_mib=None, kv_usage=None, preallocated=False) == Pressure(None, "none")  # fmt: skip


VLLM = """# HELP vllm:kv_cache_usage_perc KV-cache usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.25
vllm:num_requests_running{model_name="m"} 3
"""


def test_metrics_of_a_preallocating_engine_beside_flat_nvml() -> None:
    kv = reading_from_metrics(parse_prometheus(VLLM))
    assert kv == VramReading("metrics", None, None, 0.25, preallocated=True)
    merged = merge([VramReading("nvml", 72000.0, 80000.0), kv])
    assert merged is not None
    assert merged.pressure == Pressure(0.25, "kv_cache") and merged.nvml_used_mib == 72000.0
    # no KV metric at all: NVML decides
    alone = merge([VramReading("nvml", 72000.0, 80000.0)])
    assert alone is not None and alone.pressure == Pressure(0.9, "nvml")
    # [server] kind (vllm, sglang, lmdeploy) says the engine pre-allocates
    sglang = VramReading("metrics", None, None, 0.4)
    told = merge([VramReading("nvml", 72000.0, 80000.0), sglang], preallocating_kind=True)
    assert told is not None and told.pressure == Pressure(0.4, "kv_cache")


def test_mock_and_dcgm_metrics_are_device_memory() -> None:
    mock = parse_prometheus(f"mock_vram_used_bytes {6000 * MIB}\nmock_vram_total_bytes {8000 * MIB}\n"
                            'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n')  # fmt: skip
    reading = reading_from_metrics(mock)
    assert reading == VramReading("metrics", 6000.0, 8000.0, 0.5, preallocated=False)
    merged = merge([reading])
    assert merged is not None and merged.pressure == Pressure(0.75, "metrics")
    dcgm = parse_prometheus('DCGM_FI_DEV_FB_USED{gpu="0"} 100\nDCGM_FI_DEV_FB_USED{gpu="1"} 300\n'
                            'DCGM_FI_DEV_FB_FREE{gpu="0"} 700\nDCGM_FI_DEV_FB_FREE{gpu="1"} 500\n')  # fmt: skip
    assert reading_from_metrics(dcgm) == VramReading("metrics", 400.0, 1600.0)
    assert reading_from_metrics(parse_prometheus("other_metric 1\n")) is None


class Scripted:
    source = "metrics"

    def __init__(self, used: list[float]) -> None:
        self.used = used

    def read(self) -> VramReading | None:
        return VramReading("metrics", self.used.pop(0), 1000.0) if self.used else None

    def close(self) -> None:
        pass


def test_monitor_window_keeps_idle_and_peak() -> None:
    monitor = VramMonitor([Scripted([100.0, 900.0, 400.0, 150.0])])
    idle = monitor.open_window()
    monitor.sample()
    monitor.sample()
    peak = monitor.close_window(idle)
    assert idle is not None and idle.used_mib == 100.0
    assert peak.peak_used_mib == 900.0 and peak.peak_pressure == Pressure(0.9, "metrics")
    assert peak.samples == 4 and monitor.source == "metrics"


def test_automatic_choice() -> None:
    def no_metrics() -> str:
        raise OSError("nothing there")

    assert choose_samplers("auto", no_metrics, nvml=FakeNvml(TWO, init_error=OSError)) == []
    both = choose_samplers("auto", lambda: VLLM, nvml=FakeNvml(TWO))
    assert [s.source for s in both] == ["nvml", "metrics"]
    assert [s.source for s in choose_samplers("metrics", lambda: VLLM, nvml=FakeNvml(TWO))] == [
        "metrics"
    ]
    assert choose_samplers("none", lambda: VLLM, nvml=FakeNvml(TWO)) == []
    assert VramMonitor([]).source == "none"
