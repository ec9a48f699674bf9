"""The sweep's knee (SPEC §5.6) as pure functions of its levels: no I/O, no clock.

Each level is judged against the **best level measured so far**, never only its neighbour, so
one noisy level cannot hide a later real gain. A level is a gain when its median adds at least
``gain_min`` over the best *and* its range sits above the best's; it is ``unsure`` when the
medians differ by more than ``gain_min`` but the ranges overlap (the sweep then repeats it, up
to ``[sweep] max_repeats``, before judging it). The knee is the smallest level whose median is
within ``gain_min`` of the best level's: more in flight adds nothing beyond noise there.

A level with five or more runs is judged on the range of its middle runs (its fastest and
slowest run left out): one hiccup on a busy machine does not decide, and repeating a level can
then narrow its range instead of only ever widening it.

Ranges that still overlap are not the last word: with at least ``MIN_RUNS_FOR_INTERVAL`` runs on
both sides, a level whose median adds ``gain_min`` is a gain when the Welch interval of its mean
throughput minus the best's, at ``[confidence] level`` (``level``, 95 % by default), lies wholly
above zero (``calibrate.confidence.compare``). On a busy machine one fast outlier
run of the best level widens its range over a real gain; the interval weighs every run instead
of the two extremes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from calibrate.confidence import DEFAULT_LEVEL, compare, spread
from calibrate.stages.measure.stop_rules import Point

Judgement = Literal["gain", "no gain", "unsure"]
TRIM_FROM_RUNS = 5  # from this many runs on, a level's judged range leaves out its two extremes
MIN_RUNS_FOR_INTERVAL = 3  # runs on each side before the Welch interval may settle a gain


def judged_range(values: Sequence[float]) -> tuple[float, float] | None:
    """The (low, high) a level is judged on: all its runs, or the middle ones from 5 runs on;
    None for a single run (no range)."""
    if len(values) < 2:
        return None
    ordered = sorted(values)
    if len(ordered) >= TRIM_FROM_RUNS:
        ordered = ordered[1:-1]
    return ordered[0], ordered[-1]


def gain_over(best: Point, cur: Point) -> float | None:
    """The median gain of ``cur`` over ``best`` (None when the best had no throughput)."""
    return cur.items_per_s / best.items_per_s - 1 if best.items_per_s > 0 else None


def _ranged(best: Point, cur: Point) -> bool:
    return best.low is not None or cur.low is not None


def _apart(best: Point, cur: Point) -> bool:
    """``cur``'s slowest run beats ``best``'s fastest: the ranges do not overlap."""
    return cur.span[0] > best.span[1]


def judge(best: Point, cur: Point, gain_min: float, level: float = DEFAULT_LEVEL) -> Judgement:
    """``cur`` against the best level below it, the interval at ``level`` (see the module's doc)."""
    gain = gain_over(best, cur)
    if cur.errors or gain is None or gain < gain_min:
        return "no gain"
    if _apart(best, cur) or _interval_above(best, cur, level):
        return "gain"
    return "unsure" if gain > gain_min and _ranged(best, cur) else "no gain"


def _interval_above(best: Point, cur: Point, level: float) -> bool:
    """``cur``'s mean beats ``best``'s beyond the Welch interval at ``level`` (enough runs on
    both)."""
    if min(len(best.runs), len(cur.runs)) < MIN_RUNS_FOR_INTERVAL:
        return False
    a, b = spread(best.runs, level), spread(cur.runs, level)
    if a is None or b is None:
        return False
    low = compare(a, b).ci_low
    return low is not None and low > 0


def needs_repeat(
    points: Sequence[Point],
    cur: Point,
    gain_min: float,
    runs: int,
    max_repeats: int,
    level: float = DEFAULT_LEVEL,
) -> bool:
    """Run ``cur`` again: it is unsure against the best of ``points`` and has runs to spare."""
    best = best_of(points, gain_min, level)
    unsure = best is not None and judge(best, cur, gain_min, level) == "unsure"
    return unsure and runs < max_repeats


def best_of(points: Sequence[Point], gain_min: float, level: float = DEFAULT_LEVEL) -> Point | None:
    """The best level so far: the first clean level, replaced by each later one that is a gain
    over it. None when the first level failed (the sweep stops at a failing level)."""
    best: Point | None = None
    for point in points:
        if point.errors:
            break
        if best is None or judge(best, point, gain_min, level) == "gain":
            best = point
    return best


@dataclass(frozen=True)
class Knee:
    """Where the knee is, the best level it is within noise of, and how sure the rule is."""

    knee: Point
    best: Point
    sure: bool
    text: str


def find_knee(
    points: Sequence[Point], gain_min: float, level: float = DEFAULT_LEVEL, above: str = ""
) -> Knee | None:
    """The knee of the clean levels (those before the first failing one), the Welch interval at
    ``level``; None when the first level failed. ``above``: why no level above the last one was
    sent (the ladder's proof), said instead of "may still rise" when the best is the last."""
    clean: list[Point] = []
    for point in points:
        if point.errors:
            break
        clean.append(point)
    best = best_of(clean, gain_min, level)
    if best is None:
        return None
    knee = next(p for p in clean if within_noise(best, p, gain_min))
    doubts = _doubts(clean, gain_min, level)
    at = next(n for n, p in enumerate(clean) if p is knee)
    beyond = [d for d, _ in doubts if any(d is p for p in clean[at + 1 :])]
    after = clean[clean.index(best) + 1 :]
    sure = not beyond and bool(after) and all(p.low is not None for p in clean)
    text = _text(points, clean, knee, best, doubts, (gain_min, level), sure, above)
    return Knee(knee, best, sure, text)


def within_noise(best: Point, cur: Point, gain_min: float) -> bool:
    """``cur``'s median is within ``gain_min`` of the best's: the best adds nothing that counts."""
    gain = gain_over(cur, best)
    return gain is None or gain < gain_min


def _doubts(clean: Sequence[Point], gain_min: float, level: float) -> list[tuple[Point, Point]]:
    """(level, the best it was judged against) for each level left unsure after its repeats."""
    out: list[tuple[Point, Point]] = []
    best: Point | None = None
    for point in clean:
        if best is None:
            best = point
            continue
        verdict = judge(best, point, gain_min, level)
        if verdict == "unsure":
            out.append((point, best))
        elif verdict == "gain":
            best = point
    return out


def pct(value: float) -> str:
    percent = round(value * 100) or 0  # never "−0 %"
    return f"{percent:+d} %".replace("-", "−")


def _versus(best: Point, cur: Point) -> str:
    """``+34 % over 1, range +21 %…+49 %``: cur's median gain over best, and the gain as far
    apart as the runs go (none when neither level has a range)."""
    gain = gain_over(best, cur)
    text = f"{pct(gain) if gain is not None else '—'} over {best.concurrency}"
    (b_low, b_high), (c_low, c_high) = best.span, cur.span
    if _ranged(best, cur) and b_low > 0:
        text += f", range {pct(c_low / b_high - 1)}…{pct(c_high / b_low - 1)}"
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
    unsure = {id(d) for d, _ in doubts}
    for point in clean[clean.index(best) + 1 :]:
        if id(point) not in unsure:
            parts.append(
                f"{point.concurrency} adds {_versus(best, point)}: {_why_not(best, point, gain_min)}"
            )
    for point, against in doubts:
        parts.append(
            f"{point.concurrency} adds {_versus(against, point)}: the ranges still overlap "
            "after its repeats, a gain cannot be told from noise"
        )
    if len(clean) < len(points):
        failed = points[len(clean)]
        parts.append(f"{failed.concurrency} failed ({failed.errors} errors)")
    elif best is clean[-1]:
        parts.append(
            f"the best is the last level tried: {above}"
            if above
            else "the best is the last level tried: throughput may still rise above it"
        )
    if len(clean) > 1 and all(p.low is None for p in clean):
        parts.append(
            "one run per level: no range, so a gain cannot be told from noise "
            "(set [sweep] repeats = 3)"
        )
    return "; ".join(parts) + (" — sure" if sure else " — not sure")


def _why_not(best: Point, cur: Point, gain_min: float) -> str:
    """Why a level above the best is not a gain: noise only while the ranges really overlap —
    one whose fastest run is slower than the best's slowest fell, whatever its spread."""
    if _ranged(best, cur) and not _apart(best, cur) and not _apart(cur, best):
        return "within noise (the ranges overlap)"
    gain = gain_over(best, cur) or 0.0
    if gain < 0:
        return "throughput fell"
    return f"below the {gain_min * 100:.0f} % a level must add"
