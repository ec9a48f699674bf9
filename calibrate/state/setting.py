"""The one answer to "what is the calibrated setting now, and which run set it" (SPEC §4.2).

Precedence, written down once: walk the target's ledger lines in order and keep the newest of
- a **rollback** that reached its "active" step: batch B = the tier it returned to (measured by
  the ladder or pin run the rollback names as its source), concurrency 1;
- a **pin**: the batch size and concurrency it wrote into the launch script, still from the
  runs that measured them (a pin measures nothing: pinned again, the header names them);
- a passing **tune**: B = its winner's cap, C = the concurrency it did best at, and every engine
  flag the winner ran with (``tuned``: pin writes them all; a pin after a tune keeps them);
- a passing **ladder**: batch B = its last passing tier, concurrency 1 — raised by a later passing
  **sweep** that ran at that ladder's batch size to its recommended concurrency, and kept at the
  concurrency of an earlier passing sweep that ran at the same B on the same workload (a ladder
  run again that lands where it was does not undo the sweep: one concurrency everywhere).
A failed or interrupted ladder/sweep never sets anything (its partial tiers are for ``report``).
A **context-axis** ladder never sets the batch size: the latest passing one only records the
longest input verified (``verified_input_tokens``), shown by ``status`` and written by ``pin``.
``pin``, ``batch``, ``status``, ``server start``, ``rollback`` and ``verify`` all call ``resolve``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from calibrate.redact import redact_url
from calibrate.state.ledger import Ledger, LedgerEntry, is_context_ladder
from calibrate.state.summaries import (
    LadderSummary,
    SweepSummary,
    ladder_summary,
    pin_summary,
    rollback_summary,
    sweep_summary,
    tune_summary,
)
from calibrate.state.summary_values import Setting, Workload

SetBy = Literal["ladder", "sweep", "pin", "rollback", "tune"]


@dataclass(frozen=True)
class CalibratedSetting:
    """Where the server should run now, and why."""

    batch_size: int
    concurrency: int
    set_by: SetBy
    run_id: str
    ts: str
    batch_from: str  # e.g. "ladder run 2026…-ladder-ab12cd"
    concurrency_from: str
    workload: Workload
    verified_input_tokens: int | None = None  # the latest passing context ladder's
    context_from: str = ""
    tuned: tuple[tuple[str, str], ...] = ()  # the engine flags of a tune winner (or its pin)
    tuned_by: str = ""  # "tune run <id>" that chose them

    @property
    def measured_concurrency(self) -> bool:
        """The concurrency was measured (a sweep, tune, pin or rollback set it), not the
        ladder's default of 1 with no sweep at its batch size."""
        return not self.concurrency_from.startswith("default")

    @property
    def setting(self) -> Setting:
        return Setting(self.batch_size, self.concurrency)

    def describe(self) -> str:
        return f"batch {self.batch_size}, concurrency {self.concurrency} (from {self.set_by})"

    def verified_on(self) -> str:
        """The workload, and the input length a context ladder verified (status, pin)."""
        text = self.workload.describe()
        if self.verified_input_tokens:
            tokens = self.verified_input_tokens
            text += f"; inputs verified up to {tokens:,} tokens ({self.context_from})"
        return text

    def to_json(self) -> dict[str, object]:
        return {
            "batch_size": self.batch_size,
            "concurrency": self.concurrency,
            "source": self.set_by,
            "run_id": self.run_id,
            "ts": self.ts,
            "batch_from": self.batch_from,
            "concurrency_from": self.concurrency_from,
            "workload": self.workload.to_json(),
            "verified_input_tokens": self.verified_input_tokens,
            "context_from": self.context_from or None,
            "tuned_flags": dict(self.tuned),
            "tuned_by": self.tuned_by or None,
        }


