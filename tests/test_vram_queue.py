"""Per-device peaks and the server's queue through windows, tiers, tables and the run's notes."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from rich.console import Console

from calibrate.gpu.reading import DeviceMemory, VramReading
from calibrate.gpu.vram import VramMonitor
from calibrate.io import tier_table
from calibrate.io.tier_table.cells import row_from_cells
from calibrate.report.tables import tiers as report
from calibrate.stages.measure.tiers import summarise
from calibrate.stages.server_account.queue_note import queue_note
from tests.mockserver import start_mock
from tests.tier_helpers import FAST, jsonl, open_gate, run_dir


class Scripted:
    """A metrics-like source that answers the readings it was given, one per read."""

    source = "metrics"

    def __init__(self, readings: list[VramReading]) -> None:
        self.readings = readings

    def read(self) -> VramReading | None:
        return self.readings.pop(0) if self.readings else None

    def close(self) -> None:
        pass


def gpus(a: float, b: float, queue: float | None) -> VramReading:
    return VramReading(
        "metrics",
        (DeviceMemory("0", a, 1000.0), DeviceMemory("1", b, 1000.0)),
        device_metric="DCGM_FI_DEV_FB_USED",
        server_queue=queue,
        queue_metric="vllm:num_requests_waiting" if queue is not None else None,
    )


def test_queue_note_explains_a_knee_only_when_the_server_queued() -> None:
    assert queue_note(12, 16) == (
        "the server queued up to 12 requests at concurrency 16: its cap is below 16 in flight"
    )
    assert queue_note(1, 2) == (
        "the server queued up to 1 request at concurrency 2: its cap is below 2 in flight"
    )
    assert queue_note(0, 16) is None and queue_note(None, 16) is None


def test_a_window_keeps_each_devices_peak_and_the_deepest_queue() -> None:
    monitor = VramMonitor(
        [Scripted([gpus(100, 500, 0), gpus(950, 200, 3), gpus(300, 600, 1), gpus(100, 500, 0)])]
    )
    idle = monitor.open_window()
    monitor.sample()
    monitor.sample()
    peak = monitor.close_window(idle)
    assert peak.devices == (DeviceMemory("0", 950, 1000), DeviceMemory("1", 600, 1000))
    assert peak.server_queue_max == 3 and peak.samples == 4
    assert peak.peak_pressure.value == 0.95
    assert peak.peak_pressure.text == "metrics: DCGM_FI_DEV_FB_USED (device 0)"
    # the same two rounds summed into a tier: devices, queue and pressure named per row
    other = VramMonitor([Scripted([gpus(100, 990, 5), gpus(100, 100, 0)])])
    second = other.close_window(other.open_window())
    tier = summarise(
        batch_size=8,
        concurrency=8,
        round_no=None,
        items=[],
        total_s=1.0,
        peaks=[peak, second],
        baseline_text=None,
    )
    assert tier.server_queue_max == 5
    assert tier.per_device == (DeviceMemory("0", 950, 1000), DeviceMemory("1", 990, 1000))
    assert (
        tier.pressure == 0.99 and tier.pressure_metric == "metrics: DCGM_FI_DEV_FB_USED (device 1)"
    )
    row = tier.to_json()
    assert row["per_device"][1] == {
        "device": "1",
        "used_mib": 990.0,
        "total_mib": 1000.0,
        "pressure": 0.99,
    }
    json.dumps(row)  # tiers.jsonl can hold it


def test_no_queue_gauge_records_null_not_zero() -> None:
    monitor = VramMonitor([Scripted([gpus(1, 1, None), gpus(1, 1, None)])])
    peak = monitor.close_window(monitor.open_window())
    assert peak.server_queue_max is None
    stats = summarise(
        batch_size=1,
        concurrency=1,
        round_no=1,
        items=[],
        total_s=1.0,
        peaks=[peak],
        baseline_text=None,
    )
    assert stats.to_json()["server_queue_max"] is None


def test_queue_column_shows_and_is_dropped_before_the_main_ones(tmp_path: Path) -> None:
    row = {
        "batch_size": 16,
        "concurrency": 16,
        "rounds": 2,
        "items": 32,
        "errors": 0,
        "verdict": "pass",
        "server_queue_max": 12,
        "pressure": 0.5,
        "pressure_source": "nvml",
        "per_device": [{"device": "0", "used_mib": 1.0, "total_mib": 2.0, "pressure": 0.5}],
    }
    csv_path = tier_table.write_tiers_csv(
        tmp_path / "tiers.csv", [row_from_cells(row)], "ladder", "nvml"
    )
    with csv_path.open(newline="", encoding="utf-8") as handle:
        written = next(csv.DictReader(handle))
    assert written["server_queue_max"] == "12"
    assert json.loads(written["per_device"])[0]["pressure"] == 0.5
    back = tier_table.read_table(csv_path).rows
    wide = Console(width=300, record=True, file=io.StringIO())
    wide.print(report.tier_table(back, "ladder", width=300, wide=True))
    text = wide.export_text()
    assert "queue" in text and " 12  " in text
    narrow = report.tier_table(back, "ladder", width=80)
    assert "queue" not in [c.header for c in narrow.columns]


def test_a_ladder_past_the_servers_slots_records_and_explains_the_queue(
    cli, isolated: Path
) -> None:
    # 2 slots: at batch 4 two requests wait in the mock's queue (its vllm:num_requests_waiting)
    config = FAST.replace("[ladder]\n", "[ladder]\nbatch_sizes = [1, 4]\nrounds = 1\n")
    with start_mock(ttft_s=0.15, per_token_s=0.0005, slots=2) as mock:
        open_gate(isolated, mock.base_url, config)
        result = cli("ladder", "--json")
    assert result.code == 0, result.err
    tiers = result.json["tiers_detail"]
    # the queue is sampled: one taken before the fourth request arrived reads 1 waiting, so the
    # tier's figure is whatever its samples saw beyond the cap (1 or 2), the same on every record
    queued = tiers[1]["server_queue_max"]
    assert tiers[0]["server_queue_max"] == 0 and queued in (1, 2), tiers
    assert tiers[1]["per_device"][0]["device"] == "0"
    assert tiers[1]["pressure_metric"] == "metrics: mock_vram_used_bytes"
    assert "server queue: vllm:num_requests_waiting" in result.err
    err = " ".join(result.err.split())
    assert "running: vllm:num_requests_running" in err
    # the mock's running gauge held at its 2 slots while 2 waited: the server's cap is 2
    assert [t["verdict"] for t in tiers] == ["pass", "stop: cap"]
    assert [t["server_running_max"] for t in tiers] == [1, 2]
    assert (
        f"the server queued up to {queued} request{'s' if queued > 1 else ''} at concurrency 4 while it ran 2 at once "
        "(vllm:num_requests_running): its cap is 2, below 4 in flight" in err
    )
    run = run_dir(isolated, result.json["run_id"])
    assert [t["server_queue_max"] for t in jsonl(run / "tiers.jsonl")] == [0, queued]
    with (run / "tiers.csv").open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["server_queue_max"] for r in rows] == ["0", str(queued)]
    assert json.loads(rows[1]["per_device"])[0]["total_mib"] > 0
