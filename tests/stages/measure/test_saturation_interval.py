"""A rate run's shortfall is as sure as the slope it rests on (SPEC §5.13, §5.14): Sen's interval
for the Theil–Sen slope of latency against send time decides saturated, kept up, or unsure —
scripted answers, no server, no clock."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import pytest

from calibrate.load.arrivals import arrival_times
from calibrate.load.pacing import Answer, OpenRun
from calibrate.stages.measure.latency_trend import (
    Trend,
    queue_interval,
    robust_slope,
    sen_interval,
)
from calibrate.stages.measure.saturation import RateJudgement, judge
from calibrate.stages.sweep.rate_verdict import level_judgement as _level_judgement
from calibrate.stages.sweep.rate_verdict import unsettled as _unsettled

# ±40 ms of latency jitter over a 0.12 s answer, as a loaded 2-core machine added to the mock
JITTER = (0.0, 0.04, -0.03, 0.05, -0.04, 0.03, 0.02, 0.04)


def _run(rate: float, latencies: Sequence[float]) -> OpenRun:
    """Sends at ``rate`` req/s on schedule, one request in flight at a time (no queue)."""
    starts = [n / rate for n in range(len(latencies))]
    answers = tuple(Answer(s, e, True) for s, e in zip(starts, latencies, strict=True))
    zeros = (0.0,) * len(starts)
    return OpenRun(
        (), starts[-1] + latencies[-1], starts[-1], (1,) * len(starts), 0.0, zeros, answers
    )


def test_one_runs_interval_is_theil_sen_with_sens_ranks_around_it() -> None:
    """Eight answers: the slope is ``robust_slope``'s, and the 95 % interval spans the 6th to
    the 23rd of the 28 pairwise slopes (C = 1.96 · sqrt(8·7·21/18) ≈ 15.8); a straight line's
    interval is the line itself."""
    xs = [n / 10 for n in range(8)]
    ys = [0.12 + j for j in JITTER]
    found = sen_interval([Trend(tuple(xs), tuple(ys))])
    assert found is not None and found.answers == 8 and found.runs == 1
    assert found.slope == pytest.approx(robust_slope(xs, ys))
    slopes = sorted((ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(8) for j in range(i + 1, 8))
    assert (found.low, found.high) == (slopes[5], slopes[22])
    line = sen_interval([Trend(tuple(xs), tuple(0.1 + 0.2 * x for x in xs))])
    assert line is not None and line.low == pytest.approx(0.2) == pytest.approx(line.high)


def test_eight_jittery_answers_of_a_server_that_keeps_up_are_not_saturated() -> None:
    """The loaded-machine case: 10 req/s offered to a mock serving ~33 req/s, eight answers of
    0.12 s ± 40 ms. The slope reads the run 7 % short — before, "saturated at 10 req/s: achieved
    9.33 req/s is 7% below the offered 10", exit 1 — but its interval reaches well above the
    offered rate: unsure, said with the interval, never saturated."""
    latencies = [0.12 + j + 0.003 * n for n, j in enumerate(JITTER)]
    judged = judge(_run(10.0, latencies), 10.0, 4)
    assert judged.achieved_rate < 9.5, "the point estimate is more than 5 % short"
    assert not judged.saturated and judged.why == ""
    assert judged.unsure.startswith(f"achieved {judged.achieved_rate:.3g} req/s, ")
    assert "over 8 answers (1 run, 95%), across the 5% line" in judged.unsure
    assert "above to " in judged.unsure, judged.unsure


def test_a_4_percent_shortfall_from_eight_answers_is_no_surer_kept_up() -> None:
    """The other direction: eight jittery answers reading 4 % short are not "kept up" either."""
    shifted = JITTER[1:] + JITTER[:1]
    latencies = [0.12 + j + 0.006 * n for n, j in enumerate(shifted)]
    judged = judge(_run(10.0, latencies), 10.0, 4)
    assert 9.5 <= judged.achieved_rate < 9.7
    assert not judged.saturated and judged.unsure, judged


def test_a_clear_trend_or_a_flat_one_is_sure_at_eight_answers() -> None:
    """Latency climbing 0.1 s with every send (a queue) is saturated at eight answers; flat
    latency is kept up, not unsure."""
    rising = judge(_run(10.0, [0.12 + 0.1 * n for n in range(8)]), 10.0, None)
    assert rising.saturated and rising.why.startswith("achieved ") and not rising.unsure
    flat = judge(_run(10.0, [0.12 + j / 10 for j in JITTER]), 10.0, None)
    assert not flat.saturated and flat.unsure == "" and flat.why == ""


def test_a_level_pools_its_runs_answers_and_repeats_while_unsure() -> None:
    """One unsure run leaves the level unsettled (it runs again); six runs of the same server
    pooled are sure it kept up. Six runs of a queue that grows a little each — each unsure
    alone — pooled are surely short: saturated, every run counted."""
    keeps = [
        judge(_run(10.0, [0.12 + j for j in JITTER[k:] + JITTER[:k]]), 10.0, 4) for k in range(6)
    ]
    assert _unsettled(keeps[:1], 0.95) and not _unsettled(keeps, 0.95)
    level = _level_judgement(keeps, 10.0)
    assert not level.saturated and level.unsure == "" and level.split == (0, 6)
    grows = [
        judge(
            _run(10.0, [0.12 + j + 0.015 * n for n, j in enumerate(JITTER[k:] + JITTER[:k])]),
            10.0,
            4,
        )
        for k in range(6)
    ]
    assert all(g.unsure and not g.saturated for g in grows)
    short = _level_judgement(grows, 8.6)
    assert short.saturated and short.unsure == "" and short.split == (6, 6), short
    assert short.why == "achieved 8.6 req/s is 14% below the offered 10 (6 of 6 runs)"


def test_a_level_still_unsure_says_its_shortfall_and_interval() -> None:
    """Two runs, each unsure, pooled still unsure: the level is neither kept up nor saturated,
    and says why with the numbers."""
    runs = [judge(_run(10.0, [0.12 + j + 0.003 * n for n, j in enumerate(JITTER)]), 10.0, 4)] * 2
    level = _level_judgement(runs, 9.33)
    assert isinstance(level, RateJudgement) and not level.saturated
    assert level.unsure.startswith("achieved 9.33 req/s, 7% below the offered 10 — anywhere from")
    assert "over 16 answers (2 runs, 95%)" in level.unsure


# a queue forming halfway: 23.7 req/s sent to 4 slots of 0.2 s (20 req/s); the first four are
# served at once, the next four each wait 4 × (0.2 − 4 / 23.7) ≈ 31 ms for a slot
STEP = [0.2] * 4 + [0.2 + 0.2 - 4 / 23.7] * 4


def test_a_queue_forming_halfway_is_read_across_the_halves() -> None:
    """Sen's interval over the 28 pairs reaches down to 0 (12 pairs within a step are flat);
    the 16 pairs across the halves all rise, and with four a half (C = 1.96 · sqrt(16·9/3)
    ≈ 13.6) the interval is their lowest to their highest slope."""
    starts = tuple(n / 23.7 for n in range(8))
    trend = Trend(starts, tuple(STEP))
    sen = sen_interval([trend])
    assert sen is not None and sen.low == 0.0 < sen.slope
    queue = queue_interval([trend])
    rise = STEP[-1] - STEP[0]
    assert queue is not None and (queue.answers, queue.runs) == (8, 1)
    assert queue.low == pytest.approx(rise / (7 / 23.7))
    assert queue.high == pytest.approx(rise / (1 / 23.7))
    assert queue_interval([Trend(starts[:3], tuple(STEP[:3]))]) is None, "one answer a half"


def test_a_server_20_percent_overloaded_reads_saturated_not_unsure() -> None:
    """Before: "not sure it kept up: achieved 21.1 req/s, 11% below the offered 23.7 — anywhere
    from 0% below to 13% below", six runs, and the sweep inconclusive. Now saturated from one
    run of eight, saying why with the queue's bound; the level says it too."""
    judged = judge(_run(23.7, STEP), 23.7, 4)
    assert judged.saturated and not judged.unsure, judged
    assert judged.why == (
        "achieved 21.1 req/s is 11% below the offered 23.7; a queue formed: the last half of the "
        "answers waited longer than the first, at least 10% below over 8 answers (1 run, 95%)"
    )
    assert not _unsettled([judged], 0.95)
    level = _level_judgement([judged], judged.achieved_rate)
    assert level.saturated and level.why == judged.why


