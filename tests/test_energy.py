"""Energy and cost per tier and level (SPEC §13): the DCGM-style mock end to end, the fake NVML
counter, $ per 1M output tokens at the setting, no columns without a source, a bad price."""

from __future__ import annotations

import csv
import shlex
from pathlib import Path
from typing import Any

import pytest

from calibrate.gpu.energy import EnergySample, dcgm_sample, window_energy
from calibrate.gpu.nvml import NvmlSampler
from calibrate.gpu.sources import energy_reader
from calibrate.gpu.vram import VramMonitor
from tests.fakes.nvml import FakeGpu, FakeNvml
from tests.mockserver import start_mock
from tests.tier_helpers import FAST, jsonl, open_gate, run_dir
from tests.tune_helpers import MOCK, tune_config

ENERGY = ("energy_j", "power_mean_w", "joules_per_output_token")
LADDER = f"{FAST}batch_sizes = [1, 2, 4]\n"
PINNED = f'{LADDER}[server]\nmodel_path = "/models/m"\n'


def _ladder(cli: Any, root: Path, *flags: str, extra: str = LADDER, **mock: Any) -> Any:
    with start_mock(ttft_s=0.01, per_token_s=0.002, **mock) as server:
        open_gate(root, server.base_url, extra)
        result = cli("ladder", "--json", "--vram-source", "metrics", *flags)
    assert result.code == 0, result.err
    return result


def _csv_rows(root: Path, run_id: str) -> list[dict[str, str]]:
    with (run_dir(root, run_id) / "tiers.csv").open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("counter", [True, False], ids=["dcgm-counter", "dcgm-power"])
def test_dcgm_mock_ladder_shows_joules_per_token_rising_with_power(
    cli: Any, isolated: Path, counter: bool
) -> None:
    per_tier: list[dict[int, float]] = []
    powers: list[dict[int, float]] = []
    for watts in (100.0, 400.0):
        result = _ladder(
            cli, isolated, power_w=watts, power_per_request_w=watts / 4, dcgm_energy=counter
        )
        source = "dcgm total energy" if counter else "dcgm power (integrated)"
        assert f"energy: {source}" in result.err
        tiers = result.json["tiers_detail"]
        assert [t["batch_size"] for t in tiers] == [1, 2, 4]
        for t in tiers:
            assert t["energy_source"] == source
            assert t["energy_j"] > 0 and t["joules_per_output_token"] > 0
            # the mock draws W + W/4 per request: mean power lies between idle and all-busy
            assert watts * 0.9 <= t["power_mean_w"] <= watts * 2.1
        rows = _csv_rows(isolated, result.json["run_id"])
        assert all(float(r["joules_per_output_token"]) > 0 for r in rows)
        assert "usd_per_1m_output_tokens" not in rows[0]  # no price given: no column
        per_tier.append({t["batch_size"]: t["joules_per_output_token"] for t in tiers})
        powers.append({t["batch_size"]: t["power_mean_w"] for t in tiers})
        report = cli("report", str(run_dir(isolated, result.json["run_id"])), "--no-plot")
        assert report.code == 0, report.err  # the table with energy columns reads back
        assert "J/tok" in report.out + report.err
    # J/token is power × seconds per token: 4× the power draws well over 2× the watts, and more
    # joules per token even when a busy box made the 100 W ladder's tiers the slower ones
    low, high = per_tier
    assert all(high[b] > low[b] for b in low), (low, high)
    assert all(powers[1][b] > 2 * powers[0][b] for b in low), powers


def test_the_fake_nvml_counter_gives_exact_joules_per_window() -> None:
    gpus = [FakeGpu("GPU-a", 1000, 80000, energy_mj=5_000_000), FakeGpu("GPU-b", 10, 80000)]
    gpus[1].energy_mj = 9_000_000
    sampler = NvmlSampler.open(nvml=FakeNvml(gpus))
    assert sampler is not None
    reader = energy_reader([sampler])
    assert reader is not None and reader.source == "nvml total energy"
    monitor = VramMonitor([sampler], energy=reader, price_per_hour=2.5)
    idle = monitor.open_window()
    gpus[0].energy_mj += 300_000  # 300 J on one device, 150 J on the other: 450 J in all
    gpus[1].energy_mj += 150_000
    peak = monitor.close_window(idle)
    assert peak.energy is not None
    assert peak.energy.joules == 450.0 and peak.energy.source == "nvml total energy"
    assert peak.price_per_hour == 2.5


