"""A rate level's verdict over its runs (SPEC §5.13, §5.14): kept up, saturated, or unsure.

**A fixed schedule** (``--arrival constant``): every run offers the same sends, so its runs
differ only by the server's own jitter. The level is saturated when most of its runs were; a
shortfall the slope's interval over all its answers cannot tell from 5 % (``saturation.
Shortfall``) is unsure, and so are runs that disagree: the level runs again up to
``max_repeats``, and one still unsure then is neither kept up nor saturated.

**A random schedule** (Poisson, ``--burstiness``, a job's gaps): each run draws its own sends,
and one run's achieved rate is one draw. Eight Poisson sends to 4 slots at 1.2× their capacity
read within 5 % of the offered rate in 58 of 200 runs, sure: a server that answers every
request in the same time gives latencies that tie (the slope's interval has width 0), and a
clump of sends that waits for a slot makes its neighbours wait too (its answers are not
independent). Nor is one such run's shortfall sure: 62 of 200 runs of a server at 90 % of its
capacity read saturated. The runs are the level's replicates (``RunsRate``): the mean of their
achieved rates with its t-interval at the ``[confidence]`` level — kept up only when its low
end is within 5 % (and the slope's interval over all the answers is too), saturated only when
its high end is more than 5 % short, unsure otherwise; so two runs at least, more while unsure.
Each run's achieved rate is then read by least squares (``saturation.achieved``): Theil–Sen's
median read three of eight answers 35 % late as no trend, and two such runs alike as sure.
A level may stop "kept up" after each run from the second to ``max_repeats``, and short runs
skew (those that catch no queue cluster at the offered rate): at 1.1× capacity 11 of 200 levels
stopped "kept up" on two or three that clustered. That interval is at the level shared over
those looks (``kept_level``, Bonferroni: 95 % over 5 is 99 % each): 2 of 200.

Either way, **Little's law** (``InFlight``): serving a rate with answers of mean latency W keeps
rate × W requests in flight on average. Through an in-flight cap (the ladder's, on an unmanaged
server) below that for the 5 % line, no schedule is kept up with: saturated, however lucky a
short run's sends fell. And runs that never held that many at once never showed the server
serving the rate — eight Poisson sends that never caught 4 slots short read exactly the offered
rate, as a server at 30 % of its capacity does: not kept up, unsure.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from calibrate.confidence import DEFAULT_LEVEL, Spread, spread
from calibrate.stages.measure.saturation import (
    SHORTFALL,
    RateJudgement,
    Shortfall,
    off_text,
    shortfall,
    shortfall_text,
)


@dataclass(frozen=True)
class RunsRate:
    """A level's runs, each its own random schedule: the mean achieved rate with its interval."""

    rates: Spread  # the runs' achieved rates, req/s
    offered: float
    looks: int = 1  # the runs the level may stop on, its level shared over them (``kept_level``)

    @property
    def surely_short(self) -> bool:
        high = self.rates.ci_high
        return high is not None and high < self.offered * (1 - SHORTFALL)

    @property
    def surely_within(self) -> bool:
        low = self.rates.ci_low
        return low is not None and low >= self.offered * (1 - SHORTFALL)

    def _over(self) -> str:
        level = f"{self.rates.level:.0%}"
        if self.looks > 1:  # the [confidence] level it was shared from
            shared = 1 - (1 - self.rates.level) * self.looks
            level += f": {shared:.0%} shared over the {self.looks} runs the level may stop on"
        return f"over {self.rates.n} runs, each its own random schedule ({level})"

    def why(self) -> str:
        """``achieved 15.1 req/s is 37% below the offered 24 — at least 20% below over 3 runs,
        each its own random schedule (95%)``."""
        high = self.rates.ci_high if self.rates.ci_high is not None else self.rates.mean
        said = shortfall_text(self.rates.mean, self.offered)
        return f"{said} — at least {off_text(high, self.offered)} {self._over()}"

    def text(self) -> str:
        """``achieved 21.6 req/s, 10% below the offered 24 — anywhere from 2% above to 22%
        below over 4 runs, each its own random schedule (95%), across the 5% line``."""
        r = self.rates
        head = f"achieved {r.mean:.3g} req/s, {off_text(r.mean, self.offered)} the offered "
        head += f"{self.offered:g}"
        if r.ci_low is None or r.ci_high is None:
            return f"{head} — one run is one draw of a random schedule: others may fall further"
        return (
            f"{head} — anywhere from {off_text(r.ci_high, self.offered)} to "
            f"{off_text(r.ci_low, self.offered)} {self._over()}, across the {SHORTFALL:.0%} line"
        )


