"""The sweep's rate mode (SPEC §5.13): one level per offered rate, sent open loop on an arrival
schedule, judged on achieved vs offered rate and over-saturation (``stages.open_loop``).

In flight is capped at what the ladder proved on an unmanaged server (SPEC §5.0). Every repeat
runs (a saturated run is not the end of the level: one short run is noise), and the sweep stops
at the first saturated level. How a level's runs make its verdict is ``rate_verdict``'s: a level
still unsure at ``max_repeats`` is neither kept up nor saturated: ``unsure``, the sweep's doubt
(SPEC §5.14).

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

from calibrate.config import SloConfig
from calibrate.errors import UsageError
from calibrate.gpu.vram.peaks import WindowPeak
from calibrate.load.arrivals import arrival_times, rate_text, rate_value, requests_for
from calibrate.load.items import ItemResult
from calibrate.load.keepalive_stall import find_stall
from calibrate.load.pacing import OpenRun
from calibrate.stages.measure.item_records import record_round
from calibrate.stages.measure.saturation import RateJudgement, judge
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
from calibrate.stages.sweep.rate_verdict import level_judgement, unsettled
from calibrate.stages.sweep.runner import LevelRunner, run_stats, whole_stats


def run_rate_level(sweep: LevelRunner, rate: float) -> Level:
    """``repeats`` open-loop runs at ``rate`` req/s (fewer when one fails)."""
    o = sweep.options
    runs: list[Stats] = []
    judged: list[RateJudgement] = []
    items: list[ItemResult] = []
    peaks: list[WindowPeak] = []
    repeat = 0
    random_schedule = o.arrival != "constant"  # each run its own draw (``rate_verdict``)
    # the runs after which the level may stop "kept up": its interval is shared over them
    looks = max(1, o.max_repeats - max(o.repeats, 2) + 1)
    while repeat < o.repeats or (
        unsettled(judged, o.confidence, random_schedule=random_schedule, looks=looks)
        and repeat < o.max_repeats
    ):
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
    rate_judgement = level_judgement(
        judged, achieved, o.confidence, random_schedule=random_schedule, looks=looks
    )
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
    offered = None if math.isinf(rate) else rate
    judgement = judge(run, offered, cap, o.confidence, random_schedule=o.arrival != "constant")
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
    alone = unsure if len(held) == 1 and not probe.why else ""  # failed on the doubt alone
    return replace(probe, passed=not why, why=why, unsure=alone)


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
