"""Whether two settings' runs tell them apart (SPEC §5.14, §13): pure, on lists of throughputs.

``gain_interval(base, cur, pooled)`` is how much ``cur`` adds over ``base`` as far as the runs
allow: the median gain, and an interval around it — a t-interval of the difference of the two
settings' mean log-throughput at the confidence level, its spread the larger of the two
settings' own and the spread **shared by every setting the stage measured** (``pooled``: the
median of their spreads, with all their degrees of freedom). Sharing is what lets two runs a
setting decide on a quiet machine (a setting's own two runs say little about the noise; eight
runs of four settings say much); taking the larger keeps a pair that agreed by chance from
borrowing the others' calm, and the median keeps one setting's bad minute from making every
other pair unsure. Without any spread (one run everywhere) the
ranges decide: cur's slowest over base's fastest to cur's fastest over base's slowest; a setting
of five runs or more is ranged on its middle runs (its fastest and slowest left out).

``judge_gain`` reads that interval against ``gain_min``, the least a setting must add to count:

- **gain**: the median adds at least ``gain_min`` and the interval lies above zero;
- **no gain**: the interval lies below ``gain_min`` — whatever the noise, cur adds less;
- **unsure**: anything else — the runs cannot tell, and the stage repeats the two (interleaved,
  ``next_of_pair``) before it judges; still unsure at the repeat budget, its verdict is
  inconclusive (``verdict.doubt``).

One run on each side and no spread to pool: the medians alone decide, and the stage says it is
not sure.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from calibrate.confidence import DEFAULT_LEVEL, check_level, t_quantile

Judgement = Literal["gain", "no gain", "unsure"]
TRIM_FROM_RUNS = 5  # from this many runs on, a level's judged range leaves out its two extremes
FUTILE_FROM_RUNS = 3  # runs on each side before more of them may be judged futile
FUTILE_WIDTH = 4.0  # an interval this many gain_min wide at the repeat budget: too noisy to tell


def judged_range(values: Sequence[float]) -> tuple[float, float] | None:
    """The (low, high) a setting is judged on: all its runs, or the middle ones from 5 runs on;
    None for a single run (no range)."""
    if len(values) < 2:
        return None
    ordered = sorted(values)
    if len(ordered) >= TRIM_FROM_RUNS:
        ordered = ordered[1:-1]
    return ordered[0], ordered[-1]


@dataclass(frozen=True)
class Sample:
    """A setting's runs as they are judged: the median, the judged range, every run."""

    median: float
    low: float
    high: float
    runs: tuple[float, ...] = ()  # each run (the Welch interval reads them; may be empty)
    ranged: bool = True  # False: one run, no range

    @classmethod
    def of(cls, values: Sequence[float]) -> Sample:
        """``values`` (at least one), judged on ``judged_range``."""
        middle = statistics.median(values)
        found = judged_range(values)
        low, high = found if found is not None else (middle, middle)
        return cls(middle, low, high, tuple(values), found is not None)


@dataclass(frozen=True)
class GainInterval:
    """cur over base: the median gain and the interval the runs allow (fractions: 0.1 = +10 %)."""

    median: float
    low: float
    high: float
    ranged: bool  # either side had more than one run
    runs: tuple[int, int]  # (base's, cur's)


@dataclass(frozen=True)
class LogSpread:
    """The runs' spread in log-throughput (≈ their relative spread) and its degrees of freedom."""

    sd: float
    dof: int


def _logs(sample: Sample) -> list[float] | None:
    runs = sample.runs or ((sample.median,) if not sample.ranged else ())
    return [math.log(v) for v in runs] if runs and all(v > 0 for v in runs) else None


def _sd(logs: Sequence[float]) -> float:
    mean = math.fsum(logs) / len(logs)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in logs) / (len(logs) - 1))


def pooled(samples: Iterable[Sample]) -> LogSpread | None:
    """The spread the settings' runs share (None: no setting ran twice): the median of their
    own spreads — one setting that had a bad minute does not make every other pair unsure,
    and most settings noisy makes them all so — with the degrees of freedom of them all."""
    sds: list[float] = []
    dof = 0
    for sample in samples:
        logs = _logs(sample)
        if logs is not None and len(logs) >= 2:
            sds.append(_sd(logs))
            dof += len(logs) - 1
    return LogSpread(statistics.median(sds), dof) if sds else None


