"""The knee half of a finished sweep (SPEC §5.6, §5.14): which levels it is found among, the
knee with its doubts, and what noise left undecided — inconclusive, or with ``--conservative``
the smaller level taken under noise. ``SweepVerdict`` (``verdict``) is built on it."""

from __future__ import annotations

from typing import Any

from calibrate.config import SloConfig
from calibrate.gpu.noise import combined
from calibrate.stages.measure.slo import has_slo
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.server_account.cap import server_limit
from calibrate.stages.sweep.levels import Level
from calibrate.stages.sweep.result.client_limit import ClientLimit
from calibrate.stages.verdict.doubt import (
    Doubt,
    Inconclusive,
    ShortfallDoubt,
    SplitDoubt,
    UnderNoise,
)
from calibrate.stages.verdict.knee import Knee, Point, find_knee, interval, spread_of
from calibrate.stages.verdict.separation import LogSpread


class KneeVerdict(ClientLimit):
    """The knee of a ``SweepResult`` (a dataclass with these fields, the package's)."""

    cap: ServerCap | None
    batch_size: int
    gain_min: float
    slo: SloConfig
    confidence: float
    skipped_levels: tuple[int, ...]
    conservative: bool

    @property
    def rate_mode(self) -> bool:
        return any(lv.rate is not None for lv in self.levels)

    @property
    def auto(self) -> bool:
        return any(lv.auto is not None for lv in self.levels)

    @property
    def judged(self) -> tuple[Level, ...]:
        """The levels the knee is found among: those the client could measure, none above the
        server's own cap (SPEC §5.14: there it measured the server's queue), none above the
        cap its running count showed below the batch size (§6.1)."""
        return tuple(lv for lv in self.measurable if not lv.capped and self.runs_whole(lv))

    @property
    def kept_rates(self) -> list[Level]:
        """The rate levels the server kept up with: passing, measured by the server, not
        saturated, at a rate — everything at once (``inf``) is a closed loop at the in-flight
        cap, never a rate anyone kept up with, and its "achieved" rate is read from its sends."""
        return [
            lv
            for lv in self.measurable
            if lv.verdict == "pass"
            and lv.rate is not None
            and lv.rate.offered_rate is not None
            and not lv.saturated
        ]

    @property
    def synchronous(self) -> Level | None:
        """An auto sweep's synchronous level (one request at a time), when the server set it."""
        return next(
            (lv for lv in self.measurable if lv.auto and lv.auto.role == "synchronous"), None
        )

    @property
    def running_limit(self) -> ServerCap | None:
        """The server's own cap below the batch size the sweep ran at: reported, or shown by its
        running count (``server_limit``); None when it ran the whole batch."""
        return server_limit(self.cap, self.batch_size, [lv.stats for lv in self.levels])

    def runs_whole(self, level: Level) -> bool:
        """The server runs the level's requests at once: none above its own cap below the batch
        size (``running_limit``) is recommended."""
        limit = self.running_limit
        return limit is None or level.concurrency <= limit.slots

    @property
    def points(self) -> list[Point]:
        """The judged levels as the knee rule sees them: throughput, or goodput under SLOs."""
        if has_slo(self.slo):
            return [lv.goodput_point for lv in self.judged]
        return [lv.point for lv in self.judged]

    @property
    def found(self) -> Knee | None:
        above, proven = "", False
        capped = [lv.concurrency for lv in self.measurable if lv.capped]
        limit = self.running_limit
        if not capped and limit is not None:
            capped = [lv.concurrency for lv in self.measurable if lv.concurrency > limit.slots]
        cap = (
            self.cap if self.cap is not None and any(lv.capped for lv in self.measurable) else limit
        )
        if capped and cap is not None:
            over = ", ".join(map(str, capped))
            above = (
                f"{over} exceeds the server's own cap of {cap.slots} ({cap.source}): "
                "more in flight only queues there, never recommended"
            )
            proven = True
        elif self.skipped_levels:
            skipped = ", ".join(map(str, self.skipped_levels))
            above = (
                f"{skipped} not sent, above what the ladder proved in flight "
                "(--beyond-ladder to measure them)"
            )
        measure = "goodput" if has_slo(self.slo) else "throughput"  # what the points are
        return find_knee(
            self.points, self.gain_min, self.confidence, above, proven=proven, measure=measure
        )

    @property
    def doubt(self) -> Inconclusive | None:
        """The knee's doubts, when noise left a comparison it rests on unsettled; a find-max's,
        when a probe at its boundary still had runs on both sides of an SLO (§5.14)."""
        if self.find_max is not None:
            return self._boundary_doubt()
        if self.rate_mode:  # an auto sweep's rates too (its steps are rates)
            return self._rate_doubt()
        found = self.found
        if found is None or not found.noisy or self.rate_mode or self.auto:
            return None
        conservative = found.conservative or found.knee
        return Inconclusive(
            tuple(
                _doubt(a, b, (self.gain_min, self.confidence), spread_of(self.points))
                for a, b in found.doubts
            ),
            combined(lv.stats.noise for lv in self.levels),
            "the sweep",
            f"concurrency {conservative.concurrency}",
            "[sweep] max_repeats, [sweep] level_s",
        )

    def _rate_doubt(self) -> Inconclusive | None:
        """The highest rate kept up with, when some of its runs saturated after its repeats, or
        the slope's interval over its answers could not tell its shortfall from 5 %."""
        kept = self.kept_rates
        top = kept[-1] if kept else None  # the rates rise as the levels go
        if top is None or top.rate is None or not (top.rate.split[0] or top.rate.unsure):
            return None
        under, runs = top.rate.split
        surely = [lv for lv in kept if surely_kept(lv)]
        sync = self.synchronous
        doubt = (
            ShortfallDoubt(top.label, top.rate.unsure)
            if top.rate.unsure
            else SplitDoubt(top.label, "keeps up", under, runs)
        )
        return Inconclusive(
            (doubt,),
            combined(lv.stats.noise for lv in self.levels),
            "the sweep",
            surely[-1].label if surely else sync.label if sync is not None else "",
            "[sweep] max_repeats, [sweep] level_s",
        )

    def _boundary_doubt(self) -> Inconclusive | None:
        fm = self.find_max
        if fm is None or not fm.unsure:
            return None
        doubts = tuple(
            ShortfallDoubt(fm.named(p.level), p.unsure)
            if p.unsure
            else SplitDoubt(fm.named(p.level), "meets the SLOs", p.over_runs, p.runs)
            for p in fm.unsure
        )
        below = fm.named(fm.surely_below) if fm.surely_below is not None else ""
        return Inconclusive(
            doubts,
            combined(lv.stats.noise for lv in self.levels),
            "the sweep",
            below,
            "[sweep] max_repeats, [sweep] level_s",
        )

    @property
    def under_noise(self) -> UnderNoise | None:
        """``--conservative`` took the smaller level the runs could not tell from the best (None
        when no level below the doubt was surely kept up or met the SLOs: nothing to take)."""
        doubt = self.doubt
        if doubt is None or not doubt.conservative or not self.conservative:
            return None
        return UnderNoise(doubt)

    @property
    def noise_text(self) -> str:
        """``the machine during the sweep: other processes used 0.2 of its 2 cores, …``."""
        noise = combined(lv.stats.noise for lv in self.levels)
        return noise.said("the sweep") if noise is not None else ""

    def noise_json(self) -> dict[str, Any] | None:
        noise = combined(lv.stats.noise for lv in self.levels)
        return {**noise.to_json(), "causes": noise.causes()} if noise else None


def surely_kept(level: Level) -> bool:
    """A rate level none of whose runs saturated, its shortfall surely within 5 %."""
    return level.rate is not None and not level.rate.split[0] and not level.rate.unsure


def _doubt(base: Point, cur: Point, rule: tuple[float, float], spread: LogSpread | None) -> Doubt:
    """An unsure pair of the knee, with the interval behind it (``rule``: gain_min, level)."""
    gain_min, level = rule
    found = interval(base, cur, level, spread)
    assert found is not None  # a doubt is an unsure pair: its base had throughput
    return Doubt(
        f"concurrency {base.concurrency}", f"concurrency {cur.concurrency}", found, gain_min
    )
