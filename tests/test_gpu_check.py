"""make gpu-check on a machine without a GPU says so and succeeds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"


def test_gpu_check_without_gpu_says_so_and_exits_0() -> None:
    from calibrate.gpu.nvml import NvmlSampler

    if NvmlSampler.open() is not None:
        pytest.skip("this machine has an NVIDIA GPU; the no-GPU path cannot be shown here")
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert "no NVIDIA GPU visible" in done.stdout
