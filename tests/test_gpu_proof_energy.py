"""The GPU proof records energy (SPEC §13) — what can run without a card: gpu-check's energy
lines on the fake NVML (a counter that rises through the spike; a MIG-like device with none),
and the report builder on a recorded work folder (a ladder and a sweep whose rows carry NVML's
energy, and a CPU dry run whose rows carry none)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from calibrate.gpu.nvml import NvmlSampler
from calibrate.gpu.reading import MIB
from tests.fakes.nvml import FakeGpu, FakeNvml

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPTS / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _HotBlock:
    """Memory on GPU 0 that also burns 150 J on its counter while it is held."""

    def __init__(self, gpu: FakeGpu, size: int) -> None:
        self.gpu, self.mib = gpu, size / MIB
        gpu.used_mib += self.mib
        assert gpu.energy_mj is not None
        gpu.energy_mj += 150_000

    def __del__(self) -> None:
        self.gpu.used_mib -= self.mib


def test_gpu_check_reads_the_energy_counter_over_the_spike(
    capsys: pytest.CaptureFixture[str],
) -> None:
    gpu = FakeGpu("GPU-aaa", 1000, 81920, energy_mj=5_000_000, power_mw=71_000)
    sampler = NvmlSampler.open(nvml=FakeNvml([gpu]))
    assert sampler is not None
    check = _gpu_check()
    check.SPIKE_S = 0.3
    check.describe(sampler)
    assert check.spike(sampler, ("fake", lambda size: _HotBlock(gpu, size))) is True
    out = capsys.readouterr().out
    assert "  energy: total-energy counter 5000.0 J since the driver loaded; power 71 W" in out
    line = next(x for x in out.splitlines() if x.startswith("energy:"))
    assert line.startswith("energy: nvml total energy, 150.0 J over "), line
    assert line.endswith("across the spike window, all devices")


def test_gpu_check_says_when_nvml_has_no_energy(capsys: pytest.CaptureFixture[str]) -> None:
    """A MIG instance: neither the counter nor the power draw — said, not a failure."""
    gpu = FakeGpu("GPU-aaa", 1000, 81920)
    sampler = NvmlSampler.open(nvml=FakeNvml([gpu]))
    assert sampler is not None
    check = _gpu_check()
    check.SPIKE_S = 0.1
    check.describe(sampler)
    print(check.energy_line(check.idle_energy(sampler)))  # as spike() says it without a tool
    out = capsys.readouterr().out
    assert "total-energy counter not supported (Not Supported); power not supported" in out
    assert "energy: NVML gave neither the total-energy counter nor the power draw" in out


def _energy(joules: float, tokens: int, seconds: float) -> dict[str, Any]:
    return {
        "energy_j": joules,
        "power_mean_w": joules / seconds,
        "joules_per_output_token": joules / tokens,
        "energy_source": "nvml total energy",
    }


def _work(root: Path, *, energy: bool, sweep: str = "pass") -> Path:
    """A proof's work folder as gpu_proof.sh leaves it: steps, ladder and sweep runs."""
    runs = root / "runs"
    for run_id, rows in (
        (
            "ladder-1",
            [{"batch_size": b, "verdict": "pass", "items_per_s": b * 1.5} for b in (1, 2, 4)],
        ),
        (
            "sweep-1",
            [
                {"concurrency": c, "verdict": "pass", "items_per_s": c * 1.2, "errors": 0}
                for c in (1, 2, 4)
            ],
        ),
    ):
        (runs / run_id).mkdir(parents=True)
        if energy:
            for n, row in enumerate(rows, 1):
                row.update(_energy(100.0 * n, 64 * n, 3.0))
        lines = "".join(json.dumps(r) + "\n" for r in rows)
        (runs / run_id / "tiers.jsonl").write_text(lines, "utf-8")
    (root / "ladder.json").write_text(json.dumps({"run_id": "ladder-1"}), "utf-8")
    (root / "sweep.json").write_text(json.dumps({"run_id": "sweep-1"}), "utf-8")
    why = "budget: 120 s left, under 240 s" if sweep == "skipped" else ""
    steps = ["4c\tladder\tpass\t\t3", f"4d\tsweep\t{sweep}\t{why}\t5"]
    (root / "steps.tsv").write_text("\n".join(steps) + "\n", "utf-8")
    (root / "gpu_check.txt").write_text(
        "gpu 0: NVIDIA Fake GPU-aaa\nenergy: nvml total energy, 150.0 J over 1.6 s (mean 94 W) "
        "across the spike window, all devices\n"
        if energy
        else "gpu-check: no NVIDIA GPU visible\n",
        "utf-8",
    )
    return root


