"""The sweep's knee (SPEC §5.6, §5.14) as pure functions of its levels: no I/O, no clock.

Each level is judged against the **best level measured so far**, never only its neighbour, so
one noisy level cannot hide a later real gain: a *gain* when its median adds at least
``gain_min`` over the best and the runs put it above the best; *no gain* when the runs put it
below ``gain_min`` over the best, whatever the noise; *unsure* otherwise (``verdict.separation``:
the ranges, narrowed by Welch's interval at ``[confidence] level`` with three runs a side; a level
of five runs or more judged on its middle runs). The knee is the smallest level whose median is
within ``gain_min`` of the best level's: more in flight adds nothing beyond noise there.

**Sure** only when the runs back every comparison the knee rests on: each level below the knee
is beaten by the best (a gain), the best adds nothing that counts over the knee, and no level
above the best adds anything that counts. A pair left unsure (the sweep repeats the two,
interleaved, up to ``max_repeats``) is a *doubt*: the sweep is then inconclusive (exit 1, its
cause named) unless ``--conservative`` takes the smallest level the runs cannot tell from the
best. A knee at the last level tried, or with one run per level, is *not sure* and said so, but
no doubt: nothing was measured that contradicts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from calibrate.confidence import DEFAULT_LEVEL
from calibrate.stages.verdict.doubt import pct
from calibrate.stages.verdict.separation import (
    TRIM_FROM_RUNS,
    GainInterval,
    Judgement,
    LogSpread,
    Sample,
    gain_interval,
    judge_gain,
    judged_range,
    pooled,
)

__all__ = ["Judgement", "Point", "judged_range", "pct"]


@dataclass(frozen=True)
class Point:
    """One sweep level as the knee rule sees it: the median throughput of its runs, and their
    lowest and highest (None when it ran once: no range)."""

    concurrency: int
    items_per_s: float
    errors: int
    low: float | None = None
    high: float | None = None
    runs: tuple[float, ...] = ()  # each run's throughput (the knee's interval test reads them)

    @property
    def span(self) -> tuple[float, float]:
        low = self.items_per_s if self.low is None else self.low
        return low, self.items_per_s if self.high is None else self.high

    @property
    def sample(self) -> Sample:
        """As ``verdict.separation`` judges it: the median, the judged range, every run."""
        low, high = self.span
        return Sample(self.items_per_s, low, high, self.runs, self.low is not None)


def gain_over(best: Point, cur: Point) -> float | None:
    """The median gain of ``cur`` over ``best`` (None when the best had no throughput)."""
    return cur.items_per_s / best.items_per_s - 1 if best.items_per_s > 0 else None


def _ranged(best: Point, cur: Point) -> bool:
    return best.low is not None or cur.low is not None


def _apart(best: Point, cur: Point) -> bool:
    """``cur``'s slowest run beats ``best``'s fastest: the ranges do not overlap."""
    return cur.span[0] > best.span[1]


def judge(
    best: Point,
    cur: Point,
    gain_min: float,
    level: float = DEFAULT_LEVEL,
    spread: LogSpread | None = None,
) -> Judgement:
    """``cur`` against the best level below it, the interval at ``level`` with ``spread`` the
    sweep's pooled one (see the module's doc)."""
    if cur.errors or best.items_per_s <= 0:
        return "no gain"
    return judge_gain(best.sample, cur.sample, gain_min, level, spread)


def interval(
    best: Point, cur: Point, level: float = DEFAULT_LEVEL, spread: LogSpread | None = None
) -> GainInterval | None:
    """``cur``'s gain over ``best`` as far as their runs allow."""
    return gain_interval(best.sample, cur.sample, level, spread)


def spread_of(points: Sequence[Point]) -> LogSpread | None:
    """The runs' spread pooled over the clean levels (the noise every comparison shares)."""
    return pooled(p.sample for p in points if not p.errors)