@pytest.mark.parametrize("answers", [3, 4])
def test_too_few_answers_to_bound_the_slope_are_never_surely_short(answers: int) -> None:
    """`sweep --rates 5` beside CPU burners: four answers of a 0.6 s run, their latency rising
    with the machine's jitter, read "saturated at 5 req/s: achieved 4.64 req/s is 7% below the
    offered 5" on a server good for 60 — Sen's ranks past the first slope were clamped to it,
    so the lowest of six slopes stood as a 95 % bound. Three or four answers of one run cannot
    bound a slope at 95 % (four: all six pairs rising is 1 in 24, each way): unsure, said so."""
    latencies = [0.060 + 0.015 * n for n in range(answers)]
    judged = judge(_run(5.0, latencies), 5.0, 4)
    assert judged.achieved_rate < 4.75, "the point estimate is more than 5 % short"
    assert not judged.saturated and judged.why == "", judged.why
    assert f"— {answers} answers (1 run) are too few to bound it at 95%" in judged.unsure
    found = sen_interval([Trend(tuple(n / 5 for n in range(answers)), tuple(latencies))])
    assert found is not None and found.low == -float("inf") and found.high == float("inf")


def test_sends_a_busy_machine_held_back_on_a_steady_schedule_are_the_clients_shortfall() -> None:
    """`sweep --rates 5 --arrival constant` beside CPU burners: "saturated at 5 req/s: achieved
    4.64 req/s is 7% below the offered 5" with every answer 0.06–0.072 s — no slope of latency
    that small can fall 7 % behind; the sends themselves went out at 4.64 a second while the
    dispatcher's lags read on time. Only calibrate can have sent short: the level is its limit,
    never the server's saturation — on a random schedule too (its draws are rescaled to span
    the offered rate exactly: a Poisson run's sends 7 % short read "saturated" before)."""
    starts = [n / 5.0 * 1.075 for n in range(8)]  # each send 7.5 % later than the one before
    answers = tuple(Answer(s, 0.06 + 0.001 * (n % 3), True) for n, s in enumerate(starts))
    zeros = (0.0,) * len(starts)
    run = OpenRun((), starts[-1] + 0.06, starts[-1], (1,) * len(starts), 0.0, zeros, answers)
    judged = judge(run, 5.0, 4)
    assert judged.achieved_rate < 4.75 and not judged.saturated, judged.why
    assert judged.client_late.startswith("calibrate sent only 4.65 of the offered 5 req/s")
    poisson = judge(run, 5.0, 4, random_schedule=True)
    assert not poisson.saturated, poisson.why
    assert poisson.client_late.startswith("calibrate sent only 4.65 of the offered 5 req/s")
    drawn = arrival_times(5.0, 8, seed=3)  # what a random run offers: the rate, exactly
    assert (len(drawn) - 1) / (drawn[-1] - drawn[0]) == pytest.approx(5.0)


