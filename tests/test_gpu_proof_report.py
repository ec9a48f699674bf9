"""scripts/gpu_proof_report.py on a small work folder: a real ladder against the mock, its
tiers.jsonl read back into the summary's tier table (the columns the tiers actually carry)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.mockserver import start_mock
from tests.tier_helpers import FAST, jsonl, open_gate, run_dir

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_proof_report.py"


def _report(work: Path) -> tuple[int, list[str]]:
    out = work / "summary.md"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--work", str(work), "--out", str(out), "--dry", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stderr == "", done.stderr
    lines = out.read_text("utf-8").splitlines()
    start = lines.index("## Ladder tiers")
    return done.returncode, [line for line in lines[start:] if line.startswith("| ")]


def test_the_tier_table_shows_each_tiers_per_item_time_and_vram(cli, isolated: Path) -> None:
    with start_mock(
        ttft_s=0.002,
        per_token_s=0.001,
        vram_total_mib=20000,
        vram_base_mib=5000,
        vram_per_request_mib=1000,
    ) as mock:
        open_gate(isolated, mock.base_url, FAST + "batch_sizes = [1, 2, 4]\n")
        result = cli("ladder", "--json")
    assert result.code == 0, result.err
    (isolated / "ladder.json").write_text(result.out, "utf-8")
    (isolated / "steps.tsv").write_text("4c\tladder\tpass\t\t3\n", "utf-8")
    tiers = jsonl(run_dir(isolated, result.json["run_id"]) / "tiers.jsonl")
    assert [t["batch_size"] for t in tiers] == [1, 2, 4]

    _code, table = _report(isolated)
    assert table[0].split(" | ")[3] == "per item s"
    rows = [[cell.strip() for cell in row.strip("|").split("|")] for row in table[1:]]
    assert [r[0] for r in rows] == ["1", "2", "4"]
    for row, tier in zip(rows, tiers, strict=True):
        assert row[3] == format(tier["per_item_s"], ".3f"), row  # was "–" on every row
        assert row[4] == format(tier["peak_vram_mib"], ".0f") and row[4] != "–"
        assert float(row[3]) > 0


def test_a_tier_without_a_figure_shows_a_dash(isolated: Path) -> None:
    run = isolated / "runs" / "r1"
    run.mkdir(parents=True)
    (isolated / "ladder.json").write_text(json.dumps({"run_id": "r1"}), "utf-8")
    (isolated / "steps.tsv").write_text("", "utf-8")
    tier = {"batch_size": 1, "verdict": "fail", "items_per_s": 0.0, "per_item_s": None}
    (run / "tiers.jsonl").write_text(json.dumps(tier) + "\n", "utf-8")
    code, table = _report(isolated)
    assert code == 1  # the steps did not run: the proof fails, and says so
    assert [c.strip() for c in table[1].strip("|").split("|")][:5] == [
        "1",
        "fail",
        "0.00",
        "–",
        "–",
    ]
