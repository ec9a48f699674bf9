"""Which devices to sample when --gpu is not given: the managed server's CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from calibrate.gpu import DeviceMemory, NvmlSampler, VramReading
from calibrate.server import process
from calibrate.server.devices import managed_server_devices, visible_devices
from tests.fakes.nvml import FakeGpu, FakeNvml, mig

MIG_A = "MIG-5f3c7a2e-1b4d-4c8e-9a6f-0d2b3c4e5f61"
GPU_B = "GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"


@pytest.mark.parametrize(
    ("environ", "devices"),
    [
        ({"CUDA_VISIBLE_DEVICES": MIG_A}, (MIG_A,)),
        ({"CUDA_VISIBLE_DEVICES": f"{GPU_B}, {MIG_A}"}, (GPU_B, MIG_A)),
        # CUDA's index order is NVML's only when asked for
        ({"CUDA_VISIBLE_DEVICES": "1,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, ("1", "0")),
        ({"CUDA_VISIBLE_DEVICES": "1,0"}, None),
        ({"CUDA_VISIBLE_DEVICES": "GPU-0a1b2c3d"}, None),  # a prefix: not looked up
        ({"CUDA_VISIBLE_DEVICES": f"MIG-{GPU_B}/1/0"}, None),  # the legacy MIG form
        ({"CUDA_VISIBLE_DEVICES": ""}, None),
        ({}, None),
    ],
)
def test_visible_devices(environ: dict[str, str], devices: tuple[str, ...] | None) -> None:
    assert visible_devices(environ) == devices


def test_a_managed_server_on_a_mig_instance_is_sampled_there(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": MIG_A}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        start = process.start_id(child.pid)
        assert start is not None
        record = process.ServerRecord(child.pid, start, ("engine",), "custom", 8000, None, "now", 0)
        process.save(record, tmp_path)
        devices = managed_server_devices(tmp_path)
        assert devices == (MIG_A,)
        parent = FakeGpu("GPU-par", 27000, 81920)
        parent.migs = [mig(MIG_A, 19000, 20000), mig("MIG-other", 100, 20000)]
        sampler = NvmlSampler.open(devices, nvml=FakeNvml([parent]))
        assert sampler is not None
        assert sampler.read() == VramReading("nvml", (DeviceMemory(MIG_A, 19000, 20000),))
    finally:
        child.kill()
        child.wait()
    assert managed_server_devices(tmp_path) is None  # gone: nothing to say
    assert managed_server_devices(tmp_path / "none") is None
