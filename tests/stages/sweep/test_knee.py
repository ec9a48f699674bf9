"""The sweep's knee rule as a pure function (SPEC §5.6): each level against the best so far,
repeats when ranges overlap while medians differ, the knee the smallest level within noise of
the best — on several curve shapes, not one example."""

from __future__ import annotations

import pytest

from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.stages.verdict.knee import (
    Point,
    best_of,
    find_knee,
    judge,
    judged_range,
    needs_repeat,
    within_noise,
)


def curve(*levels: tuple[int, float, float, float]) -> list[Point]:
    return [Point(c, median, 0, low, high) for c, median, low, high in levels]


# the issue's llama.cpp measurement: 2 is so noisy that it overlaps 1; 4's slowest run beats
# 1's fastest; 8 dips; 16 is within gain_min of 4
NOISY_MIDDLE = curve(
    (1, 31.6, 31.37, 31.71),
    (2, 36.3, 31.39, 43.92),
    (4, 42.5, 38.51, 47.18),
    (8, 38.5, 37.0, 40.0),
    (16, 45.1, 41.0, 48.0),
)
PLATEAU = curve((1, 10, 9.9, 10.1), (2, 19, 18.5, 19.5), (4, 20, 19.6, 20.5), (8, 20.5, 20, 21))
MONOTONE = curve((1, 10, 9.8, 10.2), (2, 19, 18.6, 19.3), (4, 35, 34, 36), (8, 60, 58, 61))
DIP_THEN_GAIN = curve((1, 10, 9.8, 10.2), (2, 18, 17.5, 18.5), (4, 15, 14, 16), (8, 25, 24, 26))
ALL_NOISE = curve((1, 10, 9.5, 10.5), (2, 10.4, 9.6, 11), (4, 10.2, 9.7, 10.9), (8, 9.9, 9.5, 10.3))
CLEAR = curve((1, 10, 9.9, 10.1), (2, 19, 18.8, 19.2), (4, 36, 35.6, 36.4), (8, 36.5, 36, 37))


@pytest.mark.parametrize(
    ("points", "knee", "best", "sure", "doubts"),
    [
        # 4 may be no better than 2, and 16 may add 10 % over 4: the runs cannot say
        (NOISY_MIDDLE, 4, 4, False, [(2, 4), (4, 16)]),
        # 4 and 8 add 5 % and 8 % over 2, but their ranges reach past 10 %
        (PLATEAU, 2, 2, False, [(2, 4), (2, 8)]),
        (MONOTONE, 8, 8, False, []),  # the best is the last level: it may still rise
        (DIP_THEN_GAIN, 8, 8, False, []),
        (ALL_NOISE, 1, 1, False, [(1, 2), (1, 4)]),
        (CLEAR, 4, 4, True, []),
    ],
    ids=["noisy-middle", "plateau", "monotone", "dip-then-gain", "all-within-noise", "clear"],
)
def test_the_knee_on_each_shape_of_curve(
    points: list[Point], knee: int, best: int, sure: bool, doubts: list[tuple[int, int]]
) -> None:
    """Sure only when every comparison the knee rests on is settled; a pair the ranges leave
    open is a doubt (the sweep repeats it, and is inconclusive if it stays open)."""
    found = find_knee(points, 0.10)
    assert found is not None
    assert (found.knee.concurrency, found.best.concurrency, found.sure) == (knee, best, sure)
    assert [(a.concurrency, b.concurrency) for a, b in found.doubts] == doubts
    assert found.noisy is bool(doubts)
    assert found.text.startswith(f"knee at {knee}")
    assert found.text.endswith("— sure" if sure else "— not sure")


def test_the_noisy_middle_names_its_doubts_and_the_conservative_answer() -> None:
    found = find_knee(NOISY_MIDDLE, 0.10)
    assert found is not None
    assert found.text.startswith("knee at 4 (+34 % over 1, range +21 %…+50 %)")
    assert (
        "4 adds +17 % over 2, anywhere from −12 % to +50 %: still unsure after the repeats, "
        "whether it adds 10 % cannot be told from noise" in found.text
    )
    assert "16 adds +6 % over 4, anywhere from −13 % to +25 %" in found.text
    assert "8 adds −9 % over 4" in found.text
    # 2 may be within 10 % of 4: the conservative answer is 2, not 4
    assert found.conservative is not None and found.conservative.concurrency == 2
    # judged only against its neighbour, 4 (+17 % over 2, overlapping) looked like noise
    assert judge(NOISY_MIDDLE[1], NOISY_MIDDLE[2], 0.10) == "unsure"
    assert judge(NOISY_MIDDLE[0], NOISY_MIDDLE[2], 0.10) == "gain"