def test_nvml_without_the_counter_integrates_power_and_without_either_is_none() -> None:
    powered = FakeNvml([FakeGpu("GPU-a", 1, 80000, power_mw=250_000)])
    sampler = NvmlSampler.open(nvml=powered)
    assert sampler is not None
    reader = energy_reader([sampler])
    assert reader is not None and reader.source == "nvml power (integrated)"
    sample = reader.read()
    assert sample is not None and sample.power_w == 250.0
    bare = NvmlSampler.open(nvml=FakeNvml([FakeGpu("GPU-a", 1, 80000)]))
    assert bare is not None and energy_reader([bare]) is None


def test_a_price_prints_usd_per_1m_output_tokens_at_the_setting_and_pin_writes_it(
    cli: Any, isolated: Path
) -> None:
    """The price per 1M output tokens at the setting: said, in the table, the report and the
    pinned script's header. (One ladder: pin's own test ran this one again.)"""
    result = _ladder(cli, isolated, "--gpu-price-per-hour", "2.5", extra=PINNED, power_w=200.0)
    tiers = result.json["tiers_detail"]
    setting = next(line for line in result.err.splitlines() if "setting: batch" in line)
    assert "per 1M output tokens" in setting and "J/output token" in setting
    for t in tiers:  # the formula, from the tier's own wall time and tokens
        tokens = t["output_tokens_per_s"] * t["total_s"]
        expected = 2.5 / 3600 * t["total_s"] / tokens * 1e6
        assert t["usd_per_1m_output_tokens"] == pytest.approx(expected, rel=0.01)
    rows = _csv_rows(isolated, result.json["run_id"])
    assert all(float(r["usd_per_1m_output_tokens"]) > 0 for r in rows)
    run = run_dir(isolated, result.json["run_id"])
    assert cli("report", str(run), "--html", "--no-plot").code == 0
    page = (run / "report.html").read_text("utf-8")
    assert "J/token" in page and "$ per 1M output tokens" in page  # the setting's tiles
    short = {t["batch_size"]: t for t in result.json["tiers"]}
    assert all("usd_per_1m_output_tokens" in t for t in short.values())
    pinned = cli("pin", "--kind", "vllm")
    assert pinned.code == 0, pinned.err
    header = [x for x in Path("scripts/launch.sh").read_text("utf-8").splitlines() if x[:1] == "#"]
    cost = next(x for x in header if x.startswith("# at this setting: "))
    assert "J/output token" in cost and "per 1M output tokens" in cost


def test_the_cost_section_prices_without_an_energy_source(cli: Any, isolated: Path) -> None:
    result = _ladder(cli, isolated, extra=f"{LADDER}[cost]\ngpu_price_per_hour = 4\n")
    tiers = result.json["tiers_detail"]
    assert all(t["usd_per_1m_output_tokens"] > 0 for t in tiers)
    assert all(k not in t for t in tiers for k in ENERGY)  # priced, but no energy measured
    assert "energy:" not in result.err


def test_no_energy_source_means_no_energy_columns_no_zeros_and_no_cost_line(
    cli: Any, isolated: Path
) -> None:
    """No energy source: no energy columns, no zeros, and pin writes no cost line. (One ladder:
    pin's own no-cost test ran the same one apart.)"""
    result = _ladder(cli, isolated, extra=PINNED)
    for t in result.json["tiers_detail"]:
        assert not {*ENERGY, "usd_per_1m_output_tokens", "energy_source"} & set(t)
    run = run_dir(isolated, result.json["run_id"])
    header = (run / "tiers.csv").read_text("utf-8").splitlines()[0].split(",")
    assert not {*ENERGY, "usd_per_1m_output_tokens"} & set(header)
    assert all("energy_j" not in row for row in jsonl(run / "tiers.jsonl"))
    assert "energy:" not in result.err and "J/output token" not in result.err
    assert "J/tok" not in result.out + result.err  # no column of dashes either
    assert cli("pin", "--kind", "vllm").code == 0
    assert "at this setting" not in Path("scripts/launch.sh").read_text("utf-8")


@pytest.mark.parametrize("price", ["-1", "nan", "inf", "-0.01"])
def test_a_bad_price_is_exit_2_before_anything_is_sent(
    cli: Any, isolated: Path, price: str
) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as server:
        open_gate(isolated, server.base_url, LADDER)
        for stage in ("ladder", "sweep"):
            result = cli(stage, f"--gpu-price-per-hour={price}")
            assert result.code == 2, result.err
            assert "--gpu-price-per-hour" in result.err and "Traceback" not in result.err
        sent = server.model.snapshot().requests_total
    assert sent == 0


@pytest.mark.parametrize("price", ["-2", "nan"])
def test_a_bad_cost_section_is_exit_2(cli: Any, isolated: Path, price: str) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as server:
        open_gate(isolated, server.base_url, LADDER)
        toml = isolated / "calibrate.toml"
        toml.write_text(toml.read_text("utf-8") + f"[cost]\ngpu_price_per_hour = {price}\n")
        result = cli("ladder")
    assert result.code == 2 and "gpu_price_per_hour" in result.err