def _own(base: Sequence[float], cur: Sequence[float]) -> LogSpread | None:
    """The pair's own spread, pooled over both (None: neither ran twice)."""
    squares = 0.0
    dof = 0
    for logs in (base, cur):
        if len(logs) >= 2:
            squares += _sd(logs) ** 2 * (len(logs) - 1)
            dof += len(logs) - 1
    return LogSpread(math.sqrt(squares / dof), dof) if dof else None


def gain_interval(
    base: Sample,
    cur: Sample,
    level: float = DEFAULT_LEVEL,
    spread_of_all: LogSpread | None = None,
    runs: int | None = None,
) -> GainInterval | None:
    """How much ``cur`` adds over ``base`` (see the module's doc); None with no throughput at
    ``base``. ``runs``: the interval as it would be with that many runs of each, at the spread
    the stage's settings share (``futile`` asks it)."""
    if base.median <= 0:
        return None
    counts = (max(1, len(base.runs)), max(1, len(cur.runs)))
    median = cur.median / base.median - 1
    a, b = _logs(base), _logs(cur)
    own = _own(a, b) if a is not None and b is not None and runs is None else None
    found = [s for s in (own, spread_of_all) if s is not None]
    if a is not None and b is not None and found:
        use = max(found, key=lambda s: (s.sd, -s.dof))  # the wider, on its own freedom
        n_a, n_b = (max(runs, len(a)), max(runs, len(b))) if runs else (len(a), len(b))
        dof = use.dof + (n_a - len(a)) + (n_b - len(b))
        se = use.sd * math.sqrt(1 / n_a + 1 / n_b)
        half = t_quantile(0.5 + check_level(level) / 2, dof) * se
        diff = math.fsum(b) / len(b) - math.fsum(a) / len(a)
        low, high = math.expm1(max(-700.0, diff - half)), math.expm1(min(700.0, diff + half))
        return GainInterval(median, low, high, True, counts)
    low = cur.low / base.high - 1 if base.high > 0 else -math.inf
    high = cur.high / base.low - 1 if base.low > 0 else math.inf
    return GainInterval(median, low, high, base.ranged or cur.ranged, counts)


def judge_gain(
    base: Sample,
    cur: Sample,
    gain_min: float,
    level: float = DEFAULT_LEVEL,
    spread_of_all: LogSpread | None = None,
) -> Judgement:
    """``cur`` against ``base`` (see the module's doc)."""
    found = gain_interval(base, cur, level, spread_of_all)
    if found is None:
        return "no gain"
    if found.median >= gain_min and found.low > 0:
        return "gain"
    if not found.ranged or found.high < gain_min:
        return "no gain"
    return "unsure"


def futile(
    base: Sample,
    cur: Sample,
    gain_min: float,
    level: float = DEFAULT_LEVEL,
    spread_of_all: LogSpread | None = None,
    budget: int = 6,
) -> bool:
    """More runs cannot settle it: were both settings run ``budget`` times at the spread the
    stage's settings share (not the pair's own, which one outlier inflates and more runs may
    shrink), their interval would still be wider than ``FUTILE_WIDTH`` × ``gain_min`` — the
    machine is too noisy to tell ``gain_min`` apart at all, wherever the medians land — so the
    stage stops repeating them at once instead of spending its budget on a foregone doubt. A
    pair whose medians merely sit near ``gain_min`` is repeated: more runs move medians."""
    if spread_of_all is None or min(len(base.runs), len(cur.runs)) < FUTILE_FROM_RUNS:
        return False  # two runs' spread is too loose a guess to project from
    found = gain_interval(base, cur, level, spread_of_all, runs=budget)
    if found is None or not found.ranged:
        return False
    return math.log1p(found.high) - math.log1p(max(found.low, -0.999)) > FUTILE_WIDTH * gain_min


def next_of_pair(
    runs: tuple[int, int], budget: int, first: Literal[0, 1] = 0
) -> Literal[0, 1] | None:
    """Which of two settings to run next when repeating them to tell them apart: the one with
    fewer runs (``first`` on a tie), so the repeats go A B A B … and a drift of the machine
    weighs on both alike; None when both have ``budget`` runs."""
    a, b = runs
    if a >= budget and b >= budget:
        return None
    if a >= budget:
        return 1
    if b >= budget:
        return 0
    if a == b:
        return first
    return 0 if a < b else 1