def test_a_level_below_the_best_but_within_gain_min_is_the_knee() -> None:
    """2 is too noisy to be a gain over 1, 4 is one; but 2's median is within 10 % of 4's: more in
    flight than 2 adds nothing that counts."""
    points = curve((1, 10, 9.9, 10.1), (2, 12.5, 9.8, 15), (4, 13.5, 13.2, 13.8), (8, 13.4, 13, 14))
    found = find_knee(points, 0.10)
    assert found is not None and found.best.concurrency == 4 and found.knee.concurrency == 2
    assert "the best is 4 (+8 % over 2" in found.text and "2 is within 10 % of it" in found.text
    # … by the medians; 2's runs reach from 9.8 to 15, so whether 4 adds 10 % is a doubt
    assert [(a.concurrency, b.concurrency) for a, b in found.doubts] == [(2, 4)]


def test_judging_gain_unsure_and_no_gain() -> None:
    best = Point(1, 10, 0, 9.5, 10.5)
    assert judge(best, Point(2, 12, 0, 11, 13), 0.10) == "gain"
    assert judge(best, Point(2, 12, 0, 10, 14), 0.10) == "unsure"  # +20 %, ranges overlap
    tight = Point(1, 10, 0, 9.9, 10.1)
    assert judge(tight, Point(2, 10.5, 0, 10.3, 10.7), 0.10) == "no gain"  # +5 %, at most +8 %
    # +5 % by the medians, but the ranges allow +16 %: not settled (it was "no gain" before)
    assert judge(best, Point(2, 10.5, 0, 10, 11), 0.10) == "unsure"
    assert judge(best, Point(2, 12, 3, 11, 13), 0.10) == "no gain"  # errors
    assert judge(Point(1, 10, 0), Point(2, 12, 0), 0.10) == "gain"  # one run each: no ranges
    assert judge(Point(1, 10, 0), Point(2, 10.5, 0), 0.10) == "no gain"
    assert within_noise(Point(4, 40, 0), Point(2, 37, 0), 0.10)
    assert not within_noise(Point(4, 40, 0), Point(2, 35, 0), 0.10)


def test_a_level_is_repeated_only_while_unsure_and_below_max_repeats() -> None:
    below = curve((1, 10, 9.5, 10.5))
    noisy = Point(2, 12, 0, 10, 14)
    assert needs_repeat(below, noisy, 0.10, runs=3, max_repeats=6)
    assert not needs_repeat(below, noisy, 0.10, runs=6, max_repeats=6)
    assert not needs_repeat(below, Point(2, 12, 0, 11, 13), 0.10, runs=3, max_repeats=6)
    assert not needs_repeat([], noisy, 0.10, runs=3, max_repeats=6)  # the first level


def test_the_best_so_far_is_not_the_neighbour() -> None:
    assert best_of(NOISY_MIDDLE[:2], 0.10) == NOISY_MIDDLE[0]
    assert best_of(NOISY_MIDDLE, 0.10) == NOISY_MIDDLE[2]
    assert best_of(DIP_THEN_GAIN[:3], 0.10) == DIP_THEN_GAIN[1]
    assert best_of([Point(1, 10, 2)], 0.10) is None


def test_judged_range_leaves_out_the_extremes_from_five_runs() -> None:
    assert judged_range([5.0]) is None
    assert judged_range([3.0, 1.0, 2.0]) == (1.0, 3.0)
    assert judged_range([1.0, 9.0, 5.0, 5.5, 6.0]) == (5.0, 6.0)  # one hiccup each way
    # the text's range from five runs is the middle ones', not the table's min–max: it says so
    five = find_knee(
        [_runs(2, 11.8, 14.0, 14.5, 15.0, 16.8), _runs(4, 28.6, 29.5, 30.0, 31.0, 33.7)], 0.10
    )
    assert five is not None and "(middle runs)" in five.text, five.text
    three = find_knee([_runs(2, 14.0, 14.5, 15.0), _runs(4, 29.5, 30.0, 31.0)], 0.10)
    assert three is not None and "range" in three.text and "middle" not in three.text


