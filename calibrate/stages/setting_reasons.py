"""Why a calibrated setting is what it is, from the ledger: the ladder, sweep or tune runs its
numbers came from (``measured_by``; the run a line names, ``named_run``) and what their lines
say of it (``reasons``: the ladder's reason, the sweep's knee and how sure it is, a winner taken
under noise). ``status``, ``calibrate run``'s summary and the pinned script's header say it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from calibrate.state.ledger import LedgerEntry, LedgerView
from calibrate.state.setting import CalibratedSetting


def measured_by(view: LedgerView, setting: CalibratedSetting | None) -> dict[str, LedgerEntry]:
    """The ledger lines of the ladder, sweep or tune runs the setting's numbers came from, by
    stage (a rollback's: the run it returned to): how sure *they* were is how sure the setting
    is — a later run of the same stage that set nothing (inconclusive, failed) says nothing of
    it."""
    found: dict[str, LedgerEntry] = {}
    for named in (setting.batch_from, setting.concurrency_from) if setting else ():
        entry = named_run(view, named)
        if entry is not None and entry.stage == "rollback":
            entry = named_run(view, str(entry.summary.get("source") or ""))
        if entry is not None and entry.stage in ("ladder", "sweep", "tune"):
            found.setdefault(entry.stage, entry)
    return found


def named_run(view: LedgerView, named: str) -> LedgerEntry | None:
    """The line of the run ``named`` names ("sweep run <id> (at batch 4, …)"); None: none."""
    stage, _, rest = named.partition(" run ")
    entry = view.of_run(rest.split(" ")[0]) if rest else None
    return entry if entry is not None and entry.stage == stage else None


def reasons(
    latest: Mapping[str, LedgerEntry], stages: tuple[str, ...] = ("ladder", "sweep")
) -> tuple[str, ...]:
    """``ladder: …``, ``sweep: knee at 4 (+99 % over 2) — not sure`` and a tune's winner taken
    under noise from the latest lines of ``stages``."""
    lines = []
    ladder, sweep = (
        latest.get(stage) if stage in stages else None for stage in ("ladder", "sweep")
    )
    if ladder is not None and ladder.passed:
        reason = ladder.summary.get("setting_reason")
        lines.append(f"ladder: {reason}" if isinstance(reason, str) and reason else "")
    if sweep is not None and sweep.passed:
        lines.append(f"sweep: {_sweep_reason(sweep.summary)}")
    tune = latest.get("tune") if "tune" in stages else None
    if tune is not None and tune.passed:
        lines.append(_tune_reason(tune.summary))
    return tuple(line for line in lines if line)


def _tune_reason(summary: dict[str, Any]) -> str:
    """``tune: c01 (…), taken under noise (--conservative) — <the cause>`` ("" for a winner
    its runs backed)."""
    noise = summary.get("under_noise")
    if not isinstance(noise, dict) or noise.get("taken_under_noise") is not True:
        return ""
    taken = noise.get("conservative")
    cause = noise.get("cause")
    head = (
        f"tune: {taken}, taken under noise" if isinstance(taken, str) else "tune: taken under noise"
    )
    return f"{head} (--conservative)" + (f" — {cause}" if isinstance(cause, str) and cause else "")


def _sweep_reason(summary: dict[str, Any]) -> str:
    """The knee and how sure it is; a rate sweep's recommendation; else the concurrency — and
    whether it was the conservative answer taken under noise (the sweep said so; a read-back
    that drops it presents a doubtful setting as settled)."""
    return _said(summary) + _under_noise(summary)


def _said(summary: dict[str, Any]) -> str:
    knee = summary.get("knee")
    if isinstance(knee, dict) and isinstance(knee.get("how_sure"), str) and knee["how_sure"]:
        first = str(knee["how_sure"]).split("; ", 1)[0]  # "knee at 4 (+99 % over 2)"
        return f"{first} — {'sure' if knee.get('sure') is True else 'not sure'}"
    recommendation = summary.get("recommendation")
    if isinstance(recommendation, str) and recommendation:
        return recommendation
    concurrency = summary.get("recommended_concurrency")
    return f"recommended concurrency {concurrency}" if concurrency else "no recommendation"


def _under_noise(summary: dict[str, Any]) -> str:
    """`` — taken under noise (--conservative): other processes used …``; "" when not."""
    taken = summary.get("under_noise")
    if not isinstance(taken, dict) or taken.get("taken_under_noise") is not True:
        return ""
    cause = taken.get("cause")
    return " — taken under noise (--conservative)" + (
        f": {cause}" if isinstance(cause, str) and cause else ""
    )
