"""A finished sweep: its levels, the knee or best level, how sure it is, and its summary for
the ledger (SPEC §5.6); which levels the client could measure is ``levels.ClientLimit``'s."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from calibrate.confidence import DEFAULT_LEVEL
from calibrate.config import SloConfig
from calibrate.engines import reporting_cap
from calibrate.engines.base import Engine
from calibrate.load.arrivals import rate_text
from calibrate.stages.measure.slo import describe, has_slo, p99_breaches
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.prepare.stream_probe import stream_details
from calibrate.stages.server_account.cap import cap_notes, limit_json
from calibrate.stages.sweep.find_max import FindMax
from calibrate.stages.sweep.knee_verdict import KneeVerdict
from calibrate.stages.sweep.levels import Level, bounded, probed_level, rate_boundary
from calibrate.stages.sweep.spec import SweepOptions
from calibrate.state.calibrated import measured_of
from calibrate.state.summaries import SweepSummary
from calibrate.state.summary_values import Workload


@dataclass(frozen=True)
class SweepResult(KneeVerdict):
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
    def saturated_at(self) -> Level | None:
        return next((lv for lv in self.levels if lv.saturated), None)

    @property
    def saturation_text(self) -> str:
        """``saturated at 6 req/s: achieved 4.1 req/s is 32 % below the offered 6``."""
        top = self.saturated_at
        if top is None or top.rate is None or self.find_max is not None:
            return ""  # a find-max over rates probes above saturation: each probe says so
        return f"saturated at {top.label}: {top.rate.why}"

    @property
    def best(self) -> Level | None:
        """The recommended level: with SLOs the highest median goodput; in rate mode the highest
        rate the server kept up with (an auto sweep: else its synchronous level); else the knee."""
        passing = [lv for lv in self.measurable if lv.verdict == "pass" and self.runs_whole(lv)]
        if self.find_max is not None:
            fm = self.find_max
            at = fm.surely_below if self.under_noise else fm.last_passing
            return probed_level(passing, fm, at)
        if self.auto or self.rate_mode:  # a saturated rate is never recommended, nor inf
            kept = [lv for lv in self.kept_rates if self.runs_whole(lv)]
            if self.under_noise:  # --conservative: none of its runs saturated
                kept = [lv for lv in kept if lv.rate is not None and not lv.rate.split[0]]
            sync = [lv for lv in passing if lv is self.synchronous]
            if has_slo(self.slo):  # the most goodput, an auto sweep's synchronous level too
                good = [lv for lv in [*sync, *kept] if (lv.stats.goodput_per_s or 0.0) > 0]
                return max(good, key=lambda lv: lv.stats.goodput_per_s or 0.0, default=None)
            return max(kept, key=_offered, default=sync[0] if sync else None)
        knee = self.knee  # with SLOs: the knee of goodput
        if has_slo(self.slo) and knee is not None and not (knee.stats.goodput_per_s or 0.0) > 0:
            return None
        return knee

    def taken(self, in_flight: int) -> int:
        """The concurrency pin and status take from a level: its most in flight, never above
        the server's own reported cap (the summary's, and the line that says it)."""
        return min(in_flight, self.cap.slots) if self.cap else in_flight

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
            ran = any(lv.rate is not None for lv in self.levels)
            why = (
                "every rate tried above it saturated"
                if ran
                else "no rate between it and the maximum ran"
            )
            rate = top.auto.request_rate if top.auto else None
            return f"{top.label}: {rate or s.items_per_s:.2f} req/s — {why}"
        if self.rate_mode and top.rate is not None:
            return f"{top.label}: achieved {top.rate.achieved_rate:.2f} req/s, not saturated"
        return ""

    @property
    def knee(self) -> Level | None:
        """The knee among the levels the client could measure (None when inconclusive); under
        noise with ``--conservative``, the smallest level the runs cannot tell from the best."""
        found = self.found
        if found is None or self.inconclusive:
            return None
        at = found.conservative if self.under_noise and found.conservative else found.knee
        return next((lv for lv in self.judged if lv.concurrency == at.concurrency), None)

    @property
    def knee_text(self) -> str:
        """Where the knee is and how sure: the gains around it with their ranges."""
        found = self.found
        if found is None or self.inconclusive:
            return ""
        taken = self.under_noise
        return f"{taken.text}; {found.text}" if taken else found.text

    @property
    def inconclusive(self) -> str:
        """``inconclusive: the client was the limit at C ≥ 8 …`` when a client-bound level
        leaves the best level unknown; else the knee's (or boundary's) doubts, unless
        ``--conservative`` took the smaller level (else "")."""
        doubt = self.doubt
        noisy = doubt.text if doubt is not None and not self.conservative else ""
        return self.client_inconclusive or noisy

    @property
    def what_to_do(self) -> str:
        """For an inconclusive sweep: what the noise calls for, or what the client limit does."""
        doubt = self.doubt
        if doubt is not None and not self.client_inconclusive:
            return doubt.what_to_do
        return self.client_what_to_do

    @property
    def client_inconclusive(self) -> str:
        """Why calibrate's own limit leaves the best unknown ("" when it does not)."""
        if self.find_max is not None:
            return self._find_max_inconclusive()
        limit = self.client_limit
        if limit is None:
            return ""
        reliable = self.measurable
        top = self._best_measured()
        if top is not None and reliable and top is not reliable[-1]:
            return ""  # the client's limit is above the best: the knee's own doubts stand
        at = limit.rate.offered_rate if limit.rate else None
        where = f"rate ≥ {rate_text(at)} req/s" if limit.rate else f"C ≥ {limit.concurrency}"
        rising = (
            f"the best level it could measure is the last one before that ({top.label}), so "
            "what more in flight would give is unknown"
            if top is not None
            else "no level below it was measured"
        )
        return (
            f"inconclusive: the client was the limit at {where} — {rising} ({limit.client_bound})"
        )

    def _best_measured(self) -> Level | None:
        by_best = has_slo(self.slo) or self.rate_mode or self.auto
        if by_best:
            return self.best
        found = self.found
        if found is None:
            return None
        return next((lv for lv in self.judged if lv.concurrency == found.best.concurrency), None)

    @property
    def passed(self) -> bool:
        if self.inconclusive:
            return False
        by_best = has_slo(self.slo) or self.rate_mode or self.auto
        return self.best is not None if by_best else self.knee is not None

    @property
    def load_mode(self) -> str:
        if self.find_max is not None:
            return "find-max"
        return "auto" if self.auto else ("rates" if self.rate_mode else "concurrency")

    @property
    def stopped_by(self) -> str:
        return "failure" if any(lv.verdict == "fail" for lv in self.levels) else "completed"

    @property
    def reason(self) -> str:
        """Why the sweep stopped, in words (the failing level's errors)."""
        if self.find_max is not None and self.find_max.last_passing is None:
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
                and any(_offered(lv) == math.inf for lv in self.levels)
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


def _offered(level: Level) -> float:
    """A rate level's offered rate (inf for everything at once)."""
    rate = level.rate.offered_rate if level.rate else None
    return math.inf if rate is None else rate
