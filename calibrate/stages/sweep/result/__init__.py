"""A finished sweep (SPEC §5.6): its levels and what it says of them — the recommendation in
words, why it stopped, its notes, its summary for the ledger. Which level it recommends and how
sure is ``verdict.SweepVerdict``'s, built on the knee (``knee_verdict``) and on which levels the
client could measure (``client_limit``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from calibrate.confidence import DEFAULT_LEVEL
from calibrate.config import SloConfig
from calibrate.engines import reporting_cap
from calibrate.engines.base import Engine
from calibrate.stages.measure.slo import describe, has_slo, p99_breaches
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.prepare.stream_probe import stream_details
from calibrate.stages.server_account.cap import cap_notes, limit_json
from calibrate.stages.sweep.find_max import FindMax
from calibrate.stages.sweep.levels import Level, bounded, rate_boundary
from calibrate.stages.sweep.result.verdict import SweepVerdict, offered_rate
from calibrate.stages.sweep.spec import SweepOptions
from calibrate.state.calibrated import measured_of
from calibrate.state.summaries import SweepSummary
from calibrate.state.summary_values import Workload


@dataclass(frozen=True)
class SweepResult(SweepVerdict):
    levels: tuple[Level, ...]
    batch_size: int
    gain_min: float
    cap: ServerCap | None
    vram_source: str
    incidents: int
    workload: Workload = field(default_factory=Workload)
    workload_details: dict[str, Any] = field(default_factory=dict)
    slo: SloConfig = field(default_factory=SloConfig)
    find_max: FindMax | None = None  # --find-max: the SLO boundary it found
    confidence: float = DEFAULT_LEVEL  # [confidence] level the knee's intervals are taken at
    skipped_levels: tuple[int, ...] = ()  # above what the ladder proved: planned, never sent
    conservative: bool = False  # --conservative: a knee left in doubt by noise takes the smaller

    @property
    def saturation_text(self) -> str:
        """``saturated at 6 req/s: achieved 4.1 req/s is 32 % below the offered 6``."""
        top = self.saturated_at
        if top is None or top.rate is None or self.find_max is not None:
            return ""  # a find-max over rates probes above saturation: each probe says so
        return f"saturated at {top.label}: {top.rate.why}"

    @property
    def recommendation(self) -> str:
        """The recommendation in words, with what bound it."""
        top = self.best
        if self.find_max is not None and self.find_max.over == "rates":
            if top is None:
                return ""
            return rate_boundary(
                top, self.find_max, describe(self.slo), self.taken(top.concurrency)
            )
        if self.find_max is not None:
            if top is None:
                return ""
            return (
                f"{top.label}: the most in flight that met every SLO ({describe(self.slo)}); "
                f"{self.find_max.text}"
            )
        if top is None:
            if has_slo(self.slo):
                return f"no level met the SLOs ({describe(self.slo)}) with any request"
            return ""
        s = top.stats
        if has_slo(self.slo):
            span = top.goodput_range
            ranged = f", range {span[0]:.2f}–{span[1]:.2f}" if span and len(top.runs) > 1 else ""
            text = (
                f"{top.label}: goodput {s.goodput_per_s or 0.0:.2f} req/s within the SLOs "
                f"(median{ranged}); {bounded(self.levels, top, self.slo)}"
            )
            # goodput counts the requests within the SLOs; a level whose own p99 breaks one is
            # said to, never implied to meet it (find-max would fail it)
            if broke := p99_breaches(s, self.slo):
                text += f"; the level itself misses them: {'; '.join(broke)}"
            return text
        if self.auto and top.rate is None:
            rates = [lv for lv in self.levels if lv.rate is not None]
            why = (
                "no rate between it and the maximum ran"
                if not rates
                else "every rate tried above it saturated"
                if all(lv.saturated for lv in rates)
                else "no rate tried above it was kept up with for sure"
            )
            rate = top.auto.request_rate if top.auto else None
            return f"{top.label}: {rate or s.items_per_s:.2f} req/s — {why}"
        if self.rate_mode and top.rate is not None:
            return f"{top.label}: achieved {top.rate.achieved_rate:.2f} req/s, not saturated"
        return ""

    @property
    def reason(self) -> str:
        """Why the sweep stopped, in words (the failing level's errors)."""
        if self.find_max is not None and self.find_max.last_passing is None:
            if self.find_max.over == "rates":  # a rate may meet them and fail all the same
                return (
                    f"no rate passed (the SLOs, {describe(self.slo)}, met without saturating): "
                    f"{self.find_max.text}"
                )
            return f"no level met the SLOs ({describe(self.slo)}): {self.find_max.text}"
        failed = next((lv for lv in self.levels if lv.verdict == "fail"), None)
        if failed is None:
            if not self.levels:
                return "no level ran"
            if self.passed or self.inconclusive:  # the recommendation, or why none, says the rest
                return "every level ran"
            if (self.rate_mode or self.auto) and self.saturation_text:
                return f"no rate was kept up: {self.saturation_text}"
            if (
                self.rate_mode
                and not self.kept_rates
                and any(offered_rate(lv) == math.inf for lv in self.levels)
            ):
                return (
                    "every level ran, and none could be recommended: inf sends everything at "
                    "once (a closed loop at the in-flight cap), no rate to keep up with — add "
                    "finite rates below it, e.g. --rates 10,20,40,inf"
                )
            if has_slo(self.slo):
                return f"no level met the SLOs ({describe(self.slo)})"
            return "every level ran, and none could be recommended"
        s = failed.stats
        first = " (the first level)" if failed is self.levels[0] else ""
        return f"{failed.label}{first}: {s.errors} of {s.items} requests failed ({s.kinds_text})"

    def notes(self, engine: Engine | None = None) -> list[str]:
        """Caps exceeded, stalls at a keep-alive timeout (naming the flag that sizes the HTTP
        threads of ``engine``, or of the engine whose cap the server reported), and the levels
        whose throughput was the client's limit."""
        out: list[str] = []
        if engine is None and self.cap is not None:
            engine = reporting_cap(self.cap.source)
        name, threads = (engine.name, engine.http_threads_flag) if engine else ("", None)
        for lv in self.levels:
            if lv.stall is not None:
                out.append(lv.stall.text(lv.concurrency, name, threads))
        limit = self.client_limit
        if limit is not None and not self.inconclusive:
            out.append(
                f"{limit.label} and above: calibrate itself was the bottleneck, so their "
                "throughput is the client's limit, not the server's; not recommended"
            )
        for lv in self.levels[: self.levels.index(limit) if limit else len(self.levels)]:
            if lv.client_bound:
                out.append(
                    f"{lv.label}: calibrate itself was the bottleneck for a while "
                    f"({lv.client_bound}); left out of the knee"
                )
        levels = [(lv.concurrency, lv.capped, lv.stats) for lv in self.levels]
        return out + cap_notes(self.cap, self.batch_size, levels)

    def summary(self, options: SweepOptions) -> SweepSummary:
        # no concurrency steps, no knee: an auto sweep, a find-max, rates (one concurrency)
        top = None if self.auto or self.find_max or self.rate_mode else self.knee
        best = self.best
        details = {
            "knee": {
                "concurrency": top.concurrency,
                "items_per_s": round(top.stats.items_per_s, 3),
                "items_per_s_min": round(top.items_per_s_min, 3),
                "items_per_s_max": round(top.items_per_s_max, 3),
                "how_sure": self.knee_text,
                "sure": bool(self.found and self.found.sure),
            }
            if top
            else None,
            "confidence": self.confidence,  # the level the knee's intervals were taken at
            "reason": self.reason,
            "inconclusive": self.inconclusive or None,
            "noise": self.noise_json(),
            "under_noise": self.under_noise.to_json() if self.under_noise else None,
            "server_cap": self.cap.to_json() if self.cap else None,
            "server_limit": limit_json(self.cap, self.batch_size, [lv.stats for lv in self.levels]),
            "vram_source": self.vram_source,
            # each level with what a batch at its concurrency is compared with (its drift)
            "levels": [
                {**lv.summary_json(), "measured": measured_of(lv.stats.to_json())}
                for lv in self.levels
            ],
            "recommendation": self.recommendation or None,
            "saturated": self.saturation_text or None,
            "slo": describe(self.slo) if has_slo(self.slo) else None,
            "load_mode": self.load_mode,
            "find_max": self.find_max.to_json() if self.find_max else None,
            "levels_skipped": list(options.skipped_levels),
            "beyond_ladder": options.beyond_ladder,
            "incidents": self.incidents,
            "workload_detail": self.workload_details,
            **stream_details(options.stream_check),
        }
        chosen = best if has_slo(self.slo) or self.rate_mode or self.auto else top
        chosen = None if self.inconclusive else chosen
        c = chosen.concurrency if chosen else None  # a rate's most in flight: never over the cap
        return SweepSummary(
            self.taken(c) if c else c,
            self.batch_size,
            options.ladder_run_id,
            self.stopped_by,
            details,
            self.workload,
        )
