"""A finished ladder: its tiers, what stopped it, the last passing tier, the warm-up."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from calibrate.config import SloConfig
from calibrate.stages.measure.slo import describe, has_slo
from calibrate.stages.measure.stop_rules import (
    ServerCap,
    last_passing,
    setting_reason,
    setting_tier,
)
from calibrate.stages.measure.tiers import StopReason, Tier
from calibrate.stages.prepare.stream_probe import StreamCheck, stream_details
from calibrate.stages.server_account import stopping_cap
from calibrate.state.summaries import LadderSummary
from calibrate.state.summary_values import Setting, Workload
from calibrate.workload import Axis


@dataclass(frozen=True)
class WarmUp:
    """The waves sent before the first tier (not counted in any tier)."""

    waves: int
    items: int
    errors: int
    total_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "waves": self.waves,
            "items": self.items,
            "errors": self.errors,
            "total_s": round(self.total_s, 6),
        }


@dataclass(frozen=True)
class LadderResult:
    tiers: tuple[Tier, ...]
    stopped_by: StopReason
    vram_source: str
    notes: tuple[str, ...]
    require_match: bool
    incidents: int
    warmup: WarmUp | None = None
    workload: Workload = field(default_factory=Workload)
    workload_details: dict[str, Any] = field(default_factory=dict)
    axis: Axis = "batch"
    stream_check: StreamCheck | None = None  # what the stream probe found (None: not probed)
    slo: SloConfig = field(default_factory=SloConfig)
    gain_min: float = 0.10
    cap: ServerCap | None = None  # the server's reported cap (or a managed start's cap flag)

    @property
    def last_passing(self) -> Tier | None:
        """The highest kept tier: the ceiling the ladder reached."""
        return last_passing(self.tiers)

    @property
    def setting(self) -> Tier | None:
        """The calibrated tier (SPEC §5.3): the smallest B within noise of the fastest kept
        tier on the batch axis; the longest passing input on the context axis."""
        if self.axis == "context":
            return self.last_passing
        return setting_tier(self.tiers, self.gain_min)

    @property
    def setting_reason(self) -> str:
        """Which tier is the setting and why, in one line (empty on the context axis)."""
        return setting_reason(self.tiers, self.gain_min) if self.axis == "batch" else ""

    @property
    def match_failed(self) -> bool:
        return self.require_match and bool(self.notes)

    @property
    def passed(self) -> bool:
        return self.last_passing is not None and not self.match_failed

    @property
    def longest_input_tokens(self) -> int | None:
        """The longest input (server-counted tokens) of the last passing tier."""
        top = self.last_passing
        return top.stats.input_tokens_max if top else None

    def goodput_json(self) -> dict[str, Any]:
        """The SLOs and the setting's goodput under them (nothing without SLOs)."""
        if not has_slo(self.slo):
            return {}
        top = self.setting
        good = top.stats.goodput_per_s if top else None
        return {
            "slo": describe(self.slo),
            "goodput_per_s": round(good, 4) if good is not None else None,
            "slo_met": top.stats.slo_met if top else None,
        }

    def summary(self) -> LadderSummary:
        """The ledger's summary: ``last_passing`` is the setting (what status and pin use);
        ``highest_kept`` the ceiling reached, when it is another tier."""
        top = self.setting
        ceiling = self.last_passing
        passing = [t.stats.concurrency for t in self.tiers if t.passed]
        tiers = [t.short() for t in self.tiers]
        if self.axis == "context":
            tiers = [
                {
                    **short,
                    "input_tokens_target": t.stats.input_tokens_target,
                    "input_tokens_max": t.stats.input_tokens_max,
                }
                for short, t in zip(tiers, self.tiers, strict=True)
            ]
        details = {
            "vram_source": self.vram_source,
            "tiers": tiers,
            "baseline_mismatch": list(self.notes),
            "incidents": self.incidents,
            # the managed server died under a tier: the next step restarts it (gates.next_step)
            "server_died": any("server_died" in t.stats.error_kinds for t in self.tiers),
            "warmup": self.warmup.to_json() if self.warmup else None,
            "workload_detail": self.workload_details,
            **stream_details(self.stream_check),
            **self.goodput_json(),
        }
        details["server_cap"] = stopping_cap(self.cap, [t.stats for t in self.tiers])
        if top is not None and self.axis == "batch":
            details["setting_reason"] = self.setting_reason
            details["highest_kept"] = ceiling.batch_size if ceiling else None
        return LadderSummary(
            Setting(top.batch_size, top.stats.concurrency) if top else None,
            self.stopped_by,
            max(passing, default=0),
            self.workload,
            details,
            self.axis,
            self.longest_input_tokens if self.axis == "context" else None,
        )
