"""How sure a repeated measurement is (SPEC §13): the mean with a Student-t interval, the
coefficient of variation, and whether two samples differ.

Pure arithmetic on lists of floats (no scipy): the t distribution's CDF is the regularised
incomplete beta function (a continued fraction), and its quantile is found by bisection on that
CDF, so non-integer degrees of freedom (Welch's) are exact too.

The rule for "significant": **Welch's t-interval of the difference** B − A at the chosen level
excludes zero. It is the SPEC's "the intervals separate" taken on the difference itself: two
separate 95 % intervals always give a difference interval without zero, but not the reverse —
non-overlap is stricter than the level it names (about 99.5 % for equal spreads).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_LEVEL = 0.95
NOISY_CV = 0.10  # a coefficient of variation above this is an unstable measurement


def check_level(level: float) -> float:
    """``level`` when 0.5 < level < 1; ValueError otherwise (NaN and infinities too)."""
    if isinstance(level, bool) or not isinstance(level, int | float) or not 0.5 < level < 1:
        raise ValueError(f"a confidence level must be in (0.5, 1), got {level!r}")
    return float(level)


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 1000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return result


def _beta_regularised(a: float, b: float, x: float) -> float:
    """I_x(a, b) for 0 ≤ x ≤ 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with ``df`` > 0 degrees of freedom."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df!r}")
    if math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * _beta_regularised(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The t with P(T ≤ t) = p, for 0 < p < 1 and ``df`` > 0 (any real df, e.g. Welch's).

    Kept once computed: a ladder or sweep asks for the same few (level, rounds − 1) again and
    again, and each is a bisection of about 40 incomplete-beta evaluations."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"a quantile needs 0 < p < 1, got {p!r}")
    if not df > 0 or math.isinf(df) or math.isnan(df):
        raise ValueError(f"degrees of freedom must be finite and > 0, got {df!r}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    high = 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    low = 0.0 if high == 1.0 else high / 2.0
    for _ in range(200):  # bisection: the CDF is monotone, each step halves the bracket
        mid = (low + high) / 2.0
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low <= 1e-12 * max(1.0, high):
            break
    return (low + high) / 2.0


@dataclass(frozen=True)
class Spread:
    """A repeated measurement: ``n`` finite values, their mean, the sample standard deviation
    and the t-interval of the mean at ``level``. Values are in the metric's own unit.

    With one value there is no spread: ``sd``, ``ci_low``, ``ci_high`` and ``cv`` are None.
    """

    n: int
    mean: float
    sd: float | None
    ci_low: float | None
    ci_high: float | None
    level: float
    dropped: int = 0  # NaN or infinite values left out

    @property
    def cv(self) -> float | None:
        """The coefficient of variation, sd / |mean| (a fraction); None for one value or a
        zero mean."""
        if self.sd is None or self.mean == 0:
            return None
        return self.sd / abs(self.mean)

    @property
    def noisy(self) -> bool:
        return self.cv is not None and self.cv > NOISY_CV

    def to_json(self) -> dict[str, float | int | None]:
        return {
            "n": self.n,
            "mean": self.mean,
            "sd": self.sd,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "cv": self.cv,
            "level": self.level,
        }


def spread(values: Iterable[float], level: float = DEFAULT_LEVEL) -> Spread | None:
    """Mean, sample sd and t-interval of the finite ``values``; None when there is none. The
    interval of values none of which is negative stops at 0 ("129 [−21, 280] items/s" of two
    rounds 10 % apart is "129 [0, 280]")."""
    level = check_level(level)
    given = [float(v) for v in values]
    kept = [v for v in given if math.isfinite(v)]
    dropped = len(given) - len(kept)
    if not kept:
        return None
    n = len(kept)
    mean = math.fsum(kept) / n
    if n == 1:
        return Spread(1, mean, None, None, None, level, dropped)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in kept) / (n - 1))
    half = t_quantile(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    low = mean - half
    if low < 0 <= min(kept):  # a rate, a time, a count: never below 0, whatever two rounds say
        low = 0.0
    return Spread(n, mean, sd, low, mean + half, level, dropped)


@dataclass(frozen=True)
class Difference:
    """B − A of two repeated measurements: Welch's t-interval of the difference at ``level``.

    ``significant`` is True when that interval excludes zero, False when it holds zero, None
    when either side has fewer than two values (no spread: nothing can be claimed).
    ``df`` is the Welch–Satterthwaite degrees of freedom (None when both spreads are zero:
    then the difference is exact, and significant when it is not zero).
    """

    diff: float
    ci_low: float | None
    ci_high: float | None
    df: float | None
    level: float
    significant: bool | None

    def relative(self, base: float) -> tuple[float | None, float | None]:
        """The interval as fractions of ``base`` (A's value); (None, None) when base is 0."""
        if not base or self.ci_low is None or self.ci_high is None:
            return None, None
        return self.ci_low / abs(base), self.ci_high / abs(base)


def compare(a: Spread, b: Spread) -> Difference:
    """Whether B differs from A at the level they were both taken at (A's when they differ)."""
    level = a.level
    diff = b.mean - a.mean
    if a.sd is None or b.sd is None:
        return Difference(diff, None, None, None, level, None)
    va, vb = a.sd**2 / a.n, b.sd**2 / b.n
    se = math.sqrt(va + vb)
    if se == 0:
        return Difference(diff, diff, diff, None, level, diff != 0)
    df = (va + vb) ** 2 / (va**2 / (a.n - 1) + vb**2 / (b.n - 1))
    half = t_quantile(0.5 + level / 2.0, df) * se
    low, high = diff - half, diff + half
    return Difference(diff, low, high, df, level, low > 0 or high < 0)


def percent(fraction: float) -> str:
    """``0.14`` → ``14 %``; ``0.95`` → ``95 %``; ``0.995`` → ``99.5 %``."""
    return f"{fraction * 100:.3g} %"
