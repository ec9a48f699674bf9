"""Over-saturation (SPEC §5.13): how an open-loop run is read — the rate achieved against the
rate offered, and whether the server kept up, fell behind, or calibrate itself did.

The shortfall is only as sure as the slope it rests on (SPEC §5.14): a latency trend fitted over
eight answers with ordinary jitter can stretch the window by anywhere from −10 % to +15 %, so a
run is saturated on the shortfall only when even the slope's lower bound (Sen 1968, at the
``[confidence]`` level) leaves it more than 5 % short, kept up only when even the upper bound
leaves it within 5 %, and unsure otherwise (``Shortfall``). A queue that only starts to form
halfway through a run leaves its early answers waiting alike, and Sen's lower bound at 0; so a
run the slope reads short is saturated too when the slope from its first half of answers to its
last (``latency_trend.queue_interval``) surely leaves it short. A level pools its runs' answers
(the pairs within each run), so its repeats narrow both intervals."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from calibrate.confidence import DEFAULT_LEVEL
from calibrate.load.items import percentile
from calibrate.load.pacing import Answer, OpenRun
from calibrate.stages.measure.latency_trend import (
    SlopeInterval,
    Trend,
    least_squares_slope,
    queue_interval,
    robust_slope,
    sen_interval,
    trend_of,
)

SHORTFALL = 0.05  # achieved more than 5 % below offered: saturated
GROWTH_MIN = 2.0  # in flight grew by at least this many requests (and doubled) through the run
LATENCY_GROWTH = 0.25  # … and the last sent quarter's median latency is this much above the first's


@dataclass(frozen=True)
class RateJudgement:
    """Achieved vs offered, and whether the server kept up."""

    offered_rate: float | None  # None: inf (everything at once)
    achieved_rate: float
    window_s: float
    completions: int
    saturated: bool
    why: str  # in words when saturated, else ""
    send_lag_p99_s: float | None = None  # how late sends went out (waiting on the in-flight cap)
    client_late: str = (
        ""  # why this process, not the server, fell short of the rate ("" = it did not)
    )
    split: tuple[int, int] = (0, 1)  # a level's (runs that saturated, runs): mixed is unsure
    unsure: str = ""  # why the shortfall could not be told from 5 %, in words ("" = it could)
    cap: int | None = None  # the in-flight cap it was sent under (None: none)
    peak_in_flight: int = 0  # the most requests in flight at once
    # the run's latency against send time, which the level pools (None: sent all at once)
    trend: Trend | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Shortfall:
    """Achieved against offered with the slope's interval: short (> 5 % below offered), within,
    or unsure — the interval straddling the 5 % line."""

    send_rate: float
    trend: SlopeInterval
    offered: float
    level: float
    queue: SlopeInterval | None = None  # the first half of the answers against the last

    def achieved_at(self, slope: float) -> float:
        return self.send_rate / (1 + slope) if slope > -1 else math.inf

    @property
    def line(self) -> float:
        return self.offered * (1 - SHORTFALL)

    @property
    def surely_short(self) -> bool:
        """Even the slope's lower bound (the highest achieved rate) is more than 5 % short, or
        the slope reads it so and a queue surely forms: even the lower bound of the slope from
        the first half of the answers to the last leaves it more than 5 % short."""
        return self.achieved_at(self.trend.low) < self.line or self.queue_short

    @property
    def queue_short(self) -> bool:
        """Short on the queue's interval, not on Sen's (``why`` says so)."""
        q = self.queue
        return (
            q is not None
            and self.achieved_at(self.trend.slope) < self.line
            and self.achieved_at(q.low) < self.line <= self.achieved_at(self.trend.low)
        )

    def why(self, achieved_rate: float) -> str:
        """``achieved 21.1 req/s is 11% below the offered 23.7``, and when a forming queue
        decided it, ``; a queue formed: the last half of the answers waited longer than the
        first, at least 13% below over 48 answers (6 runs, 95%)``."""
        said = shortfall_text(achieved_rate, self.offered)
        if not self.queue_short or self.queue is None:
            return said
        q = self.queue
        runs = f"{q.runs} run{'s' if q.runs != 1 else ''}"
        return (
            f"{said}; a queue formed: the last half of the answers waited longer than the first, "
            f"at least {off_text(self.achieved_at(q.low), self.offered)} over {q.answers} answers "
            f"({runs}, {self.level:.0%})"
        )

    @property
    def surely_within(self) -> bool:
        """Even the slope's upper bound (the lowest achieved rate) is within 5 %."""
        return self.achieved_at(self.trend.high) >= self.line

    def text(self, achieved_rate: float) -> str:
        """``achieved 9.35 req/s, 6 % below the offered 10 — anywhere from 3 % above to 16 %
        below over 8 answers (1 run, 95 %), across the 5 % line``."""
        t = self.trend
        runs = f"{t.runs} run{'s' if t.runs != 1 else ''}"
        if not (math.isfinite(t.low) and math.isfinite(t.high)):
            return (
                f"achieved {achieved_rate:.3g} req/s, {off_text(achieved_rate, self.offered)} the "
                f"offered {self.offered:g} — {t.answers} answers ({runs}) are too few to bound "
                f"it at {self.level:.0%}, either side of the {SHORTFALL:.0%} line"
            )
        low, high = self.achieved_at(t.low), self.achieved_at(t.high)
        return (
            f"achieved {achieved_rate:.3g} req/s, {off_text(achieved_rate, self.offered)} the "
            f"offered {self.offered:g} — anywhere from {off_text(low, self.offered)} to "
            f"{off_text(high, self.offered)} over {t.answers} answers ({runs}, "
            f"{self.level:.0%}), across the {SHORTFALL:.0%} line"
        )


