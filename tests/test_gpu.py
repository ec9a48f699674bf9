"""NVML sampling with a hand-written fake pynvml (no GPU here): per device, MIG, snapshots."""

from __future__ import annotations

import pytest

from calibrate.gpu.nvml import NvmlSampler, gpu_snapshot
from calibrate.gpu.reading import DeviceMemory, Pressure, VramReading, choose_pressure
from calibrate.gpu.vram import VramMonitor
from calibrate.gpu.vram.sample import merge
from tests.fakes.nvml import FakeGpu, FakeNvml, mig


def two() -> list[FakeGpu]:
    return [
        FakeGpu("GPU-aaa", 1000, 80000, [(4242, 900)]),
        FakeGpu("GPU-bbb", 3000, 80000, [(5151, 2900), (6, 10)]),
    ]


def test_nvml_reads_each_device_with_memory_v2() -> None:
    fake = FakeNvml(two())
    sampler = NvmlSampler.open(nvml=fake)
    assert sampler is not None
    reading = sampler.read()
    assert reading == VramReading(
        "nvml", (DeviceMemory("0", 1000.0, 80000.0), DeviceMemory("1", 3000.0, 80000.0))
    )
    # the fullest device's figures, never a sum over the two cards
    assert reading.used_mib == 3000.0 and reading.total_mib == 80000.0
    assert fake.calls == ["v2", "v2"]


def test_pressure_is_the_fullest_device_never_the_average() -> None:
    # GPU0 at 95 %, GPU1 at 10 %: summed that reads 52 % and the 90 % VRAM rule never fires
    fake = FakeNvml([FakeGpu("GPU-aaa", 76000, 80000), FakeGpu("GPU-bbb", 8000, 80000)])
    sampler = NvmlSampler.open(nvml=fake)
    assert sampler is not None
    merged = merge([r for r in [sampler.read()] if r is not None])
    assert merged is not None
    assert merged.pressure == Pressure(0.95, "nvml", "device 0")
    assert merged.pressure.text == "nvml: device 0"
    assert merged.used_mib == 76000.0 and merged.total_mib == 80000.0  # GPU0's, not the sum


def test_nvml_falls_back_to_v1_and_selects_by_uuid_or_index() -> None:
    fake = FakeNvml(two(), v2=False)
    by_uuid = NvmlSampler.open(["GPU-bbb"], nvml=fake)
    assert by_uuid is not None
    assert by_uuid.read() == VramReading("nvml", (DeviceMemory("GPU-bbb", 3000.0, 80000.0),))
    assert fake.calls == ["v1"]
    by_index = NvmlSampler.open(["0"], nvml=fake)
    assert by_index is not None
    assert by_index.read() == VramReading("nvml", (DeviceMemory("0", 1000.0, 80000.0),))


@pytest.mark.parametrize("error", [FakeNvml.NVMLError, FakeNvml.NVMLLibraryMismatchError, OSError])
def test_no_driver_or_library_mismatch_means_no_sampler(error: type[Exception]) -> None:
    assert NvmlSampler.open(nvml=FakeNvml(two(), init_error=error)) is None
    assert gpu_snapshot(nvml=FakeNvml(two(), init_error=error)) is None


def test_gpu_snapshot_lists_devices_with_pressure_and_processes() -> None:
    fake = FakeNvml(two())
    snap = gpu_snapshot(nvml=fake)
    assert snap is not None
    assert [d["uuid"] for d in snap.devices] == ["GPU-aaa", "GPU-bbb"]
    assert snap.devices[1] == {
        "device": "1",
        "uuid": "GPU-bbb",
        "used_mib": 3000.0,
        "total_mib": 80000.0,
        "pressure": 0.0375,
    }
    assert snap.processes == ((4242, 900.0), (5151, 2900.0), (6, 10.0))
    assert fake.shutdowns == 1
    only = gpu_snapshot(["GPU-aaa"], nvml=FakeNvml(two()))
    assert only is not None and only.processes == ((4242, 900.0),)


def mig_machine() -> list[FakeGpu]:
    """One A100 80 GB in MIG mode with two 20 GB instances (slot 1 empty), and a plain GPU."""
    parent = FakeGpu("GPU-par", 27000, 81920)
    parent.migs = [mig("MIG-a1", 19000, 20000, (7001, 18800)), None, mig("MIG-b2", 2000, 20000)]
    return [parent, FakeGpu("GPU-xyz", 500, 81920)]


@pytest.mark.parametrize("recent_driver", [True, False])
def test_a_mig_instance_given_by_uuid_is_sampled_as_its_own_device(recent_driver: bool) -> None:
    # The server runs on MIG-a1: 95 % of its 20 GB, while the parent GPU reads 33 %.
    fake = FakeNvml(mig_machine(), mig_uuid_lookup=recent_driver)
    sampler = NvmlSampler.open(["MIG-a1"], nvml=fake)
    assert sampler is not None
    reading = sampler.read()
    assert reading == VramReading("nvml", (DeviceMemory("MIG-a1", 19000.0, 20000.0),))
    merged = merge([reading])
    assert merged is not None and merged.pressure == Pressure(0.95, "nvml", "device MIG-a1")
    snap = gpu_snapshot(["MIG-a1"], nvml=FakeNvml(mig_machine(), mig_uuid_lookup=recent_driver))
    assert snap is not None and snap.processes == ((7001, 18800.0),)
    assert [d["device"] for d in snap.devices] == ["MIG-a1"]


def test_an_unknown_mig_uuid_means_no_sampler() -> None:
    assert NvmlSampler.open(["MIG-nope"], nvml=FakeNvml(mig_machine())) is None


def test_all_devices_lists_mig_instances_instead_of_their_parent() -> None:
    fake = FakeNvml(mig_machine())
    sampler = NvmlSampler.open(nvml=fake)
    assert sampler is not None
    reading = sampler.read()
    assert reading is not None
    assert [d.device for d in reading.devices] == ["MIG-a1", "MIG-b2", "1"]
    assert fake.calls == ["v2 mig", "v2 mig", "v2"]
    fullest = reading.fullest
    assert fullest is not None and fullest.device == "MIG-a1"


def test_pressure_choice() -> None:
    flat = VramReading("nvml", (DeviceMemory("0", 76000, 80000),))
    kv = VramReading("metrics", kv_usage=0.3, kv_metric="vllm:kv_cache_usage_perc")
    # pre-allocating engine: NVML is flat near full, the KV cache tells the load
    assert choose_pressure(flat, kv, preallocated=True) == Pressure(
        0.3, "kv_cache", "vllm:kv_cache_usage_perc"
    )
    assert choose_pressure(flat, kv, preallocated=True).text == "metrics: vllm:kv_cache_usage_perc"
    # memory that grows with load: used/total
    half = VramReading("nvml", (DeviceMemory("0", 40000, 80000),))
    assert choose_pressure(half, kv, preallocated=False) == Pressure(0.5, "nvml", "device 0")
    assert choose_pressure(None, kv, preallocated=False).value == 0.3
    assert choose_pressure(None, None, preallocated=False) == Pressure(None, "none")
    assert Pressure(None, "none").text == "none"


def test_monitor_source_line_names_the_fullest_device() -> None:
    fake = FakeNvml([FakeGpu("GPU-aaa", 1000, 80000), FakeGpu("GPU-bbb", 76000, 80000)])
    sampler = NvmlSampler.open(nvml=fake)
    assert sampler is not None
    line = VramMonitor([sampler]).describe()
    assert line == "nvml (every 0.05 s); pressure from nvml: device 1, the fullest of 2 devices"