def needs_repeat(
    points: Sequence[Point],
    cur: Point,
    gain_min: float,
    runs: int,
    max_repeats: int,
    level: float = DEFAULT_LEVEL,
) -> bool:
    """Run ``cur`` again: it is unsure against the best of ``points`` and has runs to spare."""
    spread = spread_of([*points, cur])
    best = best_of(points, gain_min, level, spread)
    unsure = best is not None and judge(best, cur, gain_min, level, spread) == "unsure"
    return unsure and runs < max_repeats


def best_of(
    points: Sequence[Point],
    gain_min: float,
    level: float = DEFAULT_LEVEL,
    spread: LogSpread | None = None,
) -> Point | None:
    """The best level so far: the first clean level, replaced by each later one that is a gain
    over it. None when the first level failed (the sweep stops at a failing level)."""
    spread = spread if spread is not None else spread_of(points)
    best: Point | None = None
    for point in points:
        if point.errors:
            break
        if best is None or judge(best, point, gain_min, level, spread) == "gain":
            best = point
    return best


@dataclass(frozen=True)
class Knee:
    """Where the knee is, the best level it is within noise of, and how sure the rule is."""

    knee: Point
    best: Point
    sure: bool
    text: str
    doubts: tuple[tuple[Point, Point], ...] = ()  # (base, cur) pairs the runs cannot tell apart
    conservative: Point | None = None  # the smallest level the runs cannot tell from the best

    @property
    def noisy(self) -> bool:
        """The knee rests on a comparison its runs could not settle (SPEC §5.14)."""
        return bool(self.doubts)


def find_knee(
    points: Sequence[Point],
    gain_min: float,
    level: float = DEFAULT_LEVEL,
    above: str = "",
    *,
    proven: bool = False,
    measure: str = "throughput",
) -> Knee | None:
    """The knee of the clean levels (those before the first failing one), the Welch interval at
    ``level``; None when the first level failed. ``above``: why no level above the last one was
    sent or counted, said instead of "may still rise" when the best is the last; ``proven``: that
    reason rules a higher throughput out (the server's own cap), so the knee can be sure there;
    ``measure``: what the points are, as the text names it (goodput under SLOs)."""
    clean: list[Point] = []
    for point in points:
        if point.errors:
            break
        clean.append(point)
    spread = spread_of(clean)
    best = best_of(clean, gain_min, level, spread)
    if best is None:
        return None
    knee = next(p for p in clean if within_noise(best, p, gain_min))
    doubts = knee_doubts(clean, knee, best, gain_min, level, spread)
    after = clean[clean.index(best) + 1 :]
    ranged = all(p.low is not None for p in clean)
    sure = not doubts and (bool(after) or proven) and ranged
    text = _text(points, clean, knee, best, doubts, (gain_min, level), sure, above, measure)
    below = [base for base, cur in doubts if cur is best and base is not knee]
    conservative = min([knee, *below], key=lambda p: p.concurrency)
    return Knee(knee, best, sure, text, tuple(doubts), conservative)


def within_noise(best: Point, cur: Point, gain_min: float) -> bool:
    """``cur``'s median is within ``gain_min`` of the best's: the best adds nothing that counts."""
    gain = gain_over(cur, best)
    return gain is None or gain < gain_min


def knee_doubts(
    clean: Sequence[Point],
    knee: Point,
    best: Point,
    gain_min: float,
    level: float,
    spread: LogSpread | None = None,
) -> list[tuple[Point, Point]]:
    """The comparisons the knee rests on that its runs leave unsure, as (base, cur): each level
    below the knee against the best (it must be beaten), the knee against the best (the best
    must add nothing that counts), the best against each level above it (they must add
    nothing that counts)."""
    out: list[tuple[Point, Point]] = []
    at_knee, at_best = clean.index(knee), clean.index(best)
    for point in clean[:at_knee]:
        if judge(point, best, gain_min, level, spread) == "unsure":
            out.append((point, best))
    if knee is not best and judge(knee, best, gain_min, level, spread) == "unsure":
        out.append((knee, best))
    for point in clean[at_best + 1 :]:
        if judge(best, point, gain_min, level, spread) == "unsure":
            out.append((best, point))
    return out


