"""Open-loop load (SPEC §5.13): requests sent on a schedule whatever the answers, and the rules
that read such a run — achieved vs offered rate, and over-saturation.

The dispatcher sends request n at ``schedule[n]`` seconds (handed to the I/O loop where the client
can, else a thread each), never holding more than ``cap`` in flight (SPEC §5.0: an unmanaged server gets no more at once than the ladder proved);
when the cap holds a request back, the time it waited is counted. A failed answer stops further
sends: more load only adds noise. Clock and sleep are injectable.
"""

from __future__ import annotations

import functools
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from calibrate.load.items import ItemResult, percentile

Clock = Callable[[], float]
Sleep = Callable[[float], None]
SHORTFALL = 0.05  # achieved more than 5 % below offered: saturated
GROWTH_MIN = 2.0  # in flight grew by at least this many requests (and doubled) through the run
LATENCY_GROWTH = 0.25  # … and the last sent quarter's median latency is this much above the first's


@dataclass(frozen=True)
class Answer:
    """One request's answer as the rate rules read it (a prompt list of B is one request)."""

    started_s: float
    elapsed_s: float
    ok: bool

    @property
    def done_s(self) -> float:
        return self.started_s + self.elapsed_s

    @classmethod
    def of(cls, items: Sequence[ItemResult]) -> Answer:
        """The request ``items`` came back from: sent at the first's start, done at the last."""
        started = min(i.started_s for i in items)
        return cls(started, max(i.done_s for i in items) - started, all(i.ok for i in items))


@dataclass(frozen=True)
class OpenRun:
    """One open-loop run: every item, and what the dispatcher saw."""

    items: tuple[ItemResult, ...]
    total_s: float
    last_send_s: float  # when the last request went out
    in_flight: tuple[int, ...]  # requests in flight just before each send
    capped_s: float  # time sends waited on the in-flight cap
    lag_s: tuple[float, ...] = ()  # how late each send went out against its schedule
    answers: tuple[Answer, ...] = ()  # one per request (empty: one per item, a request each)

    @property
    def requests(self) -> tuple[Answer, ...]:
        """The answers per request — what a rate in requests/s is measured against."""
        return self.answers or tuple(Answer.of([i]) for i in self.items)


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
            why = (
                f"achieved {rate:.3g} req/s is {1 - rate / offered_rate:.0%} below the offered "
                f"{offered_rate:g}"
            )
        elif last >= first + GROWTH_MIN and last >= 2 * first and (grew := _latency_grew(run)):
            why = (
                f"requests in flight kept growing, {first:.1f} → {last:.1f} through the run, "
                f"and latency with them ({grew})"
            )
        elif cap is not None and _held_back(run) and (behind := _fell_behind(run)):
            why = f"the in-flight cap of {cap} held sends back: {behind}"
    lag = percentile(run.lag_s, 99) if offered_rate is not None else None
    return RateJudgement(offered_rate, rate, window, count, bool(why), why, lag, late)


def open_loop(
    send_one: Callable[[int, float], list[ItemResult]],
    schedule: Sequence[float],
    cap: int | None,
    *,
    clock: Clock = time.perf_counter,
    sleep: Sleep = time.sleep,
    join_s: float = 600.0,
    unanswered: Callable[[int, float], list[ItemResult]] | None = None,
    submit_one: Callable[[int, float, Callable[[list[ItemResult]], None]], None] | None = None,
) -> OpenRun:
    """Send request n (``send_one(n, t0)``) at ``schedule[n]`` s after the start, at most ``cap``
    in flight; wait for the answers. ``send_one`` times its items from ``t0``. With
    ``submit_one(n, t0, finish)`` no thread is started per send: it hands the request off and
    returns, and ``finish(items)`` is called (from any thread) once it is answered. A request
    sent but never answered — its worker raised, or was still stuck after ``join_s`` — is never
    dropped: ``unanswered(n, t0)`` stands in for its answer (a recorded failure)."""
    start = clock()
    lock = threading.Condition()
    results: list[ItemResult] = []
    answers: list[Answer] = []
    in_flight = 0
    seen: list[int] = []
    lags: list[float] = []
    capped_s = 0.0
    failed = False
    threads: list[threading.Thread] = []
    sent = settled = 0

    done: set[int] = set()

    def take(n: int, answered: list[ItemResult]) -> None:
        nonlocal failed
        done.add(n)
        results.extend(answered)
        if answered:
            answers.append(Answer.of(answered))
        failed = failed or any(not a.ok for a in answered)

    def finished(n: int, answered: list[ItemResult] | None) -> None:
        nonlocal in_flight, failed, settled
        with lock:
            in_flight -= 1
            settled += 1
            if answered is None:
                failed = True  # a failure: nothing more is sent
            else:
                take(n, answered)
            lock.notify_all()

    def work(n: int) -> None:
        answered: list[ItemResult] | None
        try:
            answered = send_one(n, start)
        except Exception:  # answered by ``unanswered`` below; the slot is freed all the same
            answered = None
        finished(n, answered)

    last_send = 0.0
    for n, at in enumerate(schedule):
        wait = at - (clock() - start)
        if wait > 0:
            sleep(wait)
        with lock:
            if failed:
                break
            if cap is not None and in_flight >= cap:
                held = clock()
                while in_flight >= cap:
                    lock.wait(0.05)
                capped_s += clock() - held
            seen.append(in_flight)
            in_flight += 1
        last_send = clock() - start
        lags.append(max(0.0, last_send - at))
        sent += 1
        if submit_one is not None:
            try:
                submit_one(n, start, functools.partial(finished, n))
            except Exception:  # not sent after all: answered by ``unanswered`` below
                finished(n, None)
            continue
        thread = threading.Thread(target=work, args=(n,), name=f"calibrate-open-{n}", daemon=True)
        threads.append(thread)
        thread.start()
    deadline = time.monotonic() + join_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    with lock:
        while settled < sent and (left_s := deadline - time.monotonic()) > 0:
            lock.wait(min(left_s, 0.5))
        for n in range(sent):
            if n not in done and unanswered is not None:
                take(n, unanswered(n, start))
        items = tuple(sorted(results, key=lambda r: r.index))
        return OpenRun(
            items, clock() - start, last_send, tuple(seen), capped_s, tuple(lags), tuple(answers)
        )
