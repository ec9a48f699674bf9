"""An open-loop run's latency against send time, and the slope of that trend with its interval:
what a rate level's achieved rate rests on (``saturation``).

The slope is Theil–Sen's (the median of the pairwise slopes: one answer that hiccups moves it by
one place); its interval is Sen's (1968), from the ranks of the pairwise slopes around it at the
``[confidence]`` level, pooled over the pairs within each of a level's runs, so repeats narrow it.
A queue that forms halfway is read across each run's halves (``queue_interval``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from calibrate.confidence import DEFAULT_LEVEL
from calibrate.load.pacing import Answer


@dataclass(frozen=True)
class Trend:
    """An open-loop run's answers as its achieved rate reads them: latency against send time."""

    starts: tuple[float, ...]
    latencies: tuple[float, ...]

    @property
    def send_rate(self) -> float:
        """The rate the requests went out at: (n − 1) / send span."""
        return (len(self.starts) - 1) / (max(self.starts) - min(self.starts))


@dataclass(frozen=True)
class SlopeInterval:
    """The Theil–Sen slope of latency against send time with its interval (Sen 1968)."""

    slope: float
    low: float
    high: float
    answers: int
    runs: int


def _points(xs: Sequence[float], ys: Sequence[float], max_points: int) -> list[tuple[float, float]]:
    """The points sorted by x, at most ``max_points`` of them, evenly spread (to bound the work)."""
    pairs = sorted(zip(xs, ys, strict=True))
    if len(pairs) > max_points:
        step = (len(pairs) - 1) / (max_points - 1)
        pairs = [pairs[round(n * step)] for n in range(max_points)]
    return pairs


def _slopes(pairs: Sequence[tuple[float, float]]) -> list[float]:
    return [
        (y2 - y1) / (x2 - x1)
        for i, (x1, y1) in enumerate(pairs)
        for x2, y2 in pairs[i + 1 :]
        if x2 > x1
    ]


def robust_slope(xs: Sequence[float], ys: Sequence[float], max_points: int = 300) -> float:
    """The Theil–Sen slope: the median of the slopes between every two points (over at most
    ``max_points`` of them, evenly spread, to bound the work). One request that hiccups
    tilts a least-squares line through ten answers; it moves this median by one place."""
    slopes = _slopes(_points(xs, ys, max_points))
    return statistics.median(slopes) if slopes else 0.0


def least_squares_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope: every answer weighs in, a request that waited for a slot too.
    A run of a random schedule is one draw among its level's runs, which are judged together
    (their spread is the interval): there the median of the pairwise slopes is biased — where
    most answers tie, as a server's do that answers alike until a clump of sends waits, it reads
    0 with three of eight answers 35 % late."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    return math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0


def sen_interval(
    trends: Sequence[Trend], level: float = DEFAULT_LEVEL, max_points: int = 300
) -> SlopeInterval | None:
    """The Theil–Sen slope over the pairs within each run, with Sen's (1968) interval: the
    sorted pairwise slopes ranked (N ∓ C) / 2 around their median, C = z · sqrt(Σ n(n − 1)(2n
    + 5) / 18) — Kendall's S summed over the runs, as each run's clock starts anew. One run's
    slope is ``robust_slope``'s; None when no run has two answers sent apart."""
    slopes: list[float] = []
    variance = 0.0
    for trend in trends:
        pairs = _points(trend.starts, trend.latencies, max_points)
        n = len(pairs)
        slopes += _slopes(pairs)
        variance += n * (n - 1) * (2 * n + 5) / 18
    return _ranked(slopes, variance, level, trends)


def queue_interval(
    trends: Sequence[Trend], level: float = DEFAULT_LEVEL, max_points: int = 300
) -> SlopeInterval | None:
    """The slope from each run's first half of answers (by send time) to its last half, with
    its interval: the slopes of the pairs across the halves ranked as Mann–Whitney's U between
    the halves' residuals, C = z · sqrt(Σ m²(2m + 1) / 3). A queue that only starts to form
    halfway flattens Sen's interval down to 0 (its early answers wait alike: a third of the
    pairs' slopes are 0); across the halves every pair sees it. None when no run has four."""
    slopes: list[float] = []
    variance = 0.0
    for trend in trends:
        pairs = _points(trend.starts, trend.latencies, max_points)
        m = len(pairs) // 2
        early, late = pairs[:m], pairs[len(pairs) - m :]
        slopes += [(y2 - y1) / (x2 - x1) for x1, y1 in early for x2, y2 in late if x2 > x1]
        variance += m * m * (2 * m + 1) / 3 if m >= 2 else 0.0
    return _ranked(slopes, variance, level, trends) if variance else None


def _ranked(
    slopes: list[float], variance: float, level: float, trends: Sequence[Trend]
) -> SlopeInterval | None:
    """The slopes' median, and the interval ranked (N ∓ C) / 2 around it, C = z · sqrt(variance).
    A rank past either end leaves that side unbounded (∓ inf): four answers of one run (six
    slopes) cannot bound a slope at 95 % — their lowest slope as the bound read a shortfall
    "surely" past 5 % from four answers that rose with a busy machine's jitter."""
    if not slopes:
        return None
    slopes.sort()
    total = len(slopes)
    c = statistics.NormalDist().inv_cdf((1 + level) / 2) * math.sqrt(variance)
    below, above = round((total - c) / 2) - 1, round((total + c) / 2)
    low = slopes[below] if below >= 0 else -math.inf
    high = slopes[above] if above <= total - 1 else math.inf
    answers = sum(len(t.starts) for t in trends)
    return SlopeInterval(statistics.median(slopes), low, high, answers, len(trends))


def trend_of(answers: Sequence[Answer]) -> Trend | None:
    """The run's latency against send time, when its sends were spread over more than one
    request's latency (else no trend can be fitted: None)."""
    ok = [a for a in answers if a.ok]
    starts = [a.started_s for a in ok]
    if len(ok) < 3 or not max(starts) - min(starts) > statistics.median(a.elapsed_s for a in ok):
        return None
    return Trend(tuple(starts), tuple(a.elapsed_s for a in ok))
