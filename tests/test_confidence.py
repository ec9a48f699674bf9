"""calibrate.confidence: t quantiles, t-intervals, CV and Welch's comparison; [confidence] level."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from calibrate.confidence import (
    NOISY_CV,
    Spread,
    check_level,
    compare,
    spread,
    t_cdf,
    t_quantile,
)
from tests.report_helpers import ladder_row, write_run

# Student t quantiles from the published tables (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2).
T_TABLE = [
    (0.975, 1, 12.706),
    (0.975, 2, 4.303),
    (0.975, 3, 3.182),
    (0.975, 4, 2.776),
    (0.975, 5, 2.571),
    (0.975, 9, 2.262),
    (0.975, 10, 2.228),
    (0.975, 30, 2.042),
    (0.975, 100, 1.984),
    (0.95, 1, 6.314),
    (0.95, 5, 2.015),
    (0.95, 20, 1.725),
    (0.995, 1, 63.657),
    (0.995, 2, 9.925),
    (0.995, 10, 3.169),
    (0.995, 60, 2.660),
    (0.9, 3, 1.638),
    (0.9995, 1, 636.619),
    (0.9995, 4, 8.610),
]


@pytest.mark.parametrize(("p", "df", "t"), T_TABLE)
def test_t_quantiles_match_the_tables_to_three_decimals(p: float, df: int, t: float) -> None:
    assert round(t_quantile(p, df), 3) == t
    assert round(t_quantile(1 - p, df), 3) == -t  # symmetric


@pytest.mark.parametrize("p", [0.55, 0.8, 0.9, 0.975, 0.999])
def test_t_quantiles_match_the_closed_forms_and_the_normal_limit(p: float) -> None:
    assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)
    assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-9)
    normal = {0.55: 0.125661, 0.8: 0.841621, 0.9: 1.281552, 0.975: 1.959964, 0.999: 3.090232}
    assert t_quantile(p, 1e7) == pytest.approx(normal[p], abs=1e-5)
    assert t_quantile(0.5, 3) == 0.0


def test_non_integer_degrees_of_freedom_lie_between_their_neighbours() -> None:
    """Welch's df is rarely an integer: the quantile is exact there too, not rounded."""
    t45 = t_quantile(0.975, 4.5)
    assert t_quantile(0.975, 5) < t45 < t_quantile(0.975, 4)
    assert t_cdf(t45, 4.5) == pytest.approx(0.975, abs=1e-10)
    assert t_cdf(0.0, 7) == 0.5 and t_cdf(math.inf, 3) == 1.0 and t_cdf(-math.inf, 3) == 0.0


@pytest.mark.parametrize(
    ("p", "df"), [(0.0, 3), (1.0, 3), (math.nan, 3), (0.9, 0), (0.9, -1), (0.9, math.inf)]
)
def test_a_quantile_outside_its_domain_is_refused(p: float, df: float) -> None:
    with pytest.raises(ValueError):
        t_quantile(p, df)


def test_the_interval_of_three_rounds() -> None:
    found = spread([10.0, 11.0, 12.0])
    assert found is not None
    assert (found.n, found.mean, found.sd, found.level) == (3, 11.0, 1.0, 0.95)
    half = 4.302653 / math.sqrt(3)  # t(0.975, 2) · sd / √n
    assert found.ci_low == pytest.approx(11 - half, abs=1e-6)
    assert found.ci_high == pytest.approx(11 + half, abs=1e-6)
    assert found.cv == pytest.approx(1 / 11) and not found.noisy
    wider = spread([10.0, 11.0, 12.0], 0.99)
    assert wider is not None and wider.ci_low is not None and found.ci_low is not None
    assert wider.ci_low < found.ci_low  # a higher level, a wider interval
    assert wider.ci_low == pytest.approx(11 - 9.924843 / math.sqrt(3), abs=1e-6)


def test_the_interval_of_a_quantity_never_negative_stops_at_zero() -> None:
    """Two rounds of a ladder tier, 118 and 141 items/s: the t-interval (12.7 half-widths of
    their sd) read "129 [−21.27, 280]" in the report; no rate is below 0. A value that may be
    negative (a difference) keeps its interval whole."""
    found = spread([118.0, 141.0])
    assert found is not None and found.ci_low == 0.0
    assert found.ci_high == pytest.approx(129.5 + 12.706205 * math.sqrt(264.5 / 2), abs=1e-4)
    signed = spread([-1.0, 141.0])
    assert signed is not None and signed.ci_low is not None and signed.ci_low < 0


def test_one_round_has_a_mean_and_no_interval() -> None:
    found = spread([5.0])
    assert found == Spread(1, 5.0, None, None, None, 0.95)
    assert found.cv is None and not found.noisy


def test_no_rounds_and_only_unmeasured_values_have_no_spread() -> None:
    assert spread([]) is None
    assert spread([math.nan, math.inf, -math.inf]) is None


def test_nan_and_infinite_values_are_left_out_and_counted() -> None:
    found = spread([2.0, math.nan, 4.0, math.inf])
    assert found is not None and (found.n, found.mean, found.dropped) == (2, 3.0, 2)


