"""Where a target stands: each stage's latest result, the calibrated setting, the next command."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from calibrate.config import Config
from calibrate.stages.setting_reasons import measured_by, reasons
from calibrate.state.drift import DriftRecord, records_of
from calibrate.state.gates import next_step
from calibrate.state.ledger import (
    Ledger,
    LedgerEntry,
    baseline_path,
    target_fingerprint,
)
from calibrate.state.pipeline import MAIN_LINE, OPTIONAL, standing
from calibrate.state.setting import CalibratedSetting, resolve
from calibrate.state.summaries import PinSummary, pin_summary, tune_summary
from calibrate.state.summary_values import TunedSetting
from calibrate.state.weights_gate import setting_gate

STAGE_ORDER = MAIN_LINE
OPTIONAL_STAGES = OPTIONAL


@dataclass(frozen=True)
class TunedStatus:
    """The latest passing tune: its winner (None: no candidate met the SLOs) and its run."""

    run_id: str
    winner: TunedSetting | None
    complete: bool  # every candidate measured

    def to_json(self) -> dict[str, Any]:
        winner = self.winner.to_json() if self.winner else None
        return {"run_id": self.run_id, "winner": winner, "complete": self.complete}


@dataclass(frozen=True)
class TargetStatus:
    target: str
    baseline: str | None
    latest: dict[str, LedgerEntry]
    setting: CalibratedSetting | None
    pinned: PinSummary | None  # the latest pin, when it passed
    next_command: str
    context: LedgerEntry | None = None  # the latest ``ladder --axis context``
    tuned: TunedStatus | None = None
    production: LedgerEntry | None = None  # the latest batch that watched its drift
    other_weights: str = ""  # why the setting is not for the configured weights ("" when it is)
    came_from: Mapping[str, LedgerEntry] = field(default_factory=dict)  # ``measured_by``

    @property
    def stale(self) -> str:
        """Which of the calibrated setting and the pinned script is stale, and what to run
        ("" when they agree, or nothing was pinned); first, a setting measured on other weights
        than the configured ones (pin, verify and batch are gated on it)."""
        if self.other_weights:
            return (
                f"the calibrated setting is stale: {self.other_weights} — run {self.next_command}"
            )
        pinned = self.pinned.setting if self.pinned else None
        s = self.setting
        if pinned is None or s is None or s.set_by == "pin" or pinned == s.setting:
            return ""
        return (
            f"the pinned script ({self.pinned.script if self.pinned else ''}) says batch "
            f"{pinned.batch_size}, concurrency {pinned.concurrency}; the setting is now batch "
            f"{s.batch_size}, concurrency {s.concurrency} (from {s.set_by}): it is stale — "
            f"run {self.next_command}"
        )

    def tuned_text(self) -> str | None:
        """``c03 (parallel=4, ctx_size=2048) at concurrency 4, run …`` for the latest tune."""
        if self.tuned is None or self.tuned.winner is None:
            return None
        win = self.tuned.winner
        more = "" if self.tuned.complete else " (not every candidate measured)"
        return f"{win.describe()} at concurrency {win.concurrency} (tune run {self.tuned.run_id}){more}"

    @property
    def drift(self) -> tuple[DriftRecord, ...]:
        """The last production run's drift from the calibration, one record per endpoint."""
        return records_of(self.production.summary.get("drift")) if self.production else ()

    def drift_json(self) -> dict[str, Any] | None:
        if self.production is None:
            return None
        run = {"run_id": self.production.run_id, "ts": self.production.ts}
        return {**run, "endpoints": [r.to_json() for r in self.drift]}

    def to_json(self) -> dict[str, Any]:
        s = self.setting
        return {
            "target": self.target,
            "baseline": self.baseline,
            "stages": {
                name: {**entry.to_json(), "interrupted": was_interrupted(entry)}
                for name, entry in self.latest.items()
            },
            "last_passing": {"batch_size": s.batch_size} if s else None,
            "setting": s.to_json() if s else None,
            "workload": s.workload.to_json() if s else None,
            "pinned": self.pinned.to_json() if self.pinned else None,
            "context_ladder": self.context.to_json() if self.context else None,
            "verified_input_tokens": s.verified_input_tokens if s else None,
            "tuned": self.tuned.to_json() if self.tuned else None,
            "drift": self.drift_json(),
            "stale": self.stale or None,
            "why": list(why_lines(self)),
            "next": self.next_command,
        }


def status_of(cfg: Config) -> TargetStatus:
    """The configured target's status, from one read of its ledger."""
    return target_status(cfg, Ledger(cfg.runs_dir), target_fingerprint(cfg))


