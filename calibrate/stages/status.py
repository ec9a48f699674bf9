"""Where a target stands: each stage's latest result, the calibrated setting, the next command."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from calibrate.config import Config
from calibrate.ledger import Ledger, baseline_path, check_gate
from calibrate.pipeline import MAIN_LINE, OPTIONAL, RESTART_THEN_VERIFY, next_after
from calibrate.records import LedgerEntry
from calibrate.setting import CalibratedSetting, resolve
from calibrate.summaries import ladder_summary, pin_summary, tune_summary

STAGE_ORDER = MAIN_LINE
OPTIONAL_STAGES = OPTIONAL


@dataclass(frozen=True)
class TargetStatus:
    target: str
    baseline: str | None
    latest: dict[str, LedgerEntry]
    setting: CalibratedSetting | None
    pinned: dict[str, Any] | None
    next_command: str
    context: LedgerEntry | None = None  # the latest ``ladder --axis context``
    tuned: dict[str, Any] | None = None  # the latest passing tune's winner and run

    def tuned_text(self) -> str | None:
        """``c03 (parallel=4, ctx_size=2048) at concurrency 4, run …`` for the latest tune."""
        if not self.tuned or not self.tuned.get("winner"):
            return None
        win = self.tuned["winner"]
        flags = ", ".join(f"{k}={v}" for k, v in win["flags"].items())
        more = "" if self.tuned.get("complete") else " (not every candidate measured)"
        return (
            f"{flags} at concurrency {win['concurrency']} (tune run {self.tuned['run_id']}){more}"
        )

    def to_json(self) -> dict[str, Any]:
        s = self.setting
        return {
            "target": self.target,
            "baseline": self.baseline,
            "stages": {name: entry.to_json() for name, entry in self.latest.items()},
            "last_passing": {"batch_size": s.batch_size} if s else None,
            "setting": s.to_json() if s else None,
            "workload": s.workload.to_json() if s else None,
            "pinned": self.pinned,
            "context_ladder": self.context.to_json() if self.context else None,
            "verified_input_tokens": s.verified_input_tokens if s else None,
            "tuned": self.tuned,
            "next": self.next_command,
        }


def target_status(cfg: Config, ledger: Ledger, target: str) -> TargetStatus:
    latest: dict[str, LedgerEntry] = {}
    context: LedgerEntry | None = None
    for entry in ledger.entries():
        if entry.target != target:
            continue
        if entry.stage == "ladder" and ladder_summary(entry.summary).is_context:
            context = entry  # verifies input lengths, not the ladder the main line needs
        else:
            latest[entry.stage] = entry
    pin = latest.get("pin")
    tune = latest.get("tune")
    tuned = None
    if tune is not None and tune.passed:
        summary = tune_summary(tune.summary)
        winner = summary.winner.to_json() if summary.winner else None
        tuned = {"run_id": tune.run_id, "winner": winner, "complete": summary.complete}
    baseline = baseline_path(cfg)
    return TargetStatus(
        target=target,
        baseline=str(baseline) if baseline.exists() else None,
        latest=latest,
        setting=resolve(ledger, target),
        pinned=pin_summary(pin.summary).to_json() if pin and pin.passed else None,
        next_command=next_command(cfg, ledger, target, latest),
        context=context,
        tuned=tuned,
    )


def next_command(cfg: Config, ledger: Ledger, target: str, latest: dict[str, LedgerEntry]) -> str:
    """The first stage of the main line still to do, read from the pipeline table and gates."""
    has_baseline = baseline_path(cfg).exists()
    for stage in MAIN_LINE:
        entry = latest.get(stage)
        if stage == "single" and (entry is None or not entry.passed) and has_baseline:
            continue  # a baseline exists: single has done its job
        if stage == "sweep" and entry is None and "pin" in latest:
            continue  # pinned without a sweep: concurrency 1, a choice the user made
        if stage == "verify" and entry is None and "pin" in latest:
            return RESTART_THEN_VERIFY
        if entry is None or not entry.passed:
            gate = check_gate(stage, cfg, ledger, target)
            return f"calibrate {stage}" if gate.open else gate.run_first
    return next_after("verify")