def test_a_backlog_draining_from_the_start_is_never_a_level_kept_up_above_its_offer() -> None:
    """`sweep --rates 40 --arrival constant` beside two CPU burners: the first answers took
    0.55 s (a backlog at the start), the last 0.02 s; the latency's slope of about −0.6 read the
    run as "achieved 106 req/s" of 40 offered, and the level passed, kept up. No server answers
    more than was sent: the level is unsure and runs again, its median then decides."""
    latencies = [0.55 - n * 0.53 / 39 for n in range(40)]
    judged = judge(_run(40.0, latencies), 40.0, None)
    assert judged.achieved_rate > 42
    level = _level_judgement([judged], judged.achieved_rate)
    assert not level.saturated and level.unsure.startswith(
        f"achieved {judged.achieved_rate:.3g} req/s is more than the offered 40: "
    ), level
    assert _unsettled([judged], 0.95), "it runs again"
    clean = judge(_run(40.0, [0.02] * 40), 40.0, None)
    three = [judged, clean, clean]
    settled = _level_judgement(three, statistics.median(j.achieved_rate for j in three))
    # the median (40) decides: no backlog doubt left (the scripted runs' one-in-flight counts
    # leave Little's law its own doubt about 0.55 s answers, which is not this test's)
    assert "more than the offered" not in settled.unsure and not settled.saturated, settled