def off_text(rate: float, offered: float) -> str:
    """``6 % below``, ``3 % above``."""
    if math.isinf(rate):
        return "∞ above"
    gap = rate / offered - 1
    return f"{abs(gap):.0%} {'above' if gap > 0 else 'below'}"


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def shortfall(
    trends: Sequence[Trend], offered_rate: float, level: float = DEFAULT_LEVEL
) -> Shortfall | None:
    """The runs' shortfall with its interval (their median send rate, their pooled slope)."""
    found = sen_interval(trends, level)
    if found is None:
        return None
    send = statistics.median(t.send_rate for t in trends)
    return Shortfall(send, found, offered_rate, level, queue_interval(trends, level))


def achieved(
    answers: Sequence[Answer], total_s: float, *, random_schedule: bool = False
) -> tuple[float, float, int]:
    """(requests/s, window, completions) of an open-loop run.

    The answers arrive over the span the requests were sent over, stretched by the trend of
    their latency: ``window = send span × (1 + slope)``, the slope of latency against send time
    fitted over every answer. A server that keeps up has a flat trend (window = send span,
    achieved = offered); one that falls behind answers each request later than the last
    (slope > 0, achieved < offered). The fit is Theil–Sen: one slow answer — which decided the
    old first-to-last-answer window on short runs, reading 9 % short at 40 % load, and would
    tilt a least-squares line through ten answers — moves it by one place. A run of a random
    schedule is least squares' (``latency_trend.least_squares_slope``): its level judges its
    runs together, their spread taking in the slow answer. Runs sent (nearly)
    all at once — sends spread over less than one request's latency, where no trend can be
    fitted — use the first-to-last-answer window."""
    ok = [a for a in answers if a.ok]
    trend = trend_of(answers)
    if trend is not None:
        fit = least_squares_slope if random_schedule else robust_slope
        slope = fit(trend.starts, trend.latencies)
        window = (max(trend.starts) - min(trend.starts)) * (1 + slope)
        if window > 0:
            return (len(ok) - 1) / window, window, len(ok) - 1
    done = sorted(a.done_s for a in ok)
    if len(done) >= 2 and done[-1] > done[0]:
        span = done[-1] - done[0]
        return (len(done) - 1) / span, span, len(done) - 1
    return (len(done) / total_s if total_s > 0 else 0.0), total_s, len(done)


