"""Where a target stands: each stage's latest result, the verified tier, the next command."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from calibrate.config import Config
from calibrate.ledger import Ledger, baseline_path
from calibrate.records import LedgerEntry
from calibrate.stages.active import current_setting

STAGE_ORDER = ("single", "repro", "ladder", "sweep", "pin", "verify")
OPTIONAL_STAGES = ("rollback", "batch")


@dataclass(frozen=True)
class TargetStatus:
    target: str
    baseline: str | None
    latest: dict[str, LedgerEntry]
    last_passing: dict[str, Any] | None
    pinned: dict[str, Any] | None
    recommended_concurrency: int | None
    next_command: str
    active: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "baseline": self.baseline,
            "stages": {name: entry.to_json() for name, entry in self.latest.items()},
            "last_passing": self.last_passing,
            "pinned": self.pinned,
            "recommended_concurrency": self.recommended_concurrency,
            "active": self.active,
            "next": self.next_command,
        }


def target_status(cfg: Config, ledger: Ledger, target: str) -> TargetStatus:
    latest: dict[str, LedgerEntry] = {}
    for entry in ledger.entries():
        if entry.target == target:
            latest[entry.stage] = entry
    ladder = ledger.latest("ladder", target, passed=True)
    last_passing = ladder.summary.get("last_passing") if ladder else None
    pin = ledger.latest("pin", target)
    sweep = ledger.latest("sweep", target, passed=True)
    recommended = sweep.summary.get("recommended_concurrency") if sweep else None
    baseline = baseline_path(cfg)
    active = current_setting(ledger, target)
    return TargetStatus(
        target=target,
        baseline=str(baseline) if baseline.exists() else None,
        latest=latest,
        last_passing=last_passing if isinstance(last_passing, dict) else None,
        pinned=pin.summary if pin else None,
        recommended_concurrency=recommended if isinstance(recommended, int) else None,
        next_command=_next_command(latest, baseline.exists()),
        active=active.summary() if active else None,
    )


def _next_command(latest: dict[str, LedgerEntry], has_baseline: bool) -> str:
    for stage in STAGE_ORDER:
        if stage == "sweep" and "sweep" not in latest and "pin" in latest:
            continue
        if stage == "verify" and "pin" in latest and "verify" not in latest:
            return "restart the server from scripts/launch.sh, then: calibrate verify"
        entry = latest.get(stage)
        if stage == "single" and entry is None and has_baseline:
            continue
        if entry is None or not entry.passed:
            if stage == "ladder" and entry is not None and entry.summary.get("last_passing"):
                continue
            return f"calibrate {stage}"
    return "calibrate batch --input tasks.jsonl --out out.jsonl"
