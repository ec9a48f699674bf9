"""Helpers shared by the ladder, sweep, report and compare tests."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path
from typing import Any

from calibrate import config
from calibrate.stages.measure.tiers import Stats, summarise
from calibrate.state.ledger import Ledger, LedgerEntry, target_fingerprint
from tests.helpers import write_config

# Windows of the defaults (2 s rounds, a warm-up wave) would make every test take seconds: the
# shared test config runs one wave per round, no warm-up. The server's /metrics is read every
# 20 ms (the default is 50 ms): every 5 ms, as before, each running stage's scrapes (0.47 ms of
# CPU each, the mock's and the client's) took 15 % of the whole suite's CPU. A test about the
# sampling itself asks for its own interval (test_server_running_cap: 5 ms).
WINDOWS = "sample_interval_s = 0.02\nmin_round_s = 0\nwarmup_waves = 0\n"
# latency_rise = 100.0 switches the latency rule off. One wave of a few-ms mock answers is a
# round, and its time per item jitters by more than the default 1.25 on a loaded 2-core machine,
# so a test about anything else (a knee, a gate, a report) would stop at a random tier. The rule
# itself is tested at its real default: on scripted waves in tests/stages/ladder/test_fast.py and
# tests/stages/measure/test_stop_rules.py (milliseconds, no HTTP), and over HTTP with DEFAULT_RISE below (test_ladder's jump at batch 4).
# [confidence] conservative = true: one wave of a few-ms answer is a round too short to tell two
# tiers apart on a loaded 2-core machine, so a test about anything else would end inconclusive
# (exit 1) at random; it takes the conservative answer instead, as taken under noise. The rule
# itself is tested on scripted runs and the simulated server (tests/stages/verdict,
# tests/stages/sweep, tests/stages/ladder) and over HTTP with NOISE_RULE below.
# max_rounds = 2 (and a sweep's max_repeats where a test counts runs): the two rounds a tier,
# never more to tell it from another, so a test that counts requests counts the same each time.
CONSERVATIVE = "[confidence]\nconservative = true\n"
FAST = f"{CONSERVATIVE}[ladder]\n{WINDOWS}latency_rise = 100.0\nmax_rounds = 2\n"
NOISE_RULE = f"[ladder]\n{WINDOWS}latency_rise = 100.0\n"  # FAST with the noise rule on
DEFAULT_RISE = f"{CONSERVATIVE}[ladder]\n{WINDOWS}"
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


def stats_of(batch_size: int, concurrency: int, **fields: Any) -> Stats:
    """A level's or tier's stats with no items, and ``fields`` set as a test needs them."""
    empty = summarise(
        batch_size=batch_size,
        concurrency=concurrency,
        round_no=None,
        items=[],
        total_s=1.0,
        peaks=[],
        baseline_text=None,
    )
    return replace(empty, **fields)


def run_dir(root: Path, run_id: str) -> Path:
    return root / "runs" / run_id


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def junit_cases(path: Path) -> tuple[ET.Element, list[ET.Element]]:
    root = ET.parse(path).getroot()
    suite = root.find("testsuite")
    assert suite is not None
    return suite, suite.findall("testcase")


def setting_by_rule(run: Path, gain_min: float = 0.10, *, conservative: bool = True) -> int:
    """SPEC §5.3's setting recomputed from a ladder run's files — each tier's last line in
    tiers.jsonl (a tier run again is written again) and its rounds in rounds.jsonl — by the
    ladder's own rule (``stages.ladder.setting``); ``conservative`` as FAST configures it."""
    from dataclasses import replace

    from calibrate.stages.ladder.setting import setting_tier
    from calibrate.stages.measure.tier import Tier
    from tests.stage_fakes import CLEAN

    rows = {t["batch_size"]: t for t in jsonl(run / "tiers.jsonl")}
    rounds: dict[int, list[float]] = {b: [] for b in rows}
    for row in jsonl(run / "rounds.jsonl"):
        rounds[row["batch_size"]].append(row["items_per_s"])
    tiers = [
        Tier(
            replace(CLEAN, batch_size=b, items_per_s=row["items_per_s"]),
            tuple(replace(CLEAN, batch_size=b, items_per_s=r) for r in rounds[b]),
            row["verdict"],
            "",
            len(rounds[b]),
            client_bound=row.get("client_bound") or "",
        )
        for b, row in sorted(rows.items())
    ]
    chosen = setting_tier(tiers, gain_min, conservative=conservative)
    assert chosen is not None
    return chosen.batch_size


def assert_kept_or_client_bound(result: Any, where: str = "", *, rates: bool = False) -> None:
    """The sweep recommended a level (exit 0), or said the client was its limit at ``where``
    and that more processes (--workers) are what to do (exit 1): the two honest outcomes of a
    level the server kept up with — and, for ``rates``, a rate its runs could not call (the
    unsure interval, exit 1)."""
    said = " ".join(result.err.split())
    if result.code == 0:
        assert result.json["recommended_concurrency"] is not None, result.err
        assert "recommended " in said and not result.json["inconclusive"], result.err
        return
    assert result.code == 1, result.err
    why = result.json["inconclusive"] or ""
    if rates and why.startswith("inconclusive: the runs cannot tell whether "):
        assert " req/s keeps up: " in why and " — anywhere from " in why, result.err
        return
    _client_bound(result, f"at {where}")


def _client_bound(result: Any, where: str) -> None:
    """Exit 1, "inconclusive: the client was the limit ``where`` …", --workers in what to do."""
    assert result.code == 1, result.err
    why = result.json.get("inconclusive") or ""
    assert why.startswith(f"inconclusive: the client was the limit {where}"), result.err
    said = " ".join(result.err.split())
    assert "--workers" in said.partition("what to do: ")[2], result.err


def assert_ladder_ran(result: Any) -> None:
    """A ladder whose subject is not its verdict ended honestly: exit 0, or exit 1 saying the
    client was the limit (a starved machine: "inconclusive: the client was the limit from batch
    2 on") with more processes (--workers) in what to do — never another failure."""
    if result.code != 0:
        _client_bound(result, "from batch ")
