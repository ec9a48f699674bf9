"""Helpers shared by the ladder, sweep, report and compare tests."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from calibrate import config
from calibrate.state.ledger import Ledger, LedgerEntry, target_fingerprint
from tests.helpers import write_config

# Windows of the defaults (2 s rounds, a warm-up wave) would make every test take seconds: the
# shared test config runs one wave per round, no warm-up.
WINDOWS = "sample_interval_s = 0.005\nmin_round_s = 0\nwarmup_waves = 0\n"
# latency_rise = 100.0 switches the latency rule off. One wave of a few-ms mock answers is a
# round, and its time per item jitters by more than the default 1.25 on a loaded 2-core machine,
# so a test about anything else (a knee, a gate, a report) would stop at a random tier. The rule
# itself is tested at its real default: on scripted waves in tests/stages/ladder/test_fast.py and
# tests/stages/measure/test_stop_rules.py (milliseconds, no HTTP), and over HTTP with DEFAULT_RISE below (test_ladder's jump at batch 4).
FAST = f"[ladder]\n{WINDOWS}latency_rise = 100.0\n"
DEFAULT_RISE = f"[ladder]\n{WINDOWS}"
# the find-max tests' server: 4 slots, ~0.2 s a request (so about 20 req/s at most); above 4 in
# flight (or that rate) requests queue for a slot and TTFT jumps past 0.1 s
FOUR_SLOTS = ("--slots", "4", "--ttft", "0.01", "--per-token", "0.004")
PIN_SERVER = '[server]\nkind = "vllm"\nmodel_path = "/models/internlm-s2"\n'  # what pin needs


def open_gate(root: Path, base_url: str, extra: str = FAST, stage: str = "repro") -> str:
    """Write the config and a passing ``stage`` ledger line for its target (the gate opens)."""
    write_config(root / "calibrate.toml", base_url, extra)
    cfg = config.load(config.Overrides(config_path=str(root / "calibrate.toml")), {})
    target = target_fingerprint(cfg)
    # a wave-mode ladder that passed batch 4: 4 requests were in flight together
    summary: dict[str, Any] = {"last_passing": {"batch_size": 4, "concurrency": 4}}
    Ledger(root / "runs").append(LedgerEntry(stage, f"test-{stage}", target, True, summary))
    return target


def run_dir(root: Path, run_id: str) -> Path:
    return root / "runs" / run_id


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def junit_cases(path: Path) -> tuple[ET.Element, list[ET.Element]]:
    root = ET.parse(path).getroot()
    suite = root.find("testsuite")
    assert suite is not None
    return suite, suite.findall("testcase")


def setting_by_rule(run: Path, gain_min: float = 0.10) -> int:
    """SPEC §5.3's setting recomputed from a ladder run's files: of the kept tiers, the smallest
    batch whose rounds' items/s reach the fastest tier's slowest round, or within gain_min of it."""
    kept = {"pass", "stop: vram", "stop: latency"}
    tiers = {t["batch_size"]: t for t in jsonl(run / "tiers.jsonl") if t["verdict"] in kept}
    rates: dict[int, list[float]] = {b: [] for b in tiers}
    for row in jsonl(run / "rounds.jsonl"):
        if row["batch_size"] in rates:
            rates[row["batch_size"]].append(row["items_per_s"])
    best = max(tiers, key=lambda b: tiers[b]["items_per_s"])
    return min(
        b
        for b in tiers
        if max(rates[b]) >= min(rates[best])
        or tiers[b]["items_per_s"] >= tiers[best]["items_per_s"] * (1 - gain_min)
    )