@dataclass(frozen=True)
class InFlight:
    """Little's law at the offered rate: serving ``offered`` × 95 % with answers of the mean
    latency W keeps that rate × W requests in flight on average. Through an in-flight cap
    below that, no schedule is kept up with (``surely_short``); runs that never held that many
    at once never showed the server serving it (``shown``), however their answers read."""

    peak: int  # the most requests the level's runs had in flight at once
    cap: int | None  # the in-flight cap (None: none)
    latency: Spread  # every answer's latency, s
    offered: float

    def needed(self, latency_s: float | None) -> float:
        line = self.offered * (1 - SHORTFALL)
        return line * (latency_s if latency_s is not None else self.latency.mean)

    @property
    def surely_short(self) -> bool:
        """Even at the latency interval's low end, the cap holds fewer than the line needs."""
        return self.cap is not None and self.cap < self.needed(self.latency.ci_low)

    @property
    def shown(self) -> bool:
        """The runs held, at their peak, as many as the line needs at the interval's high end."""
        return self.peak >= self.needed(self.latency.ci_high)

    def _answers(self) -> str:
        return (
            f"{self.latency.mean:.3g} s answers (Little's law over {self.latency.n} answers, "
            f"{self.latency.level:.0%})"
        )

    def why(self) -> str:
        """``the in-flight cap of 4 is less than the 4.56 requests in flight that 22.8 req/s
        (5% under the offered 24) of 0.2 s answers needs, whatever the schedule (Little's law
        over 16 answers, 95%)``."""
        line = self.offered * (1 - SHORTFALL)
        needed = self.needed(self.latency.ci_low)
        return (
            f"the in-flight cap of {self.cap} is less than the {needed:.3g}"
            f" requests in flight that {line:.3g} req/s ({SHORTFALL:.0%} under the offered "
            f"{self.offered:g}) of {self._answers()} needs, whatever the schedule"
        )

    def text(self) -> str:
        """``at most 4 requests were in flight at once, fewer than the 4.56 that 22.8 req/s …
        of 0.2 s answers keeps in flight: the runs never showed the server serving it``."""
        line = self.offered * (1 - SHORTFALL)
        return (
            f"at most {self.peak} requests were in flight at once, fewer than the "
            f"{self.needed(self.latency.ci_high):.3g} that {line:.3g} req/s ({SHORTFALL:.0%} "
            f"under the offered {self.offered:g}) of {self._answers()} keeps in flight: the "
            "runs never showed the server serving it"
        )


def kept_level(level: float, looks: int) -> float:
    """The level each of ``looks`` chances to stop "kept up" is judged at, so that all of them
    together are wrong no more often than ``level`` allows (Bonferroni): 95 % over 5 is 99 %."""
    return 1 - (1 - level) / max(1, looks)


def runs_rate(
    judged: Sequence[RateJudgement], level: float = DEFAULT_LEVEL, looks: int = 1
) -> RunsRate | None:
    """The runs' achieved rates as replicates (None: nothing offered, rate inf), at ``level``
    shared over ``looks`` (``kept_level``)."""
    offered = judged[0].offered_rate if judged else None
    found = spread([j.achieved_rate for j in judged], kept_level(level, looks))
    if offered is None or found is None:
        return None
    return RunsRate(found, offered, max(1, looks))


def in_flight(judged: Sequence[RateJudgement], level: float = DEFAULT_LEVEL) -> InFlight | None:
    """Little's law over all the level's answers (None: nothing offered, no answers apart in
    time)."""
    offered = judged[0].offered_rate if judged else None
    latencies = [s for j in judged if j.trend is not None for s in j.trend.latencies]
    found = spread(latencies, level) if latencies else None
    if offered is None or found is None or found.mean <= 0:
        return None
    return InFlight(max(j.peak_in_flight for j in judged), judged[0].cap, found, offered)


def _pooled(judged: Sequence[RateJudgement], level: float) -> Shortfall | None:
    """The slope's interval over all the level's answers (the pairs within each run)."""
    offered = judged[0].offered_rate if judged else None
    trends = [j.trend for j in judged if j.trend is not None]
    return shortfall(trends, offered, level) if offered is not None and trends else None


def _mixed(judged: Sequence[RateJudgement]) -> bool:
    """Some runs of the level saturated and some did not."""
    saturated = sum(j.saturated for j in judged)
    return 0 < saturated < len(judged)


def _unsure(judged: Sequence[RateJudgement], level: float, achieved: float) -> str:
    """Why the level's shortfall is unsure, pooled over its runs' answers ("" when sure, or
    when most runs saturated on another rule): the slope's interval straddles 5 %."""
    if not judged or 2 * sum(j.saturated for j in judged) > len(judged):
        return ""
    offered = judged[0].offered_rate
    if offered is not None and achieved > offered * (1 + SHORTFALL):  # no server answers more
        return (  # than was sent: a backlog from the run's start drained (latency fell through it)
            f"achieved {achieved:.3g} req/s is more than the offered {offered:g}: the first "
            "answers waited on a backlog that drained during the run, so whether it keeps up "
            "was not measured"
        )
    pooled = _pooled(judged, level)
    if pooled is None or pooled.surely_short or pooled.surely_within:
        return ""
    return pooled.text(achieved)