def target_status(cfg: Config, ledger: Ledger, target: str) -> TargetStatus:
    now = standing(ledger, target)
    latest = now.latest
    pin, tune = latest.get("pin"), latest.get("tune")
    tuned = None
    if tune is not None and tune.passed:
        summary = tune_summary(tune.summary)
        tuned = TunedStatus(tune.run_id, summary.winner, summary.complete)
    baseline = baseline_path(cfg)
    setting = resolve(ledger, target)
    return TargetStatus(
        target=target,
        baseline=str(baseline) if baseline.exists() else None,
        latest=latest,
        setting=setting,
        pinned=pin_summary(pin.summary) if pin and pin.passed else None,
        next_command=next_step(cfg, ledger, target),
        context=now.context,
        tuned=tuned,
        production=_production(ledger, target),
        other_weights=_other_weights(cfg, ledger, target),
        came_from=measured_by(ledger.view(), setting),
    )


def _other_weights(cfg: Config, ledger: Ledger, target: str) -> str:
    """Why the calibrated setting is not for the configured weights ("" when it is)."""
    gate = setting_gate(cfg, ledger, target)
    return "" if gate.open else gate.reason


def _production(ledger: Ledger, target: str) -> LedgerEntry | None:
    """The newest batch of ``target`` that recorded its drift (a --sample run records none)."""
    found = None
    for _, entry in ledger.view().of_target(target):
        if entry.stage == "batch" and records_of(entry.summary.get("drift")):
            found = entry
    return found


def verdict(entry: LedgerEntry) -> str:
    """``passed`` / ``interrupted`` / ``FAILED``: a stage stopped by Ctrl-C or SIGTERM did not fail.
    A verify or rollback that passed with a check it could not make says which, as the run did
    (``passed (not checked: the server's cap)``): a bare "passed" read surer than the run."""
    if entry.passed:
        unchecked = _unchecked(entry)
        return f"passed (not checked: {', '.join(unchecked)})" if unchecked else "passed"
    return "interrupted" if was_interrupted(entry) else "FAILED"


def was_interrupted(entry: LedgerEntry) -> bool:
    """Stopped by Ctrl-C or SIGTERM: the line's flag, or its summary's (a batch stopped by
    Ctrl-C records ``interrupted`` in its summary only: status called it FAILED)."""
    return entry.interrupted or entry.summary.get("interrupted") is True


# a rollback step that went through without proving its check, as the run's steps name it
UNCHECKED_STEPS = {"vram": "VRAM release", "restart": "the server's cap"}


def _unchecked(entry: LedgerEntry) -> list[str]:
    """What a passing verify or rollback recorded as not checked (none: everything was)."""
    summary = entry.summary
    if entry.stage == "verify":  # the answer was checked; the cap it runs at was not read
        known = summary.get("setting") is None or summary.get("server_cap") is not None
        return [] if known or "server_cap" not in summary else ["the server's cap"]
    if entry.stage != "rollback":
        return []
    steps = summary.get("steps")
    named = [s for s in steps if isinstance(s, dict)] if isinstance(steps, list) else []
    found = [str(s.get("step")) for s in named if s.get("unchecked")]
    return [UNCHECKED_STEPS.get(name, name) for name in found]


def why_lines(status: TargetStatus) -> tuple[str, ...]:
    """Why the setting is what it is, a line from the ladder and one from the sweep, as their
    ledger lines say it (``calibrate run``'s summary, status, the pinned script's header), and
    the tune's when its winner set it (a tune the setting no longer comes from says nothing)."""
    setting = status.setting
    tuned = setting is not None and setting.batch_from.startswith("tune")
    stages = ("ladder", "sweep", "tune") if tuned else ("ladder", "sweep")
    return (*reasons({**status.latest, **status.came_from}, stages), *_not_held(status))


def _not_held(status: TargetStatus) -> tuple[str, ...]:
    """A newer ladder or sweep than the one the setting came from that did not pass: the
    setting still stands on the older run, and nothing since has shown it holds."""
    lines = []
    for stage, came in status.came_from.items():
        newest = status.latest.get(stage)
        if newest is None or newest.passed or newest.run_id == came.run_id:
            continue
        how = "was interrupted" if newest.interrupted else "did not pass"
        lines.append(
            f"the newest {stage} (run {newest.run_id}) {how}: the setting is still {stage} run "
            f"{came.run_id}'s, which nothing since has confirmed — run calibrate {stage} again"
        )
    return tuple(lines)
