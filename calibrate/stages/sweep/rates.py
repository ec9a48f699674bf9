"""The sweep's rate mode (SPEC §5.13): one level per offered rate, sent open loop on an arrival
schedule, judged on achieved vs offered rate and over-saturation (``stages.open_loop``).

In flight is capped at what the ladder proved on an unmanaged server (SPEC §5.0). Every repeat
runs (a saturated run is not the end of the level: one short run is noise); the level is
saturated when most of its runs were, and the sweep stops at the first saturated level. A level
whose runs disagree, or whose shortfall the slope's interval over all its answers cannot tell
from 5 % (``saturation.Shortfall``), runs again up to ``max_repeats``; one still unsure then is
neither kept up nor saturated: ``unsure``, the sweep's doubt (SPEC §5.14).

**The SLO boundary over rates** (``sweep --find-max --rates``, ``next_rate``): the search of
``stages.sweep.find_max`` — ×8 up, then geometric bisection — on an offered rate in req/s, from
``bottom`` (the synchronous rate measured first, or the user's) up to ``top`` (1024× it unless
given), each rate rounded to 3 significant digits (one a user can type again), to 5 % of the
last passing rate: ≤ 10 probes on any range up to 1024× wide. A rate probe passes only when it also
kept up: a saturated level, or one this process could not send (``client_bound``), is never the
boundary (``judge_rate``). The bottom failing ends the search: nothing below it is tried.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import replace

from calibrate.confidence import DEFAULT_LEVEL
from calibrate.config import SloConfig
from calibrate.errors import UsageError
from calibrate.gpu.vram.peaks import WindowPeak
from calibrate.load.arrivals import arrival_times, rate_text, rate_value, requests_for
from calibrate.load.items import ItemResult
from calibrate.load.keepalive_stall import find_stall
from calibrate.load.pacing import OpenRun
from calibrate.stages.measure.item_records import record_round
from calibrate.stages.measure.saturation import (
    SHORTFALL,
    RateJudgement,
    judge,
    shortfall,
    shortfall_text,
)
from calibrate.stages.measure.tiers import Stats
from calibrate.stages.sweep.find_max import (
    FACTOR,
    PRECISION,
    TOP,
    Probe,
    bracket,
    judge_probe,
)
from calibrate.stages.sweep.levels import Level, level_stats
from calibrate.stages.sweep.runner import LevelRunner, run_stats, whole_stats


def run_rate_level(sweep: LevelRunner, rate: float) -> Level:
    """``repeats`` open-loop runs at ``rate`` req/s (fewer when one fails)."""
    o = sweep.options
    runs: list[Stats] = []
    judged: list[RateJudgement] = []
    items: list[ItemResult] = []
    peaks: list[WindowPeak] = []
    repeat = 0
    while repeat < o.repeats or (_unsettled(judged, o.confidence) and repeat < o.max_repeats):
        repeat += 1  # runs that disagree, or a shortfall unsure: more, to settle it (SPEC §5.14)
        stats, judgement, answered, peak = run_rate_once(sweep, rate, repeat)
        runs.append(stats)
        judged.append(judgement)
        items += answered
        peaks.append(peak)
        if stats.errors:
            break
    whole = whole_stats(o, max(r.concurrency for r in runs), runs, items, peaks)
    achieved = statistics.median(j.achieved_rate for j in judged)
    rate_judgement = _level_judgement(judged, achieved, o.confidence)
    return Level(
        level_stats(whole, runs),
        tuple(runs),
        None,
        False,
        "fail" if whole.errors else "pass",
        sweep.cap is not None and whole.concurrency > sweep.cap.slots,
        rate_judgement,
        stall=find_stall([i.elapsed_s for i in items if i.ok]),
        client_bound=next((j.client_late for j in judged if j.client_late), ""),
    )


def _mixed(judged: Sequence[RateJudgement]) -> bool:
    """Some runs of the level saturated and some did not."""
    saturated = sum(j.saturated for j in judged)
    return 0 < saturated < len(judged)


def _unsure(judged: Sequence[RateJudgement], level: float, achieved: float | None = None) -> str:
    """Why the level's shortfall is unsure, pooled over its runs' answers ("" when sure, or
    when most runs saturated on another rule): the slope's interval straddles 5 %. Said at
    ``achieved``, the level's (its runs' median unless given)."""
    offered = judged[0].offered_rate if judged else None
    trends = [j.trend for j in judged if j.trend is not None]
    if offered is None or not trends or 2 * sum(j.saturated for j in judged) > len(judged):
        return ""
    pooled = shortfall(trends, offered, level)
    if pooled is None or pooled.surely_short or pooled.surely_within:
        return ""
    if achieved is None:
        achieved = statistics.median(j.achieved_rate for j in judged)
    return pooled.text(achieved)


def _resolved(judged: Sequence[RateJudgement], level: float) -> list[RateJudgement]:
    """The runs, those unsure alone counted saturated when all the level's answers put it
    surely more than 5 % short (their pooled slope's interval)."""
    offered = judged[0].offered_rate if judged else None
    trends = [j.trend for j in judged if j.trend is not None]
    pooled = shortfall(trends, offered, level) if offered is not None and trends else None
    if offered is None or pooled is None or not pooled.surely_short:
        return list(judged)
    why = pooled.why(statistics.median(j.achieved_rate for j in judged))
    return [replace(j, saturated=True, why=why, unsure="") if j.unsure else j for j in judged]


def _unsettled(judged: Sequence[RateJudgement], level: float) -> bool:
    """Runs that disagree, or a shortfall not yet sure over all the level's answers."""
    resolved = _resolved(judged, level)
    return _mixed(resolved) or bool(_unsure(resolved, level))


def _level_judgement(
    judged: list[RateJudgement], achieved: float, level: float = DEFAULT_LEVEL
) -> RateJudgement:
    """Saturated when most of the level's runs were (one run of three that fell short on a
    burst is noise, not a result); a tie is settled by the level's median achieved rate, the
    number the table shows. The why names how many runs, and a shortfall is the level's own:
    its median, not the first short run's rate (which read 81.1 req/s beside a table's 73.2).
    A shortfall the slope's interval over all the level's answers cannot tell from 5 % is
    neither: the level is ``unsure`` and says the interval (runs unsure alone are not saturated;
    pooled surely short, they count as saturated; a queue that decided it is said)."""
    lags = [j.send_lag_p99_s for j in judged if j.send_lag_p99_s is not None]
    judged = [replace(j, send_lag_p99_s=max(lags, default=None)) for j in judged]
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
    trends = [j.trend for j in judged if j.trend is not None]
    pooled = shortfall(trends, offered, level) if offered and trends else None
    reason = saturated[0].why
    if short and offered:
        reason = pooled.why(achieved) if pooled else shortfall_text(achieved, offered)
    why = f"{reason} ({len(saturated)} of {len(judged)} runs)"
    return replace(saturated[0], why=why, achieved_rate=achieved)


def run_rate_once(
    sweep: LevelRunner, rate: float, repeat: int
) -> tuple[Stats, RateJudgement, list[ItemResult], WindowPeak]:
    """One open-loop run at ``rate``: its schedule seeded by the repeat, its achieved rate the
    answers' own window."""
    ctx, o = sweep.ctx, sweep.options
    cap = o.max_in_flight
    count = requests_for(rate, o.level_s, cap or o.batch_size)
    requests = sweep.numbered(sweep.level_requests(count, count))
    schedule = arrival_times(
        rate,
        len(requests),
        arrival=o.arrival,
        burstiness=o.burstiness,
        seed=o.seed + repeat,
        job_gaps=o.job_gaps,
    )
    mark = sweep.noise.mark() if sweep.noise is not None else None  # the machine meanwhile
    idle = sweep.monitor.open_window()
    in_flight_cap = cap if cap is not None or not math.isinf(rate) else len(requests)
    run = sweep.sender.open_loop(requests, schedule, in_flight_cap, ctx.params.max_tokens)
    peak = sweep.monitor.close_window(idle)
    noise = sweep.noise.since(mark) if sweep.noise is not None and mark is not None else None
    highest = max(run.in_flight, default=0) + 1
    label, tags = f"r{rate_text(rate)}", {"offered_rate": rate_value(rate)}
    items = sweep.keep(list(run.items), highest, repeat, peak, label, tags)
    judgement = judge(run, None if math.isinf(rate) else rate, cap, o.confidence)
    stats = run_stats(
        o,
        highest,
        repeat,
        items,
        run.total_s,
        peak,
        items_per_s=judgement.achieved_rate * o.prompts_per_request,
        output_tokens_per_s=_tokens_per_s(run, judgement),
        window=_window_items(run),
        window_s=judgement.window_s,
    )
    stats = replace(stats, noise=noise)  # a rate's doubt names it, as a concurrency's does
    record_round(
        ctx,
        stats,
        sweep.monitor.source,
        offered_rate=rate_value(judgement.offered_rate),
        achieved_rate=round(judgement.achieved_rate, 6),
        saturated=judgement.saturated,
        send_lag_p99_s=judgement.send_lag_p99_s,
        capped_s=round(run.capped_s, 6),
    )
    return stats, judgement, items, peak


def _window_items(run: OpenRun) -> list[ItemResult]:
    """The items of the answers after the first (the achieved rate's window): a prompt list's
    first answer carries several items, and all of them are left out, as its one request is."""
    ok = sorted((i for i in run.items if i.ok), key=lambda i: i.done_s)
    later = [i for i in ok if i.done_s > ok[0].done_s] if ok else []
    return later or ok


def _tokens_per_s(run: OpenRun, judgement: RateJudgement) -> float:
    tokens = sum(i.completion_tokens for i in _window_items(run))
    return tokens / judgement.window_s if judgement.window_s > 0 else 0.0


def next_rate(history: Sequence[Probe], bottom: float, top: float) -> float | None:
    """The next offered rate (req/s) to probe on [bottom, top], or None when the boundary is
    found or the bottom already failed (see the module's doc)."""
    if not history:
        return round_rate(bottom)
    passing, failing = bracket(history)
    if failing is None:
        assert passing is not None
        return None if passing >= top else min(round_rate(passing * FACTOR), top)
    if passing is None or failing - passing <= PRECISION * passing:
        return None
    middle = math.sqrt(passing * failing)
    rounded = round_rate(middle)
    return rounded if passing < rounded < failing else middle


def round_rate(rate: float) -> float:
    """A rate to 3 significant digits: one a user can give ``--rates`` again."""
    return float(f"{rate:.3g}")


def judge_rate(
    rate: float,
    runs: Sequence[Stats],
    slo: SloConfig,
    saturated: str,
    client_bound: str,
    unsure: str = "",
) -> Probe:
    """A rate level's runs: the probe rule, and it passes only when it surely kept up — not
    saturated (``saturated``: why it was), its shortfall not unsure (``unsure``: its interval),
    and sent by this process at the rate (``client_bound``)."""
    probe = judge_probe(rate, runs, slo)
    held = [
        *([f"client-bound: {client_bound}"] if client_bound else []),
        *([f"saturated: {saturated}"] if saturated else []),
        *([f"not sure it kept up: {unsure}"] if unsure else []),
    ]
    why = "; ".join([probe.why, *held] if probe.why else held)
    return replace(probe, passed=not why, why=why)


def parse_rate_range(text: str) -> tuple[float, float]:
    """``--find-max --rates``: ``auto`` (from the synchronous rate, up to 1024× it: (0, 0)) or
    ``LO:HI`` req/s, at most 1024× wide (≤ 10 probes); exit 2 on anything else."""
    if text.strip().lower() == "auto":
        return 0.0, 0.0
    low, _, high = text.partition(":")
    try:
        span = float(low), float(high)
    except ValueError:
        span = math.nan, math.nan
    if not all(math.isfinite(r) and r > 0 for r in span) or not span[0] < span[1]:
        raise UsageError(
            f"--find-max --rates {text!r}: give the range to search as LO:HI req/s (0 < LO < HI), "
            "or auto",
            "e.g. calibrate sweep --find-max --rates auto   or   --find-max --rates 1:200",
        )
    if span[1] > span[0] * TOP:
        raise UsageError(
            f"--find-max --rates {text!r}: at most {TOP}× wide ({span[1] / span[0]:.0f}× given), "
            "so the search ends within 10 probes",
            f"e.g. --find-max --rates {span[0]:g}:{span[0] * TOP:g}",
        )
    return span
