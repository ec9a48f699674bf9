"""SPEC §5.14 as pure functions on recorded runs: a verdict is sure only when the runs separate
the settings it rests on; the busy-machine runs of the issue (ranges like 1.06–21.19 items/s)
leave the knee in doubt instead of naming one, the quiet ones settle it in two runs a level."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

import pytest

from calibrate.stages.ladder.setting import setting_reason, setting_tier
from calibrate.stages.ladder.setting.doubt import setting_doubt
from calibrate.stages.measure.tier import Tier, Verdict
from calibrate.stages.verdict.doubt import Doubt, Inconclusive
from calibrate.stages.verdict.knee import Point, find_knee, judge
from calibrate.stages.verdict.separation import (
    Sample,
    gain_interval,
    judge_gain,
    judged_range,
    next_of_pair,
    pooled,
)
from tests.stage_fakes import CLEAN

GAIN_MIN = 0.10  # [sweep] gain_min's default


def _tier(batch: int, verdict: Verdict, rates: Sequence[float]) -> Tier:
    """A ladder tier whose rounds ran at ``rates`` items/s (the aggregate: their mean)."""
    rounds = tuple(replace(CLEAN, batch_size=batch, items_per_s=r) for r in rates)
    stats = replace(CLEAN, batch_size=batch, items_per_s=sum(rates) / len(rates))
    return Tier(stats, rounds, verdict, "", len(rates))


def level(concurrency: int, *runs: float) -> Point:
    """A sweep level as recorded: its runs' items/s (the median is the table's figure)."""
    span = judged_range(runs)
    median = statistics.median(runs)
    return Point(concurrency, median, 0, span[0] if span else None, span[1] if span else None, runs)


# llama.cpp, 4 slots, 100-token answers, 3 runs of 3 s a level, on a 2-core machine while other
# jobs ran (load average 5–6): per-level ranges like 1.06–21.19 items/s (the sweeps)
BUSY = [
    [
        level(1, 9.6, 1.06, 10.1),
        level(2, 18.2, 4.9, 21.19),
        level(4, 35.4, 7.4, 33.0),
        level(8, 6.2, 34.8, 36.0),
    ],
    [
        level(1, 10.2, 9.9, 3.1),
        level(2, 2.4, 19.8, 17.6),
        level(4, 36.1, 8.2, 12.9),
        level(8, 35.6, 33.1, 8.8),
    ],
    [
        level(1, 9.8, 10.0, 2.2),
        level(2, 19.1, 18.7, 4.2),
        level(4, 8.9, 34.7, 35.9),
        level(8, 35.1, 6.3, 36.4),
    ],
]
# the same server on a quiet machine: two runs a level, a few per cent apart
QUIET = [level(1, 10.1, 9.9), level(2, 19.6, 20.1), level(4, 36.2, 35.5), level(8, 35.9, 36.4)]


@pytest.mark.parametrize("points", BUSY, ids=["busy-1", "busy-2", "busy-3"])
def test_the_busy_machines_runs_leave_the_knee_in_doubt_never_a_confident_one(
    points: list[Point],
) -> None:
    """Before, these sweeps said 2, 1, 8 with exit 0 — one "sure" with 4's range at −79 %…+154 %
    over 2. The runs back no such claim: the knee has doubts (the sweep repeats the pairs, and
    is inconclusive when they stay)."""
    found = find_knee(points, 0.10)
    assert found is not None
    assert found.noisy and not found.sure, found.text
    assert found.text.endswith("— not sure")
    assert "cannot be told from noise" in found.text


def test_the_quiet_machines_runs_settle_the_knee_at_4_in_two_runs_a_level() -> None:
    """Two runs a level suffice when the spread they share is small: 2 and 4 are gains, 8 adds
    less than 10 % over 4 whatever the noise — sure, knee 4."""
    found = find_knee(QUIET, 0.10)
    assert found is not None and found.knee.concurrency == 4 and not found.noisy
    assert found.best.concurrency == 4
    assert "8 adds" in found.text


def test_the_spread_is_shared_but_one_bad_minute_does_not_make_every_pair_unsure() -> None:
    """A setting's own two runs say little about the noise: the spread the stage's settings
    share decides (the larger of it and the pair's own), and it is their median — one setting
    that had a bad minute leaves the quiet pairs settled."""
    quiet = [Sample.of(p.runs) for p in QUIET]
    shared = pooled(quiet)
    assert shared is not None and shared.dof == 4 and shared.sd < 0.03
    four, eight = quiet[2], quiet[3]
    assert judge_gain(four, eight, 0.10, spread_of_all=shared) == "no gain"
    bad_minute = Sample.of((20.0, 11.0))  # level 2 again, 45 % apart
    mixed = pooled([*quiet[:1], bad_minute, *quiet[2:]])
    assert mixed is not None and mixed.sd < 0.05, "the median of the spreads, not their pool"
    assert judge_gain(four, eight, 0.10, spread_of_all=mixed) == "no gain"
    # the pair's own spread still counts: two runs that disagree widen their own interval
    wide = gain_interval(Sample.of((36.0, 20.0)), eight, spread_of_all=shared)
    assert wide is not None and wide.low < 0 < 0.10 < wide.high


def test_gain_no_gain_and_unsure_read_the_interval_against_gain_min() -> None:
    base = Sample.of((40.0, 40.4, 39.8))
    assert judge_gain(base, Sample.of((48.0, 48.5, 47.9)), 0.10) == "gain"  # +20 %, apart
    assert judge_gain(base, Sample.of((41.0, 41.3, 40.9)), 0.10) == "no gain"  # +2 %, tight
    # +5 % by the medians, but the runs allow +15 %: before, "no gain" on the medians alone
    assert judge_gain(base, Sample.of((36.0, 42.0, 46.0)), 0.10) == "unsure"
    # one run a side and nothing to share: the medians decide (and the stage says "not sure")
    assert judge_gain(Sample.of((40.0,)), Sample.of((45.0,)), 0.10) == "gain"
    assert judge_gain(Sample.of((40.0,)), Sample.of((42.0,)), 0.10) == "no gain"


def test_repeats_of_two_settings_go_a_b_a_b_up_to_the_budget() -> None:
    runs = [3, 2]
    order = []
    while (which := next_of_pair((runs[0], runs[1]), 6)) is not None:
        order.append("AB"[which])
        runs[which] += 1
    assert "".join(order) == "BABABAB"[: len(order)] and runs == [6, 6]
    assert next_of_pair((6, 2), 6) == 1 and next_of_pair((2, 6), 6) == 0


def test_the_inconclusive_line_names_the_pair_the_cause_and_the_way_out() -> None:
    from calibrate.gpu.noise import MachineNoise

    found = gain_interval(Sample.of((20.0, 5.0, 19.0)), Sample.of((36.0, 8.0, 33.0)))
    assert found is not None
    busy = MachineNoise(30.0, 2, 48.0, 0.0, 60.0, 0.004)
    said = Inconclusive(
        (Doubt("concurrency 2", "concurrency 4", found, 0.10),),
        busy,
        "the sweep",
        "concurrency 2",
        "[sweep] max_repeats, [sweep] level_s",
    )
    assert said.text.startswith(
        "inconclusive: the runs cannot tell whether concurrency 4 adds 10 % over concurrency 2: "
    )
    assert said.text.endswith(
        "— other processes used 1.6 of this machine's 2 cores during the sweep"
    )
    assert said.what_to_do.startswith("run it again when the other jobs have stopped")
    assert said.what_to_do.endswith(
        "take the conservative answer (concurrency 2) with --conservative"
    )
    quiet = MachineNoise(30.0, 2, 3.0, 0.0, 60.0, 0.002)
    jitter = Inconclusive(said.doubts, quiet, "the sweep", "", "[sweep] max_repeats")
    assert "server jitter" in jitter.text and "--conservative" not in jitter.what_to_do
    starved = MachineNoise(30.0, 2, 3.0, 0.0, 60.0, 0.020)
    assert (
        "calibrate's threads waited 20 ms on average"
        in Inconclusive(said.doubts, starved, "the ladder", "batch 1", "[ladder] rounds").text
    )


def test_the_ladders_setting_one_base_and_its_rounds_stated() -> None:
    """The issue's ladder: "batch 2 27 % faster … within noise" after only two rounds — a
    doubt now (the ladder repeats the two and, still unsure, is inconclusive), never a
    confident "the smaller batch"; and each figure says its rounds."""
    history = [_tier(1, "pass", [10.0, 14.0]), _tier(2, "pass", [12.7, 17.8])]
    doubt = setting_doubt(history, GAIN_MIN)
    assert doubt is not None and doubt.noise is not None
    assert setting_tier(history, GAIN_MIN, conservative=True) is history[0]
    reason = setting_reason(history, GAIN_MIN)
    assert "over 2 rounds" in reason and "within noise" not in reason


def test_judge_reads_a_recorded_level_pair_the_same_way_as_the_knee() -> None:
    two, four = BUSY[0][1], BUSY[0][2]
    assert judge(two, four, 0.10) == "unsure"