def test_failing_and_single_run_levels() -> None:
    points = [Point(1, 10, 0), Point(2, 19, 0), Point(4, 30, 4)]
    found = find_knee(points, 0.10)
    assert found is not None and found.knee.concurrency == 2
    assert "4 failed (4 errors)" in found.text and "one run per level: no range" in found.text
    assert find_knee([Point(1, 10, 1)], 0.10) is None


def test_the_self_check_marks_only_the_windows_since_a_level_began() -> None:
    monitor = SelfLoadMonitor(cpu_limit=0.85, lag_limit_s=0.015, confirm=2)
    monitor.observe(1.0, 0.95, 0.0)
    monitor.observe(1.0, 0.95, 0.0)  # the level before was client-bound
    mark = monitor.mark()
    monitor.observe(1.0, 0.3, 0.0)
    monitor.observe(1.0, 0.95, 0.0)
    assert monitor.bound_since(mark) == "", "one bound window is not two in a row"
    monitor.observe(1.0, 0.2, 0.04)
    assert monitor.bound_since(mark) == "calibrate's threads waited 40 ms on average to run"
    assert monitor.bound_since(0) == "calibrate's own process used 0.95 CPU cores"


def _runs(concurrency: int, *runs: float) -> Point:
    span = judged_range(runs)
    assert span is not None
    ordered = sorted(runs)
    return Point(concurrency, ordered[len(ordered) // 2], 0, span[0], span[1], tuple(runs))


def test_one_fast_run_of_the_best_level_cannot_hide_a_gain_the_runs_show() -> None:
    """Measured on llama-server --parallel 4 on a loaded 2-core box: c=1 had one fast run (53.9),
    so c=4's middle runs still overlapped it after six runs — yet the runs as a whole put 4 above 1:
    the Welch interval of the means lies above zero."""
    one = _runs(1, 43.7, 48.5, 53.9)
    four = _runs(4, 51.2, 52.5, 58.0, 61.8, 64.0, 66.7)
    assert four.span[0] <= one.span[1], "the ranges overlap, even with the extremes left out"
    assert judge(one, four, 0.10) == "gain"
    found = find_knee([one, _runs(2, 38.6, 49.5, 50.2), four], 0.10)
    assert found is not None and found.knee.concurrency == 4


@pytest.mark.parametrize(
    ("best", "cur", "expected"),
    [
        # overlapping and the interval includes zero: still unsure (the sweep repeats it)
        ((40.7, 41.4, 52.1), (41.4, 48.0, 51.6, 51.6, 55.0, 57.4), "unsure"),
        # two runs a side: too few for the interval, the ranges decide
        ((10.0, 13.0), (12.5, 14.5), "unsure"),
        # a clear interval but a median gain under gain_min: never a gain
        ((10.0, 10.1, 10.2), (10.6, 10.7, 10.8), "no gain"),
    ],
)
def test_the_interval_settles_a_gain_only_with_enough_runs_and_a_real_margin(
    best: tuple[float, ...], cur: tuple[float, ...], expected: str
) -> None:
    assert judge(_runs(1, *best), _runs(4, *cur), 0.10) == expected


def test_a_level_clearly_slower_than_the_best_fell_and_is_never_called_noise() -> None:
    """What llama.cpp's 4 slots showed in CI: 8 and 16 in flight ran 13 % and 21 % slower than 2,
    every run of them below every run of 2 — the ranges apart, downwards. Only 4, whose runs
    straddle 2's, is within noise."""
    points = curve(
        (1, 10.0, 9.6, 10.4),
        (2, 18.5, 17.5, 19.5),
        (4, 18.1, 17.0, 19.0),
        (8, 16.1, 15.8, 16.4),
        (16, 14.6, 14.4, 14.9),
    )
    found = find_knee(points, 0.10)
    assert found is not None and found.knee.concurrency == 2
    assert "4 adds −2 % over 2, range −13 %…+9 %: within noise (the ranges overlap)" in found.text
    assert "8 adds −13 % over 2, range −19 %…−6 %: throughput fell" in found.text
    assert "16 adds −21 % over 2, range −26 %…−15 %: throughput fell" in found.text
