"""Which devices to sample when --gpu is not given: the managed server's CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from calibrate.config import Config, SweepConfig
from calibrate.gpu.nvml import NvmlSampler
from calibrate.gpu.reading import DeviceMemory, VramReading
from calibrate.gpu.vram import VramMonitor
from calibrate.server import pids, process
from calibrate.server.devices import managed_server_devices, visible_devices
from calibrate.stages.sweep.run import Sweep
from calibrate.stages.sweep.spec import SweepOptions
from tests.fakes.nvml import FakeGpu, FakeNvml, mig
from tests.stage_fakes import SimulatedLoop, close_runs, recorder, stage_ctx
from tests.tier_helpers import jsonl

__all__ = ["close_runs"]  # the autouse fixture, used by being imported

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
        start = pids.start_id(child.pid)
        assert start is not None
        record = process.ServerRecord(child.pid, start, ("engine",), "custom", 8000, None, "now", 0)
        process.save(record, tmp_path)
        cfg = replace(Config(), paths=replace(Config().paths, runs=str(tmp_path)))  # :8000
        devices = managed_server_devices(cfg)
        assert devices == (MIG_A,)
        elsewhere = replace(cfg, target=replace(cfg.target, base_url="http://127.0.0.1:9/v1"))
        assert managed_server_devices(elsewhere) is None  # beside another target: not its GPU
        parent = FakeGpu("GPU-par", 27000, 81920)
        parent.migs = [mig(MIG_A, 19000, 20000), mig("MIG-other", 100, 20000)]
        sampler = NvmlSampler.open(devices, nvml=FakeNvml([parent]))
        assert sampler is not None
        assert sampler.read() == VramReading("nvml", (DeviceMemory(MIG_A, 19000, 20000),))
    finally:
        child.kill()
        child.wait()
    assert managed_server_devices(cfg) is None  # gone: nothing to say
    none = replace(cfg, paths=replace(cfg.paths, runs=str(tmp_path / "none")))
    assert managed_server_devices(none) is None


def test_peak_mib_is_the_fullest_devices_own_peak_never_the_sum() -> None:
    """Two 80 GiB cards at 42,000 and 43,000 MiB: summed that is 85,000 MiB "used", more than
    either card holds. The window's peak is the fullest card's, the total is that card's."""
    cards = [FakeGpu("GPU-aaa", 30000, 81920), FakeGpu("GPU-bbb", 20000, 81920)]
    sampler = NvmlSampler.open(nvml=FakeNvml(cards))
    assert sampler is not None
    monitor = VramMonitor([sampler])
    idle = monitor.open_window()
    assert idle is not None and idle.used_mib == 30000.0 and idle.total_mib == 81920.0
    cards[0].used_mib, cards[1].used_mib = 42000, 43000
    monitor.sample()
    cards[0].used_mib, cards[1].used_mib = 35000, 25000  # the peak is gone when the window ends
    peak = monitor.close_window(idle)
    assert peak.peak_used_mib == 43000.0 and peak.total_mib == 81920.0
    assert [(d.device, d.used_mib) for d in peak.devices] == [("0", 42000.0), ("1", 43000.0)]
    assert peak.peak_pressure.text == "nvml: device 1"


def test_the_fullest_card_is_by_share_not_by_mib() -> None:
    """A 24 GiB card at 23,000 MiB runs out before an 80 GiB one at 40,000 MiB: its figures are
    the peak and the total (the share a user compares with the card's size)."""
    cards = [FakeGpu("GPU-big", 40000, 81920), FakeGpu("GPU-small", 23000, 24576)]
    sampler = NvmlSampler.open(nvml=FakeNvml(cards))
    assert sampler is not None
    monitor = VramMonitor([sampler])
    peak = monitor.close_window(monitor.open_window())
    assert (peak.peak_used_mib, peak.total_mib) == (23000.0, 24576.0)
    assert peak.peak_pressure.value == pytest.approx(23000 / 24576)


def test_a_tier_written_on_two_cards_reports_the_fullest_card(tmp_path: Path) -> None:
    """The file a user reads: tiers.jsonl's peak_vram_mib is one card's peak (≤ its total),
    each card's own peak beside it."""
    cards = [FakeGpu("GPU-aaa", 42000, 81920), FakeGpu("GPU-bbb", 43000, 81920)]
    sampler = NvmlSampler.open(nvml=FakeNvml(cards))
    assert sampler is not None
    monitor = VramMonitor([sampler])
    cfg = Config(sweep=replace(SweepConfig(), concurrency=(1, 2), level_s=0.5, repeats=1))
    ctx = stage_ctx(tmp_path, cfg, "sweep")
    loop = SimulatedLoop(lambda concurrency, repeat: 0.1)
    Sweep(
        ctx, SweepOptions.from_config(cfg, 4), monitor, recorder(ctx, monitor, tmp_path), loop
    ).run()
    rows = jsonl(ctx.run.path / "tiers.jsonl")
    assert [r["peak_vram_mib"] for r in rows] == [43000.0, 43000.0]
    assert all(r["peak_vram_mib"] <= r["vram_total_mib"] == 81920.0 for r in rows)
    assert [d["used_mib"] for d in rows[0]["per_device"]] == [42000.0, 43000.0]
