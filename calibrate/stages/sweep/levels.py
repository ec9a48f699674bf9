"""A sweep's levels (SPEC §5.6): each one — its stats over the repeats, median and range; where
it sits in an ``--auto`` curve; its verdict; what the knee rule sees of it — and what bounds the
level recommended. The client's limit over them all is ``result.client_limit``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from calibrate.config import SloConfig
from calibrate.gpu.noise import combined
from calibrate.io.tier_table.cells import picked, row_json, written
from calibrate.io.tier_table.columns import PER_TOKEN
from calibrate.io.tier_table.columns import Column as C
from calibrate.io.tier_table.row import AutoCells, DeterminismCells, RateCells, SweepCells, TierRow
from calibrate.load.arrivals import rate_text
from calibrate.load.keepalive_stall import Stall
from calibrate.load.window import spread
from calibrate.stages.determinism import DeterminismCheck
from calibrate.stages.measure.saturation import RateJudgement
from calibrate.stages.measure.slo import binding_slo, p99_breaches
from calibrate.stages.measure.tiers import Stats
from calibrate.stages.sweep.find_max import FindMax
from calibrate.stages.verdict.knee import Point
from calibrate.stages.verdict.separation import judged_range

# a rate level's cells in the ledger's summary
RATE = (C.OFFERED_RATE, C.ACHIEVED_RATE, C.SATURATED, C.SATURATION, C.SEND_LAG_P99_S)
LevelVerdict = Literal["pass", "fail", "stop: slo"]  # stop: slo — a find-max probe over an SLO
AutoRole = Literal["synchronous", "rate", "maximum"]


@dataclass(frozen=True)
class AutoStep:
    """Where a level sits in an ``--auto`` sweep: 0 synchronous, 1…N the rates, N+1 the
    maximum (``stages.sweep_auto``)."""

    step: int
    role: AutoRole
    request_rate: float | None = None  # a closed-loop step's throughput in requests/s


@dataclass(frozen=True)
class Level:
    """One concurrency level: ``stats`` over all its runs, with ``items_per_s`` and
    ``output_tokens_per_s`` the medians of the runs' steady windows; ``runs`` one per repeat."""

    stats: Stats
    runs: tuple[Stats, ...]
    gain: float | None  # the median gain over the best level below it (SPEC §5.6)
    counted: bool  # the gain counts: median ≥ gain_min and the ranges do not overlap
    verdict: LevelVerdict
    capped: bool
    rate: RateJudgement | None = None  # rate mode: offered vs achieved (median run), saturation
    auto: AutoStep | None = None  # --auto: which step of the curve
    client_bound: str = ""  # why calibrate itself was the bottleneck during it ("" = it was not)
    stall: Stall | None = None  # answers stalled near a keep-alive timeout
    determinism: DeterminismCheck | None = None  # [determinism] copies, after the window

    @property
    def concurrency(self) -> int:
        return self.stats.concurrency

    @property
    def saturated(self) -> bool:
        return self.rate is not None and self.rate.saturated

    @property
    def label(self) -> str:
        """``concurrency 4``, ``4 req/s``, or in an auto sweep ``maximum (concurrency 16)``."""
        if self.rate is None:
            closed = f"concurrency {self.concurrency}"
            return f"{self.auto.role} ({closed})" if self.auto else closed
        return f"{rate_text(self.rate.offered_rate)} req/s"

    @property
    def goodput_range(self) -> tuple[float, float] | None:
        good = [r.goodput_per_s for r in self.runs if r.goodput_per_s is not None]
        return (min(good), max(good)) if good else None

    @property
    def items_per_s_min(self) -> float:
        return min((r.items_per_s for r in self.runs), default=self.stats.items_per_s)

    @property
    def items_per_s_max(self) -> float:
        return max((r.items_per_s for r in self.runs), default=self.stats.items_per_s)

    @property
    def point(self) -> Point:
        """As the knee rule sees it: a level run once has no range, one run 5+ times is judged
        on its middle runs (``verdict.separation.judged_range``)."""
        span = judged_range([r.items_per_s for r in self.runs])
        return Point(
            self.concurrency,
            self.stats.items_per_s,
            self.stats.errors,
            span[0] if span else None,
            span[1] if span else None,
            tuple(r.items_per_s for r in self.runs),
        )

    @property
    def goodput_point(self) -> Point:
        """As the knee rule sees it with SLOs: each run's goodput (requests/s within them)."""
        good = [r.goodput_per_s or 0.0 for r in self.runs]
        span = judged_range(good)
        return Point(
            self.concurrency,
            self.stats.goodput_per_s or 0.0,
            self.stats.errors,
            span[0] if span else None,
            span[1] if span else None,
            tuple(good),
        )

    def row(self) -> TierRow:
        """Its row in tiers.csv and tiers.jsonl."""
        good = self.goodput_range
        return replace(
            self.stats.row(),
            verdict=self.verdict,
            client_bound=self.client_bound or None,
            sweep=SweepCells(
                len(self.runs),
                round(self.items_per_s_min, 6),
                round(self.items_per_s_max, 6),
                round(self.gain, 4) if self.gain is not None else None,
                self.counted,
                self.capped,
                round(good[0], 6) if good else None,
                round(good[1], 6) if good else None,
            ),
            auto=AutoCells(self.auto.step, self.auto.role) if self.auto else AutoCells(),
            rate=self.rate_cells(),
            determinism=self.determinism.cells() if self.determinism else DeterminismCells(),
        )

    def to_json(self) -> dict[str, Any]:
        return row_json(self.row())

    def summary_json(self) -> dict[str, Any]:
        """The level in the ledger's sweep summary (status, pin and report read it back)."""
        row = self.row()
        span = (C.ITEMS_PER_S, C.ITEMS_PER_S_MIN, C.ITEMS_PER_S_MAX, C.REPEATS, C.GAIN_COUNTED)
        return {
            **picked(row, (C.CONCURRENCY, *span), 3),
            C.CLIENT_BOUND.value: bool(self.client_bound),
            **picked(row, (C.ERRORS, C.VERDICT), 6),
            **written(row, (C.AUTO_STEP, C.LOAD, *RATE)),
            **picked(row, (C.GOODPUT_PER_S,), 6),
            **written(row, PER_TOKEN),
        }

    def rate_cells(self) -> RateCells:
        """Rate levels: offered (infinite for everything at once) and achieved; an auto sweep's
        closed-loop levels: their achieved rate."""
        if self.rate is None:
            rate = self.auto.request_rate if self.auto else None
            return RateCells(achieved_rate=round(rate or 0.0, 6)) if self.auto else RateCells()
        r = self.rate
        return RateCells(
            float("inf") if r.offered_rate is None else r.offered_rate,  # None: everything at once
            round(r.achieved_rate, 6),
            r.saturated,
            r.why or r.unsure or None,  # an unsure level's row says the shortfall's interval
            round(r.send_lag_p99_s, 6) if r.send_lag_p99_s is not None else None,
        )