def _versus(best: Point, cur: Point) -> str:
    """``+34 % over 1, range +21 %…+49 %``: cur's median gain over best, and the gain as far
    apart as the runs go (none when neither level has a range)."""
    gain = gain_over(best, cur)
    text = f"{pct(gain) if gain is not None else '—'} over {best.concurrency}"
    (b_low, b_high), (c_low, c_high) = best.span, cur.span
    if _ranged(best, cur) and b_low > 0:
        text += f", range {pct(c_low / b_high - 1)}…{pct(c_high / b_low - 1)}"
        if max(len(best.runs), len(cur.runs)) >= TRIM_FROM_RUNS:  # not the table's min–max
            text += " (middle runs)"
    return text


def _text(
    points: Sequence[Point],
    clean: Sequence[Point],
    knee: Point,
    best: Point,
    doubts: Sequence[tuple[Point, Point]],
    rule: tuple[float, float],  # (gain_min, the confidence level)
    sure: bool,
    above: str = "",
    measure: str = "throughput",
) -> str:
    """``knee at 4 (+34 % over 1, range +21 %…+49 %); 8 adds −9 % over 4, range …: throughput
    fell; 16 adds +6 % over 4, …: within noise (the ranges overlap) — sure``."""
    gain_min, level = rule
    head = f"knee at {knee.concurrency}"
    if knee is not clean[0]:
        below = best_of(clean[: clean.index(knee)], gain_min, level) or clean[0]
        head += f" ({_versus(below, knee)})"
    parts = [head]
    if best is not knee:
        parts.append(
            f"the best is {best.concurrency} ({_versus(knee, best)}): {knee.concurrency} is "
            f"within {gain_min * 100:.0f} % of it"
        )
    unsure = {id(cur) for base, cur in doubts if base is best}
    for point in clean[clean.index(best) + 1 :]:
        if id(point) not in unsure:
            parts.append(
                f"{point.concurrency} adds {_versus(best, point)}: "
                f"{_why_not(best, point, gain_min, measure)}"
            )
    for base, cur in doubts:
        found = interval(base, cur, level, spread_of(clean))
        gain = f"{pct(found.median)} over {base.concurrency}" if found else _versus(base, cur)
        between = f", anywhere from {pct(found.low)} to {pct(found.high)}" if found else ""
        parts.append(
            f"{cur.concurrency} adds {gain}{between}: still unsure after the repeats, whether "
            f"it adds {gain_min * 100:.0f} % cannot be told from noise"
        )
    if len(clean) < len(points):
        failed = points[len(clean)]
        parts.append(f"{failed.concurrency} failed ({failed.errors} errors)")
    elif best is clean[-1]:
        parts.append(
            f"the best is the last level tried: {above}"
            if above
            else f"the best is the last level tried: {measure} may still rise above it"
        )
    if len(clean) > 1 and all(p.low is None for p in clean):
        parts.append(
            "one run per level: no range, so a gain cannot be told from noise "
            "(set [sweep] repeats = 3)"
        )
    return "; ".join(parts) + (" — sure" if sure else " — not sure")


def _why_not(best: Point, cur: Point, gain_min: float, measure: str = "throughput") -> str:
    """Why a level above the best is not a gain: noise only while the ranges really overlap —
    one whose fastest run is slower than the best's slowest fell, whatever its spread."""
    if _ranged(best, cur) and not _apart(best, cur) and not _apart(cur, best):
        return "within noise (the ranges overlap)"
    gain = gain_over(best, cur) or 0.0
    if gain < 0:
        return f"{measure} fell"
    return f"below the {gain_min * 100:.0f} % a level must add"
