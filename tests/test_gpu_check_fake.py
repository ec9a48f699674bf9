"""make gpu-check's device listing and spike check, on the fake NVML (two GPUs, no driver)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from calibrate.gpu.nvml import NvmlSampler
from calibrate.gpu.reading import MIB
from tests.fakes.nvml import FakeGpu, FakeNvml

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Block:
    """What the fake allocator hands out: memory on GPU 0 until it is dropped."""

    def __init__(self, gpu: FakeGpu, size: int) -> None:
        self.gpu, self.mib = gpu, size / MIB
        gpu.used_mib += self.mib

    def __del__(self) -> None:
        self.gpu.used_mib -= self.mib


def test_the_spike_on_gpu_0_is_caught_beside_a_fuller_gpu_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """GPU 1 is the fuller card all along: the window's peak (the fullest device's) never moves,
    GPU 0's own figures show the 4 GiB it was given."""
    gpus = [FakeGpu("GPU-aaa", 1000, 81920), FakeGpu("GPU-bbb", 60000, 81920)]
    sampler = NvmlSampler.open(nvml=FakeNvml(gpus))
    assert sampler is not None
    check = _script()
    check.SPIKE_S = 0.3

    def alloc(size: int) -> Any:
        return _Block(gpus[0], size)

    check.describe(sampler)
    assert check.spike(sampler, ("fake", alloc)) is True
    out = capsys.readouterr().out
    assert "driver 999.99" in out and "gpu 0: NVIDIA Fake 80GB GPU-aaa" in out
    assert "gpu 1: NVIDIA Fake 80GB GPU-bbb" in out and "memory v1: used 60000 MiB" in out
    assert "idle 1000 MiB, peak 5096 MiB (+4096) on the first device" in out and "CAUGHT" in out
    assert gpus[0].used_mib == 1000, "the block was given back"


def test_a_spike_the_sampler_did_not_see_is_missed(capsys: pytest.CaptureFixture[str]) -> None:
    gpus = [FakeGpu("GPU-aaa", 1000, 81920)]
    sampler = NvmlSampler.open(nvml=FakeNvml(gpus))
    assert sampler is not None
    check = _script()
    check.SPIKE_S = 0.1
    assert check.spike(sampler, ("fake", lambda size: object())) is False  # nothing allocated
    assert "MISSED" in capsys.readouterr().out
