"""The active setting: what the server should run at now (batch size, concurrency, why).

``rollback`` writes it (concurrency 1, the last passing batch size) as a ledger entry of stage
``"active"`` with summary ``{"batch_size", "concurrency", "source"}``, and mirrors it to
``runs/active.json`` for people and scripts. ``pin``, ``batch``, ``status`` and
``server start`` read it through ``current_setting``; a later ``pin`` supersedes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibrate.ledger import Ledger
from calibrate.records import LedgerEntry
from calibrate.store import write_json_atomic

ACTIVE_STAGE = "active"


def active_path(runs_dir: Path) -> Path:
    return runs_dir / "active.json"


@dataclass(frozen=True)
class ActiveSetting:
    batch_size: int
    concurrency: int
    source: str  # "rollback" or "pin"
    run_id: str = ""
    ts: str = ""

    def summary(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "concurrency": self.concurrency,
            "source": self.source,
        }


def write_active(
    ledger: Ledger, runs_dir: Path, target: str, setting: ActiveSetting
) -> LedgerEntry:
    """Record the setting in the ledger (the source of truth) and in runs/active.json."""
    entry = LedgerEntry(ACTIVE_STAGE, setting.run_id, target, True, setting.summary())
    ledger.append(entry)
    write_json_atomic(active_path(runs_dir), {**entry.to_json()})
    return entry


def _int(summary: dict[str, Any], key: str) -> int | None:
    value = summary.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def current_setting(ledger: Ledger, target: str) -> ActiveSetting | None:
    """The newest of: the active setting a rollback wrote, or what pin pinned."""
    found: ActiveSetting | None = None
    for entry in ledger.entries():
        if entry.target != target or entry.stage not in (ACTIVE_STAGE, "pin"):
            continue
        batch, conc = _int(entry.summary, "batch_size"), _int(entry.summary, "concurrency")
        if batch and conc:
            source = str(entry.summary.get("source") or entry.stage)
            found = ActiveSetting(batch, conc, source, entry.run_id, entry.ts)
    return found


def verified_batch(ledger: Ledger, target: str) -> tuple[int, LedgerEntry] | None:
    """The last passing ladder tier's batch size, or a rollback's active setting if newer."""
    found: tuple[int, LedgerEntry] | None = None
    for entry in ledger.entries():
        if entry.target != target:
            continue
        if entry.stage == "ladder" and entry.passed:
            tier = entry.summary.get("last_passing")
            batch = _int(tier, "batch_size") if isinstance(tier, dict) else None
            if batch:
                found = (batch, entry)
        elif entry.stage == ACTIVE_STAGE and (batch := _int(entry.summary, "batch_size")):
            found = (batch, entry)
    return found
