"""How long a ladder's tiers and a sweep's levels should take: what their progress bar's ETA
(and a log's one line of plan) is sized from.

The minimum windows alone (a round's ``min_round_s``, a level's ``level_s``) say nothing of a
slow server: a round is at least one wave, and a wave lasts as long as its slowest answer (10 s
to a minute on a CPU build); a level lasts until it started 4×C requests and 3× the level
before's p50 have passed, then drains. So each plan starts from the baseline's answer time
(``baselines/single.jsonl``), then from what the tiers or levels so far measured, and applies
the rules that decide how long a round or a level runs. A larger tier or level queues longer:
its answers are scaled by the server's own cap when known (⌈B / slots⌉ waits), else by how the
last two measured grew with B, never by less than √B: a server whose slots are not known yet
answers 1 and 2 as fast and queues at 4 (a CPU build's 2 slots), and where answers are fast
(a GPU's) ``min_round_s`` sizes a round anyway, so too slow a guess costs little there.

Each step is a range, (low, high) seconds, where what decides it is not known yet:
- the server's slots unknown, an answer at a larger size is √B-fold at least and B-fold at most
  (a server whose slots were all taken already: a wave of 2B takes two turns of B) — on 2 slots
  that calibrate was not told, √B had a sweep's levels 4, 8, 16 1.9× low after 1 and 2 answered
  alike;
- a tier may run up to ``max_rounds`` rounds, a level up to ``max_repeats`` runs (a Poisson rate
  near its server's capacity runs to its repeat bound): a level planned from the runs the level
  before took (at least ``repeats``), up to ``max_repeats``.
A rate level's run lasts its requests' schedule (at least 8 requests: ``arrivals.requests_for``)
and the drain of its last answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from calibrate.load.arrivals import requests_for
from calibrate.load.window import MIN_REQUESTS_PER_SLOT, P50_MULTIPLE
from calibrate.stages.ladder.options import LadderOptions
from calibrate.stages.measure.tier import Tier
from calibrate.stages.sweep.levels import Level
from calibrate.stages.sweep.spec import SweepOptions

PRIOR_GROWTH = 0.5  # answer time ∝ B^0.5 at least (more where two tiers or levels say so)
Span = tuple[float, float]  # (low, high) seconds


@dataclass
class Growth:
    """One answer's time at each size (batch B, concurrency C): measured where measured, else
    scaled from the last measured (or the baseline's at size 1)."""

    answer_s: float | None  # the baseline's answer (None: no baseline)
    slots: int | None = None  # the server's own cap, when known
    measured: list[tuple[int, float]] = field(default_factory=list)  # (size, seconds)

    def seen(self, size: int, seconds: float | None) -> None:
        if seconds is not None and seconds > 0:
            self.measured = [m for m in self.measured if m[0] != size] + [(size, seconds)]

    def at(self, size: int) -> float | None:
        """An answer's seconds at ``size`` (None: nothing to size it from)."""
        known = dict(self.measured)
        if size in known:
            return known[size]
        if self.measured:
            base, seconds = self.measured[-1]
        elif self.answer_s is not None:
            base, seconds = 1, self.answer_s
        else:
            return None
        if self.slots:  # the cap known: a size over it waits ⌈size / slots⌉ turns
            return seconds * math.ceil(size / self.slots) / math.ceil(base / self.slots)
        return float(seconds * (size / base) ** self.exponent())

    def span(self, size: int) -> Span | None:
        """An answer's seconds at ``size`` as (low, high): measured, or the cap known, one
        number; else from ``at`` up to B-fold growth from the last measured (or the baseline)."""
        low = self.at(size)
        if low is None or self.slots or size in dict(self.measured):
            return None if low is None else (low, low)
        base, seconds = self.measured[-1] if self.measured else (1, self.answer_s or low)
        return low, max(low, seconds * size / base)

    def exponent(self) -> float:
        if len(self.measured) < 2:
            return PRIOR_GROWTH
        (b0, s0), (b1, s1) = sorted(self.measured[-2:])
        if b0 == b1 or s0 <= 0:
            return PRIOR_GROWTH
        return min(max(math.log(s1 / s0) / math.log(b1 / b0), PRIOR_GROWTH), 1.0)


@dataclass
class LadderPace:
    """Each tier's planned seconds: ``rounds`` rounds of whole waves lasting at least
    ``min_round_s`` (a warm-up wave before the first), a wave as long as its answer."""

    options: LadderOptions
    growth: Growth

    def observe(self, tier: Tier) -> None:
        waves = sum(r.waves or 0 for r in tier.rounds)
        wall = sum(r.total_s for r in tier.rounds)
        size = 1 if self.options.axis == "context" else tier.batch_size
        self.growth.seen(size, wall / waves if waves else None)

    def step_s(self, index: int) -> Span:
        """(low, high): ``rounds`` rounds of the wave's low guess, up to ``max_rounds`` of its
        high one."""
        o = self.options
        sizes = o.batch_sizes if o.axis == "batch" else (1,)
        batch = sizes[min(index, len(sizes) - 1)]
        wave = self.growth.span(batch)
        if wave is None:  # no baseline: the windows alone
            return o.rounds * o.min_round_s, o.round_bound * o.min_round_s
        low, high = (
            self._tier_s(w, rounds, index)
            for w, rounds in zip(wave, (o.rounds, o.round_bound), strict=True)
        )
        return low, high

    def _tier_s(self, wave: float, rounds: int, index: int) -> float:
        o = self.options
        round_s = max(math.ceil(o.min_round_s / wave), 1) * wave
        warmup = o.warmup_waves * wave if index == 0 else 0.0
        return rounds * round_s + warmup


@dataclass
class SweepPace:
    """Each level's planned seconds: runs each held until it lasted ``level_s`` (and 3× the
    level before's p50) and started 4×C requests (a rate's: sent its schedule), then drained;
    as many runs as the level before took (at least ``repeats``: levels nearer the knee, or a
    rate nearer its server's capacity, take more), up to ``max_repeats``."""

    options: SweepOptions
    levels: tuple[float, ...]  # the concurrency (or offered rate) of each planned level
    growth: Growth
    runs: list[int] = field(default_factory=list)  # the runs each finished level took

    def observe(self, level: Level) -> None:
        self.runs.append(len(level.runs))
        if level.rate is None:
            self.growth.seen(level.concurrency, level.stats.latency_p50_s)

    def step_s(self, index: int) -> Span:
        o = self.options
        closed = not (o.rates or o.find_max_rates is not None or o.auto_steps)
        sizes = [max(int(c), 1) for c in self.levels] if closed and self.levels else [1]
        size = sizes[min(index, len(sizes) - 1)]
        high_runs = max(o.max_repeats, o.repeats)
        runs = min(max(o.repeats, self.runs[-1] if self.runs else 0), high_runs)
        answer = self.growth.span(size)
        if answer is None:
            return runs * o.level_s, high_runs * o.level_s
        below = self.growth.at(sizes[index - 1]) if 0 < index < len(sizes) else None
        hold = max(o.level_s, P50_MULTIPLE * below if below else 0.0)
        if not closed and o.rates and index < len(o.rates) and not math.isinf(o.rates[index]):
            rate = o.rates[index]  # a rate run sends its schedule: at least 8 requests
            hold = max(hold, requests_for(rate, o.level_s, o.max_in_flight or 1) / rate)
        low, high = (
            count * (max(hold, (MIN_REQUESTS_PER_SLOT - 1) * a if closed else 0.0) + a)
            for count, a in zip((runs, high_runs), answer, strict=True)
        )  # 4×C started at C in flight, then the last answers drain
        return low, high