def _report(work: Path, dry: str) -> tuple[str, dict[str, Any]]:
    out = work / "out" / "summary.md"
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / "gpu_proof_report.py"),
            "--work",
            str(work),
            "--out",
            str(out),
            "--dry",
            dry,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stderr == "", done.stderr
    return out.read_text("utf-8"), json.loads((out.parent / "energy.json").read_text("utf-8"))


def _check(summary: str, step: str, what: str) -> list[str]:
    row = next(x for x in summary.splitlines() if x.startswith(f"| {step} | {what}: joules"))
    return [c.strip() for c in row.strip("|").split("|")]


def test_the_summary_and_energy_json_carry_joules_watts_and_j_per_token(tmp_path: Path) -> None:
    summary, energy = _report(_work(tmp_path, energy=True), "0")
    assert "- energy: nvml total energy, 150.0 J over 1.6 s (mean 94 W)" in summary
    ladder = _check(summary, "4c", "ladder")
    assert ladder[2] == "pass" and ladder[3] == "source nvml total energy; 3 of 3 rows"
    assert _check(summary, "4d", "sweep")[2] == "pass"
    tiers = summary.split("## Ladder tiers", 1)[1].split("## Sweep levels", 1)[0]
    assert "| energy J | mean W | J/output token |" in tiers
    assert "| 4 | pass | 6.00 |" in tiers and tiers.rstrip().endswith("| 300.0 | 100 | 1.562 |")
    levels = summary.split("## Sweep levels", 1)[1]
    assert "| 2 | pass | 2.40 | – | 0 | 200.0 | 67 | 1.562 |" in levels
    assert energy["gpu_check"].startswith("energy: nvml total energy, 150.0 J")
    assert [r["batch_size"] for r in energy["ladder_tiers"]] == [1, 2, 4]
    assert energy["ladder_tiers"][0] == {
        "batch_size": 1,
        "verdict": "pass",
        "output_tokens_per_s": None,
        "energy_j": 100.0,
        "power_mean_w": pytest.approx(33.333, rel=1e-3),
        "joules_per_output_token": 1.5625,
        "energy_source": "nvml total energy",
    }
    assert [r["concurrency"] for r in energy["sweep_levels"]] == [1, 2, 4]


def test_on_the_card_missing_energy_fails_and_on_the_cpu_it_is_skipped(tmp_path: Path) -> None:
    card, _ = _report(_work(tmp_path / "card", energy=False), "0")
    assert _check(card, "4c", "ladder")[2:] == ["fail", "source none; 0 of 3 rows"]
    dry, energy = _report(_work(tmp_path / "dry", energy=False), "1")
    assert _check(dry, "4c", "ladder")[2] == "skipped: no NVML (CPU)"
    assert _check(dry, "4d", "sweep")[2] == "skipped: no NVML (CPU)"
    assert "- energy: gpu-check did not read it (no NVML)" in dry
    assert energy["gpu_check"] is None and energy["ladder_tiers"][0]["energy_j"] is None


def test_a_sweep_skipped_for_the_budget_is_said_and_not_checked(tmp_path: Path) -> None:
    summary, _ = _report(_work(tmp_path, energy=True, sweep="skipped"), "1")
    row = next(x for x in summary.splitlines() if x.startswith("| 4d | sweep: the command"))
    assert "| skipped: budget: 120 s left, under 240 s |" in row
    assert not any(x.startswith("| 4d | sweep: joules") for x in summary.splitlines())