def level_stats(whole: Stats, runs: Sequence[Stats]) -> Stats:
    """A level's stats over all its runs, with throughput and goodput the runs' medians."""
    good = [r.goodput_per_s for r in runs if r.goodput_per_s is not None]
    return replace(
        whole,
        items_per_s=spread([r.items_per_s for r in runs]).median,
        output_tokens_per_s=spread([r.output_tokens_per_s for r in runs]).median,
        goodput_per_s=spread(good).median if good else None,
        slo_met=sum(r.slo_met or 0 for r in runs) if good else None,
        noise=combined(r.noise for r in runs),
    )


def bounded(levels: Sequence[Level], top: Level, slo: SloConfig) -> str:
    """What kept the recommendation from the next level up, as that level's row shows it:
    an SLO it broke, saturation, errors — or no more goodput (the knee of goodput)."""
    at = levels.index(top)
    after = levels[at + 1] if at + 1 < len(levels) else None
    if after is None:
        nearest = binding_slo(top.stats, slo)
        return f"the last level tried (nearest its bound: {nearest})"
    if after.saturated and after.rate is not None:
        return f"{after.label} saturated ({after.rate.why})"
    if after.stats.errors:
        return f"{after.label} failed ({after.stats.kinds_text})"
    if broke := p99_breaches(after.stats, slo):
        bound = binding_slo(after.stats, slo)
        return f"bounded by {bound} ({after.label}: {'; '.join(broke)})"
    return f"{after.label} adds no goodput that counts"


def probed_level(levels: Sequence[Level], fm: FindMax, at: float | None) -> Level | None:
    """The level a find-max probed at ``at``: a concurrency, or an offered rate."""
    for lv in levels:
        rate = lv.rate.offered_rate if lv.rate else None
        if at is not None and (
            rate == at if fm.over == "rates" else not lv.rate and lv.concurrency == at
        ):
            return lv
    return None


def rate_boundary(top: Level, fm: FindMax, slo: str, taken: int | None = None) -> str:
    """A rate boundary in words, and ``taken``, the concurrency pin and status take from it (its
    most in flight unless the server's own cap is below it: ``SweepResult.taken``)."""
    achieved = f", achieved {top.rate.achieved_rate:.3g} req/s" if top.rate else ""
    most = top.concurrency
    c = most if taken is None else taken
    queued = (
        f" (the server runs {c} at once: its cap; the rest waited in its queue)" if c < most else ""
    )
    return (
        f"{top.label}: the highest offered rate that met every SLO ({slo}) without saturating"
        f"{achieved}; at most {most} {'request was' if most == 1 else 'requests were'} in flight "
        f"there{queued}, which pin and status take as concurrency {c}; {fm.text}"
    )