def _resolved(judged: Sequence[RateJudgement], level: float) -> list[RateJudgement]:
    """The runs, those unsure alone counted saturated when all the level's answers put it
    surely more than 5 % short (their pooled slope's interval)."""
    pooled = _pooled(judged, level)
    if pooled is None or not pooled.surely_short:
        return list(judged)
    why = pooled.why(statistics.median(j.achieved_rate for j in judged))
    return [replace(j, saturated=True, why=why, unsure="") if j.unsure else j for j in judged]


def unsettled(
    judged: Sequence[RateJudgement],
    level: float,
    *,
    random_schedule: bool = False,
    looks: int = 1,
) -> bool:
    """Whether the level should run again: its verdict is unsure (``level_judgement``), or,
    on a fixed schedule, its runs disagree and the cap's bound did not settle it."""
    if not judged:
        return False
    median = statistics.median(j.achieved_rate for j in judged)
    found = level_judgement(
        list(judged), median, level, random_schedule=random_schedule, looks=looks
    )
    if found.unsure:
        return True
    bound = in_flight(judged, level)
    settled = random_schedule or (bound is not None and bound.surely_short)
    return not settled and _mixed(_resolved(judged, level))


def level_judgement(
    judged: list[RateJudgement],
    achieved: float,
    level: float = DEFAULT_LEVEL,
    *,
    random_schedule: bool = False,
    looks: int = 1,
) -> RateJudgement:
    """The level's verdict from its runs (the module's doc), said at ``achieved`` on a fixed
    schedule (the runs' median, the table's number) and at the runs' mean on a random one
    (the number its interval is of; "kept up" at ``kept_level`` over the ``looks`` the level
    has to stop on it); then the cap's bound (``CapBound``)."""
    lags = [j.send_lag_p99_s for j in judged if j.send_lag_p99_s is not None]
    judged = [replace(j, send_lag_p99_s=max(lags, default=None)) for j in judged]
    if random_schedule and judged[0].offered_rate is not None:
        found = _random_level(judged, level, looks)
    else:
        found = _fixed_level(judged, achieved, level)
    bound = in_flight(judged, level)
    if bound is None or found.saturated:
        return found
    if bound.surely_short:
        runs = len(judged)
        return replace(found, saturated=True, why=bound.why(), unsure="", split=(runs, runs))
    if not found.unsure and not bound.shown:
        return replace(found, unsure=bound.text())
    return found


def _random_level(judged: list[RateJudgement], level: float, looks: int) -> RateJudgement:
    """The runs of a random schedule judged together: split counts them all on the verdict;
    kept up only on the interval at ``kept_level``, which an unsure level says."""
    runs = runs_rate(judged, level)
    assert runs is not None  # the caller's offered rate
    count = len(judged)
    first = replace(judged[0], achieved_rate=runs.rates.mean, split=(0, count), why="", unsure="")
    if runs.surely_short:
        return replace(first, saturated=True, why=runs.why(), split=(count, count))
    kept = runs_rate(judged, level, looks)
    assert kept is not None
    if not kept.surely_within:
        return replace(first, saturated=False, unsure=kept.text())
    pooled = _pooled(judged, level)
    if pooled is not None and not pooled.surely_within:
        return replace(first, saturated=False, unsure=pooled.text(runs.rates.mean))
    return replace(first, saturated=False)


def _fixed_level(judged: list[RateJudgement], achieved: float, level: float) -> RateJudgement:
    """Saturated when most of the level's runs were (one run of three that fell short on a
    burst is noise, not a result); a tie is settled by the level's median achieved rate, the
    number the table shows. The why names how many runs, and a shortfall is the level's own:
    its median, not the first short run's rate (which read 81.1 req/s beside a table's 73.2).
    A shortfall the slope's interval over all the level's answers cannot tell from 5 % is
    neither: the level is ``unsure`` and says the interval (runs unsure alone are not saturated;
    pooled surely short, they count as saturated; a queue that decided it is said)."""
    offered = judged[0].offered_rate
    judged = _resolved(judged, level)
    unsure = _unsure(judged, level, achieved)
    saturated = [j for j in judged if j.saturated]
    split = (len(saturated), len(judged))
    judged = [replace(j, split=split) for j in judged]
    saturated = [j for j in judged if j.saturated]
    short = offered is not None and achieved < offered * (1 - SHORTFALL)
    if unsure:
        return replace(judged[0], saturated=False, why="", achieved_rate=achieved, unsure=unsure)
    if 2 * len(saturated) < len(judged) or (2 * len(saturated) == len(judged) and not short):
        return replace(judged[0], saturated=False, why="", achieved_rate=achieved, unsure="")
    if len(judged) == 1:
        return replace(saturated[0], achieved_rate=achieved)
    pooled = _pooled(judged, level)
    reason = saturated[0].why
    if short and offered:
        reason = pooled.why(achieved) if pooled else shortfall_text(achieved, offered)
    why = f"{reason} ({len(saturated)} of {len(judged)} runs)"
    return replace(saturated[0], why=why, achieved_rate=achieved)