def test_a_sweep_shows_energy_per_level_and_cost_at_the_recommendation(
    cli: Any, isolated: Path
) -> None:
    sweep = f"{FAST}[sweep]\nconcurrency = [1, 2, 4]\nlevel_s = 0.3\nrepeats = 1\n"
    with start_mock(
        ttft_s=0.01, per_token_s=0.002, slots=2, power_w=100.0, power_per_request_w=50.0
    ) as server:
        open_gate(isolated, server.base_url, sweep, stage="ladder")
        result = cli(
            "sweep", "--json", "--beyond-ladder", "--vram-source", "metrics",
            "--gpu-price-per-hour", "2.5",
        )  # fmt: skip
    assert result.code == 0, result.err
    levels = result.json["levels_detail"]
    assert [lv["concurrency"] for lv in levels] == [1, 2, 4]
    assert all(lv["joules_per_output_token"] > 0 and lv["energy_j"] > 0 for lv in levels)
    assert all(lv["usd_per_1m_output_tokens"] > 0 for lv in levels)
    line = next(x for x in result.err.splitlines() if "recommended" in x and "concurrency" in x)
    assert "J/output token" in line and "per 1M output tokens" in line
    short = result.json["levels"]
    assert all("joules_per_output_token" in lv for lv in short)


@pytest.mark.parametrize("flags", [["--power-w", "-5"], ["--power-per-request-w", "nan"]])
def test_a_bad_mock_power_is_exit_2(cli: Any, flags: list[str]) -> None:
    result = cli("mock", "--port", "0", *flags)
    assert result.code == 2 and "power" in result.err and "Traceback" not in result.err


def _tune_power(root: Path, extra: str = "") -> None:
    """The mock as the managed engine, its power draw the one axis tune searches."""
    command = shlex.join([*MOCK, "--slots", "2"]) + (
        " --port {port} --power-w {power} --power-per-request-w 10 --memory-fraction 0.5"
    )
    tune_config(root, 'grid = ["power=800,100"]\n' + extra, command=command, batch=2)


def test_tune_ranks_by_joules_per_token_when_asked(cli: Any, isolated: Path) -> None:
    _tune_power(isolated)
    result = cli(
        "tune", "--json", "--vram-source", "metrics", "--rank-by", "joules_per_token",
        "--gpu-price-per-hour", "3",
    )  # fmt: skip
    assert result.code == 0, result.err
    ranked = result.json["candidates"]
    assert [c["flags"]["power"] for c in ranked] == ["100", "800"]
    best = [c["best"] for c in ranked]
    assert best[0]["joules_per_output_token"] < best[1]["joules_per_output_token"] / 3
    assert all(b["usd_per_1m_output_tokens"] > 0 for b in best)
    assert "ranked by joules_per_token" in result.err
    run = isolated / "runs" / result.json["run_id"]
    header = (run / "tiers.csv").read_text("utf-8").splitlines()[0]
    assert "joules_per_output_token" in header and "usd_per_1m_output_tokens" in header


def test_tune_rank_by_usd_needs_a_price(cli: Any, isolated: Path) -> None:
    _tune_power(isolated)
    result = cli("tune", "--rank-by", "usd_per_1m")
    assert result.code == 2 and "--gpu-price-per-hour" in result.err


DCGM_TWO_GPUS = """# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-aaa"} 300.0
DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-bbb"} 100.0
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-aaa"} 7000
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="1",UUID="GPU-bbb"} 2000
"""


@pytest.mark.parametrize(
    ("devices", "watts", "mj"),
    [(None, 400.0, 9000.0), (["1"], 100.0, 2000.0), (["GPU-aaa"], 300.0, 7000.0)],
)
def test_a_dcgm_exporter_counts_only_the_servers_gpus(
    devices: list[str] | None, watts: float, mj: float
) -> None:
    sample = dcgm_sample(DCGM_TWO_GPUS, 1.0, devices)
    assert sample == EnergySample(1.0, mj, watts)
    assert dcgm_sample("vllm:num_requests_running 1\n", 1.0) is None


def test_power_is_integrated_and_a_counter_that_went_back_says_nothing() -> None:
    ramp = [EnergySample(0.0, None, 100.0), EnergySample(1.0, None, 300.0)]
    window = window_energy(ramp, "dcgm power (integrated)")
    assert window is not None and window.joules == 200.0 and window.seconds == 1.0
    reset = [EnergySample(0.0, 9000.0, None), EnergySample(1.0, 10.0, None)]
    assert window_energy(reset, "nvml total energy") is None
    assert window_energy(ramp[:1], "dcgm power (integrated)") is None
