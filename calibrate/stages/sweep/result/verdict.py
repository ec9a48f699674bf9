"""Which level a finished sweep recommends, and how sure it is (SPEC §5.6, §5.14): the knee
(``knee_verdict``) or, with SLOs, rates or ``--auto``, the best level; whether calibrate's own
limit or noise leaves it unknown. ``SweepResult`` (the package's) is built on it and says it.
"""

from __future__ import annotations

import math

from calibrate.load.arrivals import rate_text
from calibrate.stages.measure.slo import has_slo
from calibrate.stages.sweep.levels import Level, probed_level
from calibrate.stages.sweep.result.knee_verdict import KneeVerdict, surely_kept


class SweepVerdict(KneeVerdict):
    """The verdict of a ``SweepResult`` (a dataclass with these fields)."""

    @property
    def saturated_at(self) -> Level | None:
        return next((lv for lv in self.levels if lv.saturated), None)

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
            if self.under_noise:  # --conservative: none of its runs saturated, surely kept up
                kept = [lv for lv in kept if surely_kept(lv)]
            sync = [lv for lv in passing if lv is self.synchronous]
            if has_slo(self.slo):  # the most goodput, an auto sweep's synchronous level too
                good = [lv for lv in [*sync, *kept] if (lv.stats.goodput_per_s or 0.0) > 0]
                return max(good, key=lambda lv: lv.stats.goodput_per_s or 0.0, default=None)
            return max(kept, key=offered_rate, default=sync[0] if sync else None)
        knee = self.knee  # with SLOs: the knee of goodput
        if has_slo(self.slo) and knee is not None and not (knee.stats.goodput_per_s or 0.0) > 0:
            return None
        return knee

    def taken(self, in_flight: int) -> int:
        """The concurrency pin and status take from a level: its most in flight, never above
        the server's own reported cap (the summary's, and the line that says it)."""
        return min(in_flight, self.cap.slots) if self.cap else in_flight

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
        ``--conservative`` took the smaller level (else ""; with none to take, the doubts)."""
        doubt = self.doubt
        noisy = doubt.text if doubt is not None and self.under_noise is None else ""
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
        if self.auto:  # its candidates: the synchronous level and the rates, never its maximum
            reliable = tuple(lv for lv in reliable if lv.auto and lv.auto.role != "maximum")
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


def offered_rate(level: Level) -> float:
    """A rate level's offered rate (inf for everything at once)."""
    rate = level.rate.offered_rate if level.rate else None
    return math.inf if rate is None else rate
