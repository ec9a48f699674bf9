"""The typed summaries of ledger lines, one per stage, read and written here only (SPEC §4.2).

The fields other stages act on (the last passing tier, the recommended concurrency, what was
pinned, where a rollback put the server) are typed; everything a stage reports only for people
and ``report`` rides along in ``details``. Reading is tolerant: a field of the wrong type reads
as absent (``positive_int``, ``text_of``…), so an old or hand-edited ledger line can never
crash a gate — it just opens nothing. The values the summaries are made of (``Setting``,
``TunedSetting``, ``Workload``) are read the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# the values a summary is made of: a setting (B, C), a tune winner, what was sent


def positive_int(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def text_of(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    return value if isinstance(value, str) else ""


def positive_float(data: dict[str, Any], key: str) -> float | None:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return None
    return float(value)


def flags_of(data: Any) -> tuple[tuple[str, str], ...]:
    """``{"parallel": "4"}`` → ``(("parallel", "4"),)``; anything malformed reads as none."""
    if not isinstance(data, dict):
        return ()
    return tuple(
        (k, str(v))
        for k, v in data.items()
        if isinstance(k, str) and isinstance(v, str | int | float) and not isinstance(v, bool)
    )


@dataclass(frozen=True)
class Setting:
    """Batch size B (the engine's cap) and concurrency C (requests in flight), SPEC §5.0."""

    batch_size: int
    concurrency: int

    def to_json(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "concurrency": self.concurrency}

    @classmethod
    def from_json(cls, data: Any) -> Setting | None:
        if not isinstance(data, dict):
            return None
        batch = positive_int(data, "batch_size")
        # lines from before the concurrency column existed ran one request at a time
        conc = positive_int(data, "concurrency") or (1 if "concurrency" not in data else None)
        return cls(batch, conc) if batch and conc else None


@dataclass(frozen=True)
class TunedSetting:
    """A tune winner: every engine flag it ran with, its cap B and its best concurrency C."""

    flags: tuple[tuple[str, str], ...]
    batch_size: int
    concurrency: int

    @property
    def setting(self) -> Setting:
        return Setting(self.batch_size, self.concurrency)

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.flags)

    def to_json(self) -> dict[str, Any]:
        return {**self.setting.to_json(), "flags": dict(self.flags)}

    @classmethod
    def from_json(cls, data: Any) -> TunedSetting | None:
        setting = Setting.from_json(data)
        if setting is None or not isinstance(data, dict):
            return None
        return cls(flags_of(data.get("flags")), setting.batch_size, setting.concurrency)


@dataclass(frozen=True)
class Workload:
    """What a ladder or sweep sent (SPEC §5.11): the fixed prompt, a tasks file, or synthetic.

    ``longest_input_tokens`` is the longest ``usage.prompt_tokens`` a passing tier sent, and
    ``tokens_per_char`` what the server counted per character of those inputs (``batch``'s
    length check estimates its items with it).
    """

    source: str = "fixed"
    longest_input_tokens: int | None = None
    output_tokens: int | None = None
    input_tokens: str | None = None  # the target: "2000" or "512:4096"
    tasks: str | None = None
    pick: str | None = None
    shared_prefix: float | None = None
    tokens_per_char: float | None = None
    output_controlled: bool | None = None  # None: answers were not forced

    def describe(self) -> str:
        if self.source == "fixed":
            text = "the fixed prompt"
            if self.longest_input_tokens:
                text += f" ({self.longest_input_tokens} input tokens)"
            return text
        parts = [self.source]
        if self.tasks:
            parts[0] = f"tasks {self.tasks}" + (f" (pick {self.pick})" if self.pick else "")
        if self.input_tokens:
            parts.append(f"target {self.input_tokens} input tokens")
        if self.shared_prefix:
            parts.append(f"{self.shared_prefix:.0%} shared prefix")
        if self.longest_input_tokens:
            parts.append(f"longest input {self.longest_input_tokens} tokens")
        if self.output_tokens:
            forced = "" if self.output_controlled is not False else " (not controlled)"
            parts.append(f"{self.output_tokens} output tokens{forced}")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "longest_input_tokens": self.longest_input_tokens,
            "output_tokens": self.output_tokens,
            "input_tokens": self.input_tokens,
            "tasks": self.tasks,
            "pick": self.pick,
            "shared_prefix": self.shared_prefix,
            "tokens_per_char": round(self.tokens_per_char, 5) if self.tokens_per_char else None,
            "output_controlled": self.output_controlled,
        }

    @classmethod
    def from_json(cls, data: Any) -> Workload:
        if not isinstance(data, dict):
            return cls()
        controlled = data.get("output_controlled")
        return cls(
            text_of(data, "source") or "fixed",
            positive_int(data, "longest_input_tokens"),
            positive_int(data, "output_tokens"),
            text_of(data, "input_tokens") or None,
            text_of(data, "tasks") or None,
            text_of(data, "pick") or None,
            positive_float(data, "shared_prefix"),
            positive_float(data, "tokens_per_char"),
            controlled if isinstance(controlled, bool) else None,
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