def resolve(ledger: Ledger, target: str) -> CalibratedSetting | None:
    """The calibrated setting for ``target`` now, or None when nothing has set one."""
    found: CalibratedSetting | None = None
    ladder: tuple[LadderSummary, LedgerEntry] | None = None
    context: tuple[LadderSummary, LedgerEntry] | None = None
    swept: dict[int, tuple[SweepSummary, LedgerEntry]] = {}  # the latest passing sweep per B
    for _, entry in ledger.view().of_target(target):
        if is_context_ladder(entry):
            if _sets(entry) and ladder_summary(entry.summary).context_verified:
                context = (ladder_summary(entry.summary), entry)
            continue
        found, ladder = _apply(entry, found, ladder, swept)
        if found is not None and found.set_by == "sweep" and found.run_id == entry.run_id:
            swept[found.batch_size] = (sweep_summary(entry.summary), entry)
    if found is not None and context is not None:
        found = replace(
            found,
            verified_input_tokens=context[0].context_verified,
            context_from=f"ladder --axis context run {context[1].run_id}",
        )
    return found


@dataclass(frozen=True)
class VerifiedInput:
    """The longest input any passing ladder of the target sent, and how it was counted."""

    tokens: int
    tokens_per_char: float | None
    run_id: str


def verified_input(ledger: Ledger, target: str) -> VerifiedInput | None:
    """For ``batch``'s length check: over every passing ladder (either axis), the longest
    input verified (None when no ladder recorded one)."""
    best: VerifiedInput | None = None
    for _, entry in ledger.view().of_target(target):
        if entry.stage != "ladder" or not _sets(entry):
            continue
        workload = ladder_summary(entry.summary).workload
        tokens = workload.longest_input_tokens
        if tokens and (best is None or tokens >= best.tokens):
            best = VerifiedInput(tokens, workload.tokens_per_char, entry.run_id)
    return best


def latest_passing_ladder(ledger: Ledger, target: str) -> tuple[LadderSummary, LedgerEntry] | None:
    """The newest passing ladder with a passing tier (what sweep, pin and rollback build on)."""
    found: tuple[LadderSummary, LedgerEntry] | None = None
    for _, entry in ledger.view().of_target(target):
        if entry.stage == "ladder" and _sets(entry) and not is_context_ladder(entry):
            summary = ladder_summary(entry.summary)
            if summary.last_passing is not None:
                found = (summary, entry)
    return found


@dataclass(frozen=True)
class RollbackTier:
    """Where a rollback returns the server, and which run measured it."""

    batch_size: int
    source: str  # "ladder run <id>" or "pin run <id>"


def rollback_tier(ledger: Ledger, target: str) -> RollbackTier | None:
    """The tier a rollback returns to (SPEC §5.7): the latest passing ladder's last passing
    tier, else the latest passing pin's batch size. None: neither, and the rollback gate is
    closed — the gate and the stage read this one answer."""
    ladder = latest_passing_ladder(ledger, target)
    if ladder is not None and ladder[0].last_passing is not None:
        return RollbackTier(ladder[0].last_passing.batch_size, f"ladder run {ladder[1].run_id}")
    pin = ledger.latest("pin", target, passed=True)
    pinned = pin_summary(pin.summary).setting if pin is not None else None
    if pin is not None and pinned is not None:
        return RollbackTier(pinned.batch_size, f"pin run {pin.run_id}")
    return None


def _sets(entry: LedgerEntry) -> bool:
    return entry.passed and not entry.interrupted


def _held(swept: dict[int, tuple[SweepSummary, LedgerEntry]] | None, at: int, w: Workload) -> str:
    """``sweep run S1 (at batch 4, the same workload)``: the passing sweep whose concurrency
    still holds at batch ``at`` on workload ``w`` ("" when none does)."""
    held = (swept or {}).get(at)

    def key(w: Workload) -> tuple[object, ...]:
        return (w.source, w.tasks, w.pick, w.input_tokens, w.output_tokens, w.shared_prefix)

    if held is None or key(held[0].workload) != key(w) or not held[0].recommended_concurrency:
        return ""
    return f"sweep run {held[1].run_id} (at batch {at}, the same workload)"


