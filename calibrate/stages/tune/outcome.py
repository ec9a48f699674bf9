"""Where a tune run stands (SPEC §5.12, §5.14): the memory step, every candidate's latest
result ranked, the winner — claimed only when the runs of the first two tell them apart (or
they are surely about equal); otherwise inconclusive, unless ``--conservative`` takes the one
with the smaller cap — and its margin over the runner-up.

The margin is the winner's goodput over the runner-up's (each at its best level). It is claimed
as significant only when the runs of those two levels say so: Welch's t-interval of the winner's
mean goodput per run minus the runner-up's, at ``[confidence] level``, lies wholly on the
margin's side of zero (``confidence.compare``). With fewer than two runs on either side there is
no interval and nothing is claimed either way; the pick stays the ranking's.

Candidates are measured one after another, so a machine or server that slows between them reads
as a difference between them. A lead the runs call sure is therefore measured again in the other
order (``again``: the later of the two first, A B B A, so a steady drift cancels), and judged on
both measurements' runs together; when the second measurement ranks them the other way, the
order they were measured in decided the lead, and the verdict is inconclusive."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from calibrate.confidence import DEFAULT_LEVEL, compare, spread
from calibrate.gpu.energy import RANK_FIELDS, RankBy
from calibrate.gpu.noise import combined
from calibrate.io.tier_table.tune import Point
from calibrate.stages.tune.grid import Candidate, TunePlan
from calibrate.stages.tune.pareto import points, reason
from calibrate.stages.tune.result import BestLevel, CandidateResult, MemoryProbe
from calibrate.stages.verdict.doubt import Doubt, Inconclusive, UnderNoise
from calibrate.stages.verdict.margin import Margin
from calibrate.stages.verdict.separation import Sample, gain_interval
from calibrate.state.summaries import TuneSummary
from calibrate.state.summary_values import TunedSetting


def healthy(result: CandidateResult) -> bool:
    return result.best is not None and not result.crashed


def rank(results: Sequence[CandidateResult], by: RankBy = "goodput") -> list[CandidateResult]:
    """Best first: a healthy measurement before a crash or a failure, a later halving rung
    before an earlier one, then (``by`` J/token or $/1M: the fewest at its best level, one not
    measured after those that were) goodput, then the lower median latency, then grid order."""
    column = RANK_FIELDS.get(by)

    def key(r: CandidateResult) -> tuple[bool, int, float, float, float, int]:
        p50 = r.best.p50_s if r.best and r.best.p50_s is not None else math.inf
        cost = getattr(r.best, column, None) if column and r.best else None
        spend = cost if cost is not None else (math.inf if column else 0.0)
        return (not healthy(r), -r.rung, spend, -r.goodput_per_s, p50, r.candidate.index)

    return sorted(results, key=key)


def margin_of(
    winner: BestLevel, runner_up: BestLevel, level: float = DEFAULT_LEVEL
) -> Margin | None:
    """The winner's margin over the runner-up and its test; None when the runner-up had no
    goodput (no ratio to give)."""
    if runner_up.goodput_per_s <= 0:
        return None
    fraction = winner.goodput_per_s / runner_up.goodput_per_s - 1
    runs = (len(winner.runs_per_s), len(runner_up.runs_per_s))
    a, b = spread(runner_up.runs_per_s, level), spread(winner.runs_per_s, level)
    if a is None or b is None:
        return Margin(fraction, level, None, runs=runs)
    diff = compare(a, b)
    if diff.ci_low is None or diff.ci_high is None:
        return Margin(fraction, level, None, runs=runs)
    low, high = diff.relative(a.mean)
    clear = diff.ci_low > 0 if fraction >= 0 else diff.ci_high < 0
    return Margin(fraction, level, clear, low, high, runs)


@dataclass(frozen=True)
class TuneOutcome:
    """Where a tune run stands: the memory step, every candidate's latest result, ranked."""

    plan: TunePlan
    memory: str | None
    probes: tuple[MemoryProbe, ...]
    ranked: tuple[CandidateResult, ...]  # one per candidate measured (its highest rung)
    untested: tuple[Candidate, ...]
    budget_spent: bool
    memory_failed: bool = False
    level: float = DEFAULT_LEVEL  # [confidence] level: the margin's interval
    gain_min: float = 0.10  # [sweep] gain_min: a lead below it is about equal
    conservative: bool = False  # --conservative: a winner noise leaves in doubt takes the smaller
    rank_by: RankBy = "goodput"
    stopped: str = ""  # refine: why the search needed no further candidate
    restarts: int = 0  # candidate restarts the run has made, resumed ones included
    spent_by: str = ""  # "--restarts" or "--budget-s": the budget that left ``untested``
    slos: bool = False  # SLOs are set: goodput counts the answers within them (else every one)
    again: tuple[CandidateResult, ...] = ()  # the first two measured again, in the other order
    unchecked: str = ""  # why a sure lead was not measured again ("" when it was, or is none)

    def runs_of(self, result: CandidateResult) -> tuple[float, ...]:
        """The runs at a candidate's best level, with those of its second measurement."""
        runs = result.best.runs_per_s if result.best is not None else ()
        for other in self.again:
            if other.candidate.index == result.candidate.index and other.best is not None:
                runs += other.best.runs_per_s
        return runs

    @property
    def swapped(self) -> bool:
        """Measured again in the other order, the second-ranked of the two led the first."""
        win, second = self.top, self.second
        if win is None or second is None:
            return False
        again = {r.candidate.index: r.goodput_per_s for r in self.again if healthy(r)}
        first, other = again.get(win.candidate.index), again.get(second.candidate.index)
        return first is not None and other is not None and other > first

    @property
    def top(self) -> CandidateResult | None:
        """The first-ranked healthy candidate (the winner, unless noise leaves it in doubt)."""
        top = self.ranked[0] if self.ranked else None
        return top if top is not None and healthy(top) else None

    @property
    def second(self) -> CandidateResult | None:
        """The second-ranked candidate, when it is healthy (the one the first is judged against)."""
        if self.top is None or len(self.ranked) < 2 or not healthy(self.ranked[1]):
            return None
        return self.ranked[1]

    @property
    def doubt(self) -> Inconclusive | None:
        """SPEC §5.14: the runs of the first two cannot tell whether the first adds gain_min
        over the second (ranked by goodput); None when they can, or there is nothing to tell."""
        win, second = self.top, self.second
        if self.rank_by != "goodput" or win is None or second is None:
            return None
        if win.best is None or second.best is None:
            return None
        a, b = self.runs_of(win), self.runs_of(second)
        if not a or not b:
            return None
        # the pick is sound when the runner-up cannot be gain_min better than the winner: the
        # winner really leads, or the two are about equal (either is a fine setting) — unless
        # measured again the other way round the runner-up led (the order decided it)
        found = gain_interval(Sample.of(a), Sample.of(b), self.level)
        sound = found is None or not found.ranged or found.high < self.gain_min
        if sound and not self.swapped:
            return None
        found = gain_interval(Sample.of(b), Sample.of(a), self.level)
        assert found is not None
        smaller = min((win, second), key=lambda r: (r.cap, r is not win))
        measured = (r.measurement for r in (win, second) if r.measurement is not None)
        return Inconclusive(
            (Doubt(second.candidate.id, win.candidate.id, found, self.gain_min),),
            combined(m.noise for m in measured),  # the machine while the two were measured
            "tune" + (self._swap_words(win, second) if self.swapped else ""),
            f"{smaller.candidate.id} ({smaller.candidate.describe()})",
            "[tune] window, [sweep] repeats",
        )

    def _swap_words(self, win: CandidateResult, second: CandidateResult) -> str:
        """What the second measurement showed, when it ranked the two the other way."""
        goodput = {r.candidate.index: r.goodput_per_s for r in self.again}
        mine, theirs = goodput[win.candidate.index], goodput[second.candidate.index]
        return (
            f"; measured again in the other order, {second.candidate.id} led {win.candidate.id} "
            f"({theirs:.2f} against {mine:.2f} a second): the order they were measured in "
            "decided the lead, not the candidates"
        )

    @property
    def winner(self) -> CandidateResult | None:
        """The first-ranked healthy candidate; under a doubt only with ``--conservative`` (then
        the one of the two with the smaller cap)."""
        top, doubt = self.top, self.doubt
        if doubt is None or top is None:
            return top
        if not self.conservative:
            return None
        pair = [r for r in (top, self.second) if r is not None]
        return min(pair, key=lambda r: (r.cap, r is not top))

    @property
    def runner_up(self) -> CandidateResult | None:
        """The best candidate other than the winner: the second, or — when --conservative took
        the second under noise — the first (never the winner itself)."""
        win = self.winner
        return self.top if win is not None and win is self.second else self.second

    @property
    def lead(self) -> Margin | None:
        """The winner's margin over the runner-up, and whether their intervals separate; None
        when ranked by another figure than goodput (a goodput margin would cite a statistic the
        ranking did not use, and J or $ per token has one figure a candidate: no interval)."""
        win, second = self.winner, self.runner_up
        if self.rank_by != "goodput":
            return None
        if win is None or second is None or win.best is None or second.best is None:
            return None
        found = margin_of(
            self._pooled(win.best, win), self._pooled(second.best, second), self.level
        )
        if found is not None and found.significant and self.unchecked:
            return replace(found, significant=None, unchecked=self.unchecked)
        return found

    def _pooled(self, best: BestLevel, result: CandidateResult) -> BestLevel:
        """``best`` with the runs of both measurements, its goodput their median: the margin
        and its interval read the same runs (the first measurement's alone said +X %)."""
        runs = self.runs_of(result)
        if runs == best.runs_per_s or not runs:
            return best
        return replace(best, runs_per_s=runs, goodput_per_s=statistics.median(runs))

    @property
    def margin(self) -> float | None:
        """The winner's goodput over the runner-up's, as a fraction (0.25 = 25 % more)."""
        lead = self.lead
        return lead.fraction if lead is not None else None

    def lead_json(self) -> dict[str, Any]:
        """``margin``, ``significant``, ``margin_interval`` and ``confidence`` (None: no lead)."""
        lead = self.lead
        if lead is None:
            return {
                "margin": None,
                "significant": None,
                "margin_interval": None,
                "confidence": self.level,
            }
        return lead.to_json()

    @property
    def inconclusive(self) -> str:
        doubt = self.doubt
        return doubt.text if doubt is not None and not self.conservative else ""

    def front(self) -> list[Point]:
        """Every candidate that served a passing level as a point, the Pareto front's first."""
        win = self.winner
        return points(self.ranked, win.candidate.id if win is not None else None)

    def pin_reason(self, front: Sequence[Point]) -> str:
        """Which point pin takes and why ("" when there is no winner)."""
        pinned = next((p for p in front if p.pinned), None)
        doubt = self.doubt
        under_noise = doubt.conservative if doubt is not None and self.conservative else ""
        top, second = self.top, self.second
        same = top is not None and second is not None and top.cap == second.cap
        return reason(pinned, self.rank_by, front, under_noise, same_cap=same, slos=self.slos)

    @property
    def complete(self) -> bool:
        return not self.untested and not self.budget_spent and not self.memory_failed

    def summary(self, details: dict[str, Any]) -> TuneSummary:
        win = self.winner
        tuned = None
        if win is not None and win.best is not None:
            tuned = TunedSetting(win.candidate.flags, win.cap, win.best.concurrency)
        second = self.runner_up
        front = self.front()
        body = {
            **details,
            "candidates": self.plan.size,
            "measured": len(self.ranked),
            "did_not_start": sum(1 for r in self.ranked if not r.started),
            "memory": {
                "key": self.plan.memory_key,
                "fixed": self.memory,
                "probes": [p.to_json() for p in self.probes],
            },
            "runner_up": second.candidate.to_json() if second else None,
            **self.lead_json(),
            "untested": [c.to_json() for c in self.untested],
            "budget_spent": self.budget_spent,
            "spent_by": self.spent_by or None,
            "restarts": self.restarts,
            "search_stop": self.stopped or None,
            "pareto": [p.to_json() for p in front],
            "pinned_reason": self.pin_reason(front) or None,
            "inconclusive": self.inconclusive or None,
            "under_noise": UnderNoise(self.doubt).to_json()
            if self.doubt is not None and self.conservative
            else None,
        }
        return TuneSummary(
            tuned, self.plan.kind, self.complete, str(details.get("ladder_run_id", "")), body
        )
