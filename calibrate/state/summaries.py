"""The typed summaries of ledger lines, one per stage, read and written here only (SPEC §4.2).

The fields other stages act on (the last passing tier, the recommended concurrency, what was
pinned, where a rollback put the server) are typed; everything a stage reports only for people
and ``report`` rides along in ``details``. Reading is tolerant: a field of the wrong type reads
as absent (``positive_int``, ``text_of``…), so an old or hand-edited ledger line can never
crash a gate — it just opens nothing. The values the summaries are made of (``Setting``,
``TunedSetting``, ``Workload``) are in ``summary_values``, read the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from calibrate.state.summary_values import (
    Setting,
    TunedSetting,
    Workload,
    flags_of,
    positive_int,
    text_of,
)


@dataclass(frozen=True)
class TierChecks:
    """What a ladder or sweep line adds after its own fields: calibrate's own load over the run
    (``selfload``) and, with ``--compare``, the comparison with the committed table."""

    selfload: dict[str, Any]
    compare: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"selfload": self.selfload}
        if self.compare is not None:
            out["compare"] = self.compare
        return out


@dataclass(frozen=True)
class LadderSummary:
    """A ladder's result. ``axis`` "context" steps the input length (SPEC §5.3): it verifies
    ``context_verified`` input tokens and never sets the batch size."""

    last_passing: Setting | None
    stopped_by: str
    max_in_flight: int  # the most requests in flight at once in a passing tier (0: none passed)
    workload: Workload = field(default_factory=Workload)
    details: dict[str, Any] = field(default_factory=dict)
    axis: str = "batch"
    context_verified: int | None = None  # the longest passing input (tokens), context axis
    checks: TierChecks | None = None  # added as the verdict is written

    @property
    def is_context(self) -> bool:
        return self.axis == "context"

    @property
    def server_died(self) -> bool:
        """The managed server died under a tier (the next step is a rollback)."""
        return bool(self.details.get("server_died"))

    def to_json(self) -> dict[str, Any]:
        return {
            **self.details,
            "last_passing": self.last_passing.to_json() if self.last_passing else None,
            "stopped_by": self.stopped_by,
            "max_in_flight": self.max_in_flight,
            "workload": self.workload.to_json(),
            "axis": self.axis,
            "context_verified": self.context_verified,
            **(self.checks.to_json() if self.checks else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LadderSummary:
        top = Setting.from_json(data.get("last_passing"))
        in_flight = positive_int(data, "max_in_flight") or (top.concurrency if top else 0)
        workload = Workload.from_json(data.get("workload"))
        axis = "context" if data.get("axis") == "context" else "batch"
        context = positive_int(data, "context_verified") if axis == "context" else None
        return cls(top, text_of(data, "stopped_by"), in_flight, workload, data, axis, context)


@dataclass(frozen=True)
class SweepSummary:
    recommended_concurrency: int | None
    batch_size: int
    ladder_run_id: str  # the ladder whose batch size the sweep ran at
    stopped_by: str
    details: dict[str, Any] = field(default_factory=dict)
    workload: Workload = field(default_factory=Workload)
    checks: TierChecks | None = None  # added as the verdict is written

    def to_json(self) -> dict[str, Any]:
        return {
            **self.details,
            "recommended_concurrency": self.recommended_concurrency,
            "batch_size": self.batch_size,
            "ladder_run_id": self.ladder_run_id,
            "stopped_by": self.stopped_by,
            "workload": self.workload.to_json(),
            **(self.checks.to_json() if self.checks else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SweepSummary:
        return cls(
            positive_int(data, "recommended_concurrency"),
            positive_int(data, "batch_size") or 0,
            text_of(data, "ladder_run_id"),
            text_of(data, "stopped_by"),
            data,
            Workload.from_json(data.get("workload")),
        )


@dataclass(frozen=True)
class PinSummary:
    setting: Setting | None
    kind: str
    script: str
    details: dict[str, Any] = field(default_factory=dict)
    tuned: tuple[tuple[str, str], ...] = ()  # the tune winner's engine flags it wrote

    def to_json(self) -> dict[str, Any]:
        base = self.setting.to_json() if self.setting else {}
        return {
            **self.details,
            **base,
            "kind": self.kind,
            "script": self.script,
            "tuned_flags": dict(self.tuned),
        }

    @property
    def verified_by(self) -> str:
        """The run that measured the pinned batch size ("ladder run <id>"; "": not recorded)."""
        return text_of(self.details, "verified_by")

    @property
    def concurrency_from(self) -> str:
        """Where the pinned concurrency came from ("sweep run <id>"; "": not recorded)."""
        return text_of(self.details, "concurrency_from")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PinSummary:
        tuned = flags_of(data.get("tuned_flags"))
        return cls(
            Setting.from_json(data), text_of(data, "kind"), text_of(data, "script"), data, tuned
        )


@dataclass(frozen=True)
class RollbackSummary:
    setting: Setting | None  # written once the "active" step ran: the server is meant to be here
    failed_step: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.details,
            "setting": self.setting.to_json() if self.setting else None,
            "failed_step": self.failed_step or None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RollbackSummary:
        return cls(Setting.from_json(data.get("setting")), text_of(data, "failed_step"), data)


@dataclass(frozen=True)
class TuneSummary:
    winner: TunedSetting | None
    kind: str
    complete: bool  # every candidate measured (not cut by --budget-s)
    ladder_run_id: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.details,
            "winner": self.winner.to_json() if self.winner else None,
            "kind": self.kind,
            "complete": self.complete,
            "ladder_run_id": self.ladder_run_id,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TuneSummary:
        return cls(
            TunedSetting.from_json(data.get("winner")),
            text_of(data, "kind"),
            data.get("complete") is True,
            text_of(data, "ladder_run_id"),
            data,
        )


@dataclass(frozen=True)
class PlainSummary:
    """Stages nothing else reads back (single, repro, verify, batch) and interrupted runs
    (``{}``, or a tune's progress): details only, written as given."""

    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dict(self.details)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PlainSummary:
        return cls(data)


Summary = LadderSummary | SweepSummary | PinSummary | RollbackSummary | TuneSummary | PlainSummary
TierSummary = LadderSummary | SweepSummary  # what a ladder or a sweep records


def ladder_summary(data: dict[str, Any]) -> LadderSummary:
    return LadderSummary.from_json(data)


def sweep_summary(data: dict[str, Any]) -> SweepSummary:
    return SweepSummary.from_json(data)


def pin_summary(data: dict[str, Any]) -> PinSummary:
    return PinSummary.from_json(data)


def rollback_summary(data: dict[str, Any]) -> RollbackSummary:
    return RollbackSummary.from_json(data)


def tune_summary(data: dict[str, Any]) -> TuneSummary:
    return TuneSummary.from_json(data)