def _apply(
    entry: LedgerEntry,
    found: CalibratedSetting | None,
    ladder: tuple[LadderSummary, LedgerEntry] | None,
    swept: dict[int, tuple[SweepSummary, LedgerEntry]] | None = None,
) -> tuple[CalibratedSetting | None, tuple[LadderSummary, LedgerEntry] | None]:
    """One step of the walk: the setting after ``entry`` (and the ladder in force); ``swept``:
    the latest passing sweep at each batch size so far."""
    where = f"{entry.stage} run {entry.run_id}"
    if entry.stage == "ladder" and _sets(entry):
        summary = ladder_summary(entry.summary)
        top = summary.last_passing
        if top is None:
            return found, ladder
        came = _held(swept, top.batch_size, summary.workload)  # a sweep there still holds
        unit = CalibratedSetting(
            top.batch_size,
            (swept or {})[top.batch_size][0].recommended_concurrency or 1 if came else 1,
            "ladder",
            entry.run_id,
            entry.ts,
            where,
            came or "default 1 (no sweep has passed at this batch size)",
            summary.workload,
        )
        return unit, (summary, entry)
    if entry.stage == "sweep" and _sets(entry) and ladder is not None:
        sweep = sweep_summary(entry.summary)
        ladder_sum, ladder_entry = ladder
        top = ladder_sum.last_passing
        same_ladder = not sweep.ladder_run_id or sweep.ladder_run_id == ladder_entry.run_id
        if top is None or sweep.recommended_concurrency is None or not same_ladder:
            return found, ladder
        if sweep.batch_size and sweep.batch_size != top.batch_size:
            return found, ladder
        return CalibratedSetting(
            top.batch_size,
            sweep.recommended_concurrency,
            "sweep",
            entry.run_id,
            entry.ts,
            f"ladder run {ladder_entry.run_id}",
            where,
            ladder_sum.workload,
        ), ladder
    if entry.stage == "tune" and _sets(entry):
        winner = tune_summary(entry.summary).winner
        if winner is None:
            return found, ladder
        workload = ladder[0].workload if ladder else found.workload if found else Workload()
        return CalibratedSetting(
            winner.batch_size,
            winner.concurrency,
            "tune",
            entry.run_id,
            entry.ts,
            f"{where} (the winner's cap)",
            f"{where} (the winner's best concurrency)",
            workload,
            tuned=winner.flags,
            tuned_by=where,
        ), ladder
    if entry.stage == "pin" and entry.passed:
        pinned = pin_summary(entry.summary)
        if pinned.setting is None:
            return found, ladder
        workload = found.workload if found else ladder[0].workload if ladder else Workload()
        return CalibratedSetting(
            pinned.setting.batch_size,
            pinned.setting.concurrency,
            "pin",
            entry.run_id,
            entry.ts,
            pinned.verified_by or where,  # a pin measures nothing: the runs it pinned did
            pinned.concurrency_from or where,
            workload,
            tuned=pinned.tuned,
            tuned_by=str(pinned.details.get("tuned_by") or "") if pinned.tuned else "",
        ), ladder
    if entry.stage in ("rollback", "active"):
        # "active" is the line older versions wrote beside a rollback; read it the same way.
        setting = rollback_summary(entry.summary).setting
        if setting is None and entry.stage == "active":
            setting = Setting.from_json(entry.summary)
        if setting is None:
            return found, ladder
        workload = found.workload if found else Workload()
        # a rollback measures no batch size: it returns to the one its source run verified
        source = entry.summary.get("source")
        measured = (
            f"{source} (returned to by {where})" if source and isinstance(source, str) else where
        )
        return CalibratedSetting(
            setting.batch_size,
            setting.concurrency,
            "rollback",
            entry.run_id,
            entry.ts,
            measured,
            f"{where} (rollback always restarts at concurrency 1)",
            workload,
        ), ladder
    return found, ladder


@dataclass(frozen=True)
class Endpoint:
    """One server of the batch: where, and how many requests in flight there."""

    base_url: str
    concurrency: int
    concurrency_source: str  # "URL#c=N", "flag", a calibrated setting's stage, "default"

    @property
    def label(self) -> str:
        return redact_url(self.base_url)