def _latency_grew(run: OpenRun) -> str:
    """``0.06 → 0.19 s median latency`` when the last quarter of the answers (by send time) took
    25 % longer than the first; "" otherwise. A queue that really grows makes each request wait
    longer; a count that rises only because a short Poisson run started from nothing does not."""
    ok = sorted((a for a in run.requests if a.ok), key=lambda a: a.started_s)
    quarter = max(1, len(ok) // 4)
    if len(ok) < 4:
        return ""
    early = statistics.median(a.elapsed_s for a in ok[:quarter])
    late = statistics.median(a.elapsed_s for a in ok[-quarter:])
    if late < early * (1 + LATENCY_GROWTH):
        return ""
    return f"{early:.3g} → {late:.3g} s median latency"


def _fell_behind(run: OpenRun) -> str:
    """``the last sends went out 0.4 s late (20 % of the run)`` when, by the last quarter of the
    sends, the dispatcher had fallen behind its schedule by more than 5 % of the run (the same
    share as the achieved-rate rule); "" otherwise. A cap that holds a burst back for a moment
    is a queue that drains; one the schedule falls ever further behind is saturation."""
    quarter = max(1, len(run.lag_s) // 4)
    if len(run.lag_s) < 4 or run.last_send_s <= 0:
        return ""
    late = _mean(run.lag_s[-quarter:]) - _mean(run.lag_s[:quarter])
    if late <= SHORTFALL * run.last_send_s:
        return ""
    return f"the last sends went out {late:.2g} s late ({late / run.last_send_s:.0%} of the run)"


def _held_back(run: OpenRun) -> bool:
    """The in-flight cap held the sends back for more than 5 % of the run."""
    return run.capped_s > SHORTFALL * run.last_send_s


def _sent_late(run: OpenRun) -> float | None:
    """The rate the sends really went out at, when this process, not the server, fell behind:
    the sends went out ever later against their schedule (a busy CPU, a stalled thread) without
    the in-flight cap holding them back. None when the sends kept to their schedule."""
    starts = [a.started_s for a in run.requests if a.ok]
    if len(starts) < 3 or max(starts) <= min(starts) or len(run.lag_s) < 4:
        return None
    quarter = max(1, len(run.lag_s) // 4)
    late_s = _mean(run.lag_s[-quarter:]) - _mean(run.lag_s[:quarter])
    if late_s <= SHORTFALL * run.last_send_s or _held_back(run):
        return None
    return (len(starts) - 1) / (max(starts) - min(starts))


def _sent_short(run: OpenRun, offered_rate: float) -> float | None:
    """The rate the sends really went out at when it fell more than 5 % short of the offered one
    without the in-flight cap holding them back: the sends are stamped as they go out, and a busy
    machine can hold them back after the dispatcher let them go (its lags read on time), so only
    this process can have made them short — on a random schedule too, whose draws are rescaled to
    span exactly the offered rate (``load.arrivals``). None when they kept up."""
    starts = [a.started_s for a in run.requests if a.ok]
    if len(starts) < 3 or max(starts) <= min(starts) or _held_back(run):
        return None
    rate = (len(starts) - 1) / (max(starts) - min(starts))
    return rate if rate < offered_rate * (1 - SHORTFALL) else None


def shortfall_text(achieved_rate: float, offered_rate: float) -> str:
    """``achieved 4.1 req/s is 32 % below the offered 6``."""
    short = 1 - achieved_rate / offered_rate
    return f"achieved {achieved_rate:.3g} req/s is {short:.0%} below the offered {offered_rate:g}"


def judge(
    run: OpenRun,
    offered_rate: float | None,
    cap: int | None,
    level: float = DEFAULT_LEVEL,
    *,
    random_schedule: bool = False,
) -> RateJudgement:
    """Saturated when achieved falls surely > 5 % below offered (``Shortfall``), when the
    in-flight count and the latency keep growing through the run, or when the in-flight cap made
    the sends fall ever further behind their schedule; unsure (``unsure``) when none of these
    holds and the slope's interval leaves the shortfall on both sides of 5 %. A run of a random
    schedule reads its achieved rate by least squares (``achieved``)."""
    rate, window, count = achieved(run.requests, run.total_s, random_schedule=random_schedule)
    trend = trend_of(run.requests)
    why = late = unsure = ""
    if offered_rate is not None:
        quarter = max(1, len(run.in_flight) // 4)
        first, last = _mean(run.in_flight[:quarter]), _mean(run.in_flight[-quarter:])
        short = shortfall([trend], offered_rate, level) if trend is not None else None
        sent = _sent_late(run) if rate < offered_rate * (1 - SHORTFALL) else None
        if sent is None and rate < offered_rate * (1 - SHORTFALL):
            sent = _sent_short(run, offered_rate)
        if sent is not None and rate >= sent * (1 - SHORTFALL):
            # the server answered all that was sent: not its saturation, but the rate offered was
            # never measured either — the level is calibrate's limit, not a result
            late = f"calibrate sent only {sent:.3g} of the offered {offered_rate:g} req/s"
        elif rate < offered_rate * (1 - SHORTFALL) and (short is None or short.surely_short):
            why = short.why(rate) if short is not None else shortfall_text(rate, offered_rate)
        elif last >= first + GROWTH_MIN and last >= 2 * first and (grew := _latency_grew(run)):
            why = (
                f"requests in flight kept growing, {first:.1f} → {last:.1f} through the run, "
                f"and latency with them ({grew})"
            )
        elif cap is not None and _held_back(run) and (behind := _fell_behind(run)):
            why = f"the in-flight cap of {cap} held sends back: {behind}"
        elif short is not None and not short.surely_short and not short.surely_within:
            unsure = short.text(rate)
    lag = percentile(run.lag_s, 99) if offered_rate is not None else None
    return RateJudgement(
        offered_rate,
        rate,
        window,
        count,
        bool(why),
        why,
        lag,
        late,
        unsure=unsure,
        cap=cap,
        peak_in_flight=max(run.in_flight, default=0) + 1,
        trend=trend,
    )
