"""Over-saturation (SPEC §5.13): how an open-loop run is read — the rate achieved against the
rate offered, and whether the server kept up, fell behind, or calibrate itself did."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from calibrate.load.items import percentile
from calibrate.load.pacing import Answer, OpenRun

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


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def robust_slope(xs: Sequence[float], ys: Sequence[float], max_points: int = 300) -> float:
    """The Theil–Sen slope: the median of the slopes between every two points (over at most
    ``max_points`` of them, evenly spread, to bound the work). One request that hiccups
    tilts a least-squares line through ten answers; it moves this median by one place."""
    pairs = sorted(zip(xs, ys, strict=True))
    if len(pairs) > max_points:
        step = (len(pairs) - 1) / (max_points - 1)
        pairs = [pairs[round(n * step)] for n in range(max_points)]
    slopes = [
        (y2 - y1) / (x2 - x1)
        for i, (x1, y1) in enumerate(pairs)
        for x2, y2 in pairs[i + 1 :]
        if x2 > x1
    ]
    return statistics.median(slopes) if slopes else 0.0


def achieved(answers: Sequence[Answer], total_s: float) -> tuple[float, float, int]:
    """(requests/s, window, completions) of an open-loop run.

    The answers arrive over the span the requests were sent over, stretched by the trend of
    their latency: ``window = send span × (1 + slope)``, the slope of latency against send time
    fitted over every answer. A server that keeps up has a flat trend (window = send span,
    achieved = offered); one that falls behind answers each request later than the last
    (slope > 0, achieved < offered). The fit is Theil–Sen: one slow answer — which decided the
    old first-to-last-answer window on short runs, reading 9 % short at 40 % load, and would
    tilt a least-squares line through ten answers — moves it by one place. Runs sent (nearly) all at once — sends spread over less than one request's
    latency, where no trend can be fitted — use the first-to-last-answer window."""
    ok = [a for a in answers if a.ok]
    starts = [a.started_s for a in ok]
    spread = len(ok) >= 3 and max(starts) - min(starts) > statistics.median(a.elapsed_s for a in ok)
    if spread:
        slope = robust_slope(starts, [a.elapsed_s for a in ok])
        window = (max(starts) - min(starts)) * (1 + slope)
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


def shortfall_text(achieved_rate: float, offered_rate: float) -> str:
    """``achieved 4.1 req/s is 32 % below the offered 6``."""
    short = 1 - achieved_rate / offered_rate
    return f"achieved {achieved_rate:.3g} req/s is {short:.0%} below the offered {offered_rate:g}"


def judge(run: OpenRun, offered_rate: float | None, cap: int | None) -> RateJudgement:
    """Saturated when achieved falls > 5 % below offered, when the in-flight count and the
    latency keep growing through the run, or when the in-flight cap made the sends fall ever
    further behind their schedule."""
    rate, window, count = achieved(run.requests, run.total_s)
    why = late = ""
    if offered_rate is not None:
        quarter = max(1, len(run.in_flight) // 4)
        first, last = _mean(run.in_flight[:quarter]), _mean(run.in_flight[-quarter:])
        sent = _sent_late(run) if rate < offered_rate * (1 - SHORTFALL) else None
        if sent is not None and rate >= sent * (1 - SHORTFALL):
            # the server answered all that was sent: not its saturation, but the rate offered was
            # never measured either — the level is calibrate's limit, not a result
            late = f"calibrate sent only {sent:.3g} of the offered {offered_rate:g} req/s"
        elif rate < offered_rate * (1 - SHORTFALL):
            why = shortfall_text(rate, offered_rate)
        elif last >= first + GROWTH_MIN and last >= 2 * first and (grew := _latency_grew(run)):
            why = (
                f"requests in flight kept growing, {first:.1f} → {last:.1f} through the run, "
                f"and latency with them ({grew})"
            )
        elif cap is not None and _held_back(run) and (behind := _fell_behind(run)):
            why = f"the in-flight cap of {cap} held sends back: {behind}"
    lag = percentile(run.lag_s, 99) if offered_rate is not None else None
    return RateJudgement(offered_rate, rate, window, count, bool(why), why, lag, late)
