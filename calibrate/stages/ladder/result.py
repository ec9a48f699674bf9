"""A finished ladder: its tiers, what stopped it, the last passing tier, the warm-up."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from calibrate.confidence import DEFAULT_LEVEL
from calibrate.config import SloConfig
from calibrate.gpu.noise import combined
from calibrate.io.tier_table.cells import picked
from calibrate.io.tier_table.columns import Column as C
from calibrate.io.tier_table.row import TierRow
from calibrate.load.procs.selfcheck import client_limit_hint
from calibrate.stages.ladder.setting import setting_reason, setting_tier
from calibrate.stages.ladder.setting.doubt import SettingDoubt, setting_doubt
from calibrate.stages.measure.slo import describe, has_slo
from calibrate.stages.measure.stop_rules import ServerCap, last_passing, reached
from calibrate.stages.measure.tier import StopReason, Tier
from calibrate.stages.prepare.stream_probe import StreamCheck, stream_details
from calibrate.stages.server_account.cap import stopping_cap
from calibrate.stages.verdict.doubt import CONSERVATIVE_FLAG, UnderNoise
from calibrate.state.calibrated import measured_of
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
    confidence: float = DEFAULT_LEVEL  # [confidence] level: the setting's intervals
    conservative: bool = False  # --conservative: the smaller batch when noise leaves doubt
    cap: ServerCap | None = None  # the server's reported cap (or a managed start's cap flag)

    @property
    def standing(self) -> tuple[Tier, ...]:
        """The tiers the verdict stands on: on the batch axis none above the tier that stopped
        the ladder (``stop_rules.reached``: a round run again can stop a smaller batch after a
        larger one ran); on the context axis every length bisected."""
        return tuple(reached(self.tiers)) if self.axis == "batch" else self.tiers

    @property
    def stopped_at(self) -> Tier | None:
        """The tier whose verdict stopped the ladder (the last one run on the context axis)."""
        return self.standing[-1] if self.tiers else None

    @property
    def last_passing(self) -> Tier | None:
        """The highest kept tier: the ceiling the ladder reached."""
        return last_passing(self.standing)

    @property
    def doubt(self) -> SettingDoubt | None:
        """What leaves the setting unknown on the batch axis (SPEC §5.14; None: nothing)."""
        if self.axis != "batch":
            return None
        return setting_doubt(self.tiers, self.gain_min, self.confidence)

    @property
    def inconclusive(self) -> str:
        """``inconclusive: …`` when noise or a starved client leaves the setting unknown and
        ``--conservative`` did not take the smaller batch (else "")."""
        doubt = self.doubt
        return "" if doubt is None or (self.conservative and doubt.takeable) else doubt.text

    @property
    def under_noise(self) -> UnderNoise | None:
        """``--conservative`` took the smaller batch the rounds could not tell from the best."""
        doubt = self.doubt
        if doubt is None or doubt.noise is None or not self.conservative:
            return None
        return UnderNoise(doubt.noise)

    @property
    def what_to_do(self) -> str:
        doubt = self.doubt
        if doubt is None:
            return ""
        if doubt.noise is not None:
            return doubt.noise.what_to_do
        if doubt.remedy:
            return doubt.remedy
        cause = next((t.client_bound for t in self.tiers if t.client_bound), "")
        faster = (
            f"{client_limit_hint(cause)}; or step only the batch sizes below it "
            "([ladder] batch_sizes)"
        )
        below = setting_tier(self.tiers, self.gain_min, self.confidence) if doubt.takeable else None
        if below is None:
            return faster
        take = f"take the conservative answer (batch {below.batch_size}) with {CONSERVATIVE_FLAG}"
        return f"{faster}; or {take}"

    @property
    def setting(self) -> Tier | None:
        """The calibrated tier (SPEC §5.3): the smallest B within noise of the fastest kept
        tier on the batch axis (None when that is inconclusive); the longest passing input on
        the context axis."""
        if self.axis == "context":
            return self.last_passing
        if self.inconclusive:
            return None
        return setting_tier(
            self.tiers, self.gain_min, self.confidence, conservative=bool(self.under_noise)
        )

    @property
    def setting_reason(self) -> str:
        """Which tier is the setting and why, in one line (empty on the context axis)."""
        if self.axis != "batch":
            return ""
        conservative = bool(self.under_noise)
        reason = setting_reason(
            self.tiers, self.gain_min, self.confidence, conservative=conservative
        )
        return f"{self.taken}; {reason}" if self.taken else reason

    @property
    def taken(self) -> str:
        """What ``--conservative`` took, and why it had to ("" when nothing was in doubt)."""
        doubt = self.doubt
        if doubt is None or not self.conservative or not doubt.takeable:
            return ""
        if self.under_noise is not None:  # and a starved tier above, when one was: both said
            also = doubt.starved.removeprefix("inconclusive: ")
            return f"{self.under_noise.text}; and {also}" if also else self.under_noise.text
        chosen = self.setting
        where = f"batch {chosen.batch_size}, " if chosen else ""
        why = doubt.starved.removeprefix("inconclusive: ")
        return f"{where}the conservative answer, taken ({CONSERVATIVE_FLAG}): {why}"

    @property
    def noise_text(self) -> str:
        """What the rest of the machine did during the ladder, in one line ("" unmeasured)."""
        noise = combined(t.stats.noise for t in self.tiers)
        return noise.said("the ladder") if noise is not None else ""

    @property
    def match_failed(self) -> bool:
        return self.require_match and bool(self.notes)

    @property
    def passed(self) -> bool:
        if self.inconclusive:
            return False
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
        row = top.row() if top else TierRow()
        return {"slo": describe(self.slo), **picked(row, (C.GOODPUT_PER_S, C.SLO_MET), 4)}

    def summary(self) -> LadderSummary:
        """The ledger's summary: ``last_passing`` is the setting (what status and pin use);
        ``highest_kept`` the ceiling reached, when it is another tier."""
        top = self.setting
        ceiling = self.last_passing
        passing = [t.stats.concurrency for t in self.standing if t.passed]
        tiers = [  # each with what a batch of that many in flight is compared with (drift)
            {
                **t.short(),
                "measured": measured_of(t.stats.to_json(), [r.items_per_s for r in t.rounds]),
            }
            for t in self.tiers
        ]
        if self.axis == "context":
            lengths = (C.INPUT_TOKENS_TARGET, C.INPUT_TOKENS_MAX)
            tiers = [{**t.short(), **picked(t.row(), lengths, 6)} for t in self.tiers]
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
        details["inconclusive"] = self.inconclusive or None
        details["under_noise"] = self.under_noise.to_json() if self.under_noise else None
        details["taken_under_noise"] = self.taken or None
        noise = combined(t.stats.noise for t in self.tiers)
        details["noise"] = {**noise.to_json(), "causes": noise.causes()} if noise else None
        return LadderSummary(
            Setting(top.batch_size, top.stats.concurrency) if top else None,
            self.stopped_by,
            max(passing, default=0),
            self.workload,
            details,
            self.axis,
            self.longest_input_tokens if self.axis == "context" else None,
        )