def test_equal_rounds_have_a_zero_width_interval() -> None:
    found = spread([3.0, 3.0, 3.0])
    assert found is not None
    assert (found.sd, found.ci_low, found.ci_high, found.cv) == (0.0, 3.0, 3.0, 0.0)


def test_the_cv_of_a_zero_mean_is_undefined_and_above_ten_percent_is_noisy() -> None:
    zero = spread([-1.0, 1.0])
    assert zero is not None and zero.cv is None and not zero.noisy
    noisy = spread([80.0, 100.0, 120.0])  # sd 20 on a mean of 100
    assert noisy is not None and noisy.cv == pytest.approx(0.2) and noisy.noisy
    edge = spread([90.0, 110.0])  # sd 14.1 %: noisy; 10 % exactly is not
    assert edge is not None and edge.noisy and NOISY_CV == 0.10


@pytest.mark.parametrize("level", [0.5, 1.0, 0.0, 1.5, -0.95, math.nan, math.inf, True])
def test_a_level_outside_half_to_one_is_refused(level: float) -> None:
    with pytest.raises(ValueError, match="confidence level must be in"):
        check_level(level)
    with pytest.raises(ValueError):
        spread([1.0, 2.0], level)


def test_welch_interval_of_equal_spreads() -> None:
    a, b = spread([10.0, 11.0, 12.0]), spread([13.0, 14.0, 15.0])
    assert a is not None and b is not None
    diff = compare(a, b)
    se = math.sqrt(1 / 3 + 1 / 3)
    assert diff.diff == 3.0 and diff.df == pytest.approx(4.0)
    assert diff.ci_low == pytest.approx(3 - 2.776445 * se, abs=1e-6)
    assert diff.ci_high == pytest.approx(3 + 2.776445 * se, abs=1e-6)
    assert diff.significant is True
    assert compare(b, a).significant is True and compare(b, a).diff == -3.0
    low, high = diff.relative(a.mean)
    assert low == pytest.approx(diff.ci_low / 11) and high == pytest.approx(diff.ci_high / 11)


def test_welch_interval_of_unequal_spreads_and_sizes() -> None:
    a, b = spread([1.0, 2.0, 3.0, 4.0, 5.0]), spread([2.0, 4.0, 6.0])
    assert a is not None and b is not None
    diff = compare(a, b)
    va, vb = 2.5 / 5, 4.0 / 3
    df = (va + vb) ** 2 / (va**2 / 4 + vb**2 / 2)
    assert diff.df == pytest.approx(df) and 3.5 < df < 3.6
    half = t_quantile(0.975, df) * math.sqrt(va + vb)
    assert diff.ci_low == pytest.approx(1 - half) and diff.significant is False


def test_overlapping_noise_is_not_significant() -> None:
    a, b = spread([100.0, 104.0, 97.0]), spread([103.0, 99.0, 106.0])
    assert a is not None and b is not None and compare(a, b).significant is False


def test_without_two_rounds_on_each_side_nothing_is_claimed() -> None:
    one, three = spread([10.0]), spread([10.0, 11.0, 12.0])
    assert one is not None and three is not None
    for diff in (compare(one, three), compare(three, one), compare(one, one)):
        assert diff.significant is None and diff.ci_low is None and diff.df is None
    assert compare(one, three).relative(10.0) == (None, None)


def test_exact_rounds_differ_significantly_only_when_their_means_differ() -> None:
    a, b, c = spread([5.0, 5.0]), spread([6.0, 6.0, 6.0]), spread([5.0, 5.0, 5.0])
    assert a is not None and b is not None and c is not None
    assert compare(a, b).significant is True and compare(a, b).ci_low == 1.0
    assert compare(a, c).significant is False
    one_exact = compare(a, spread([5.0, 6.0, 7.0]) or a)  # only B varies: df = n_B − 1
    assert one_exact.df == pytest.approx(2.0) and one_exact.significant is False


@pytest.mark.parametrize("value", ["1.5", "0.5", "1", "0", "-0.9", "nan", '"95%"', "true"])
def test_a_confidence_level_outside_half_to_one_is_exit_2(cli, isolated: Path, value: str) -> None:
    write_run(isolated, "a", "ladder", [ladder_row(1, 4.0)])
    (isolated / "calibrate.toml").write_text(f"[confidence]\nlevel = {value}\n", "utf-8")
    result = cli("report", "runs/a")
    assert result.code == 2 and "Traceback" not in result.err
    assert "confidence" in result.err and "level" in result.err
    assert len(result.err.strip().splitlines()) <= 2


def test_a_confidence_level_in_the_config_is_used_by_report(cli, isolated: Path) -> None:
    write_run(isolated, "a", "ladder", [ladder_row(1, 4.0)])
    (isolated / "calibrate.toml").write_text("[confidence]\nlevel = 0.9\n", "utf-8")
    result = cli("report", "runs/a", "--json", "--no-plot")
    assert result.code == 0, result.err
    assert result.json["confidence"] == {"level": 0.9, "tiers": []}  # no rounds.jsonl
    shown = cli("status", "--show-config")
    assert '"confidence"' in shown.err and '"level": 0.9' in shown.err
