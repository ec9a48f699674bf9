"""The stop rules as pure functions of the history (SPEC §5.3, §5.6): no I/O, no clock."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from calibrate.config import SloConfig
from calibrate.stages.slo import p99_breaches
from calibrate.stages.tiers import Stats, StopReason, Tier, Verdict


def tier_verdict(
    stats: Stats,
    previous: Stats | None,
    *,
    vram_limit: float,
    latency_rise: float,
    slo: SloConfig | None = None,
    rounds_run: int = 1,
    rounds_planned: int = 1,
) -> tuple[Verdict, str]:
    """fail → stop: slo → stop: vram → stop: latency → pass, with the reason in words.

    An SLO breach is judged before the VRAM and latency rules because those keep their tier as
    passed, and a tier over the user's own latency bound cannot be kept.
    """
    where = f"batch {stats.batch_size}"
    if stats.errors:
        return "fail", (
            f"{where}: {stats.errors} of {stats.items} requests failed ({stats.kinds_text})"
            + (f" in round {rounds_run}" if rounds_planned > 1 else "")
        )
    if slo is not None and (breaches := p99_breaches(stats, slo)):
        return "stop: slo", (
            f"{where}: {'; '.join(breaches)}; not kept, the tier before is the last passing"
        )
    if stats.pressure is not None and stats.pressure >= vram_limit:
        return "stop: vram", (
            f"{where}: VRAM pressure {stats.pressure:.0%} ({stats.pressure_source}) reached "
            f"the limit {vram_limit:.0%}; not stepping higher"
        )
    rise = latency_ratio(stats, previous)
    if rise is not None and rise > latency_rise:
        assert previous is not None and previous.per_item_s and stats.per_item_s
        return "stop: latency", (
            f"{where}: {_secs(stats.per_item_s)} per item is {rise:.2f}× batch "
            f"{previous.batch_size}'s {_secs(previous.per_item_s)} (limit {latency_rise:g}×): "
            "batching made each item more expensive; kept, flagged for a look"
        )
    return "pass", f"{where}: {stats.items} requests clean"


def _secs(value: float) -> str:
    return f"{value:.3g} s"


def latency_ratio(stats: Stats, previous: Stats | None) -> float | None:
    """This tier's ``per_item_s`` (wall time / items) over the previous tier's. Request latency
    always rises with the batch on a busy engine; the time each item costs must not."""
    if previous is None or not previous.per_item_s or stats.per_item_s is None:
        return None
    return stats.per_item_s / previous.per_item_s


def next_tier(history: Sequence[Tier], batch_sizes: Sequence[int]) -> int | None:
    """The batch size to try next, or None when the ladder is done."""
    if not history:
        return batch_sizes[0] if batch_sizes else None
    if history[-1].verdict != "pass":
        return None
    done = len(history)
    return batch_sizes[done] if done < len(batch_sizes) else None


def last_passing(history: Sequence[Tier]) -> Tier | None:
    """The highest tier kept as passed (stop: vram and stop: latency tiers count, stop: slo not)."""
    passing = [t for t in history if t.passed]
    return passing[-1] if passing else None


def stopped_by(history: Sequence[Tier], batch_sizes: Sequence[int]) -> StopReason:
    if not history:
        return "interrupted"
    verdict = history[-1].verdict
    if verdict == "fail":
        return "failure"
    if verdict == "stop: slo":
        return "slo"
    if verdict == "stop: vram":
        return "vram"
    if verdict == "stop: latency":
        return "latency"
    return "completed" if len(history) >= len(batch_sizes) else "interrupted"


def mismatch_notes(history: Sequence[Tier]) -> list[str]:
    """One note per tier whose outputs differ from the single-call baseline."""
    notes: list[str] = []
    for tier in history:
        s = tier.stats
        if s.baseline_match is None or not s.baseline_items or not tier.passed:
            continue
        if s.baseline_match < s.baseline_items:
            notes.append(
                f"outputs differ from the single-call baseline at batch {s.batch_size}: "
                f"{s.baseline_match} of {s.baseline_items} outputs match the baseline, "
                f"{s.baseline_items - s.baseline_match} differ: this server is not batch-invariant"
            )
    return notes


@dataclass(frozen=True)
class Point:
    """One sweep level as the knee rule sees it: the median throughput of its runs, and their
    lowest and highest (None when it ran once: no range)."""

    concurrency: int
    items_per_s: float
    errors: int
    low: float | None = None
    high: float | None = None

    @property
    def span(self) -> tuple[float, float]:
        low = self.items_per_s if self.low is None else self.low
        return low, self.items_per_s if self.high is None else self.high


def gains(points: Sequence[Point]) -> list[float | None]:
    """Median throughput gain of each level over the previous one (None for the first)."""
    out: list[float | None] = [None]
    for prev, cur in pairwise(points):
        out.append(cur.items_per_s / prev.items_per_s - 1 if prev.items_per_s > 0 else None)
    return out


def gain_range(prev: Point, cur: Point) -> tuple[float, float] | None:
    """The gain as far apart as the runs allow: this level's lowest over the previous level's
    highest, and its highest over the previous lowest."""
    (p_low, p_high), (c_low, c_high) = prev.span, cur.span
    if p_low <= 0:
        return None
    return c_low / p_high - 1, c_high / p_low - 1


def overlaps(prev: Point, cur: Point) -> bool:
    """The two levels' ranges share a value: this level's slowest run is no faster than the
    previous level's fastest, so a gain between them cannot be told from noise."""
    return cur.span[0] <= prev.span[1]


def counts_as_gain(prev: Point, cur: Point, gain_min: float) -> bool:
    """A clean level whose median adds ≥ ``gain_min`` and whose range sits above the last one."""
    gain = gains([prev, cur])[1]
    return not cur.errors and gain is not None and gain >= gain_min and not overlaps(prev, cur)


def knee(points: Sequence[Point], gain_min: float) -> Point | None:
    """The last level of the unbroken run of levels that each count as a gain, with no errors —
    where the curve stops rising. None when even the first level failed."""
    if not points or points[0].errors:
        return None
    best = points[0]
    for prev, cur in pairwise(points):
        if not counts_as_gain(prev, cur, gain_min):
            break
        best = cur
    return best


def _pct(value: float) -> str:
    percent = round(value * 100) or 0  # never "−0 %"
    return f"{percent:+d} %".replace("-", "−")


def _gain_parts(prev: Point, cur: Point) -> tuple[str, str]:
    """(``+3 %``, ``range −4 %…+9 %``); the range is empty when neither level has one."""
    gain = gains([prev, cur])[1]
    span = gain_range(prev, cur)
    ranged = span is not None and (prev.low is not None or cur.low is not None)
    return (
        _pct(gain) if gain is not None else "—",
        f"range {_pct(span[0])}…{_pct(span[1])}" if span is not None and ranged else "",
    )


def knee_text(points: Sequence[Point], gain_min: float) -> str:
    """The knee and how sure it is, e.g. ``knee at 4 (4 adds +85 % over 2 (range +70 %…+95 %));
    8 adds +3 % (range −4 %…+9 %): within noise``. Empty when there is no knee."""
    top = knee(points, gain_min)
    if top is None:
        return ""
    at = points.index(top)
    text = f"knee at {top.concurrency}"
    if at > 0:
        gain, span = _gain_parts(points[at - 1], top)
        text += f" ({gain} over {points[at - 1].concurrency}{', ' + span if span else ''})"
    if at + 1 == len(points):
        text += "; the last level tried: throughput may still rise above it"
    else:
        nxt = points[at + 1]
        if nxt.errors:
            text += f"; {nxt.concurrency} failed ({nxt.errors} errors)"
        else:
            gain, span = _gain_parts(top, nxt)
            span = f" ({span})" if span else ""
            text += f"; {nxt.concurrency} adds {gain}{span}: {_why_not(top, nxt, gain_min)}"
    if len(points) > 1 and all(p.low is None for p in points):
        text += (
            " — one run per level: no range, so a gain cannot be told from noise "
            "(set [sweep] repeats = 3)"
        )
    return text


def _why_not(prev: Point, cur: Point, gain_min: float) -> str:
    if overlaps(prev, cur) and (prev.low is not None or cur.low is not None):
        return "within noise (the ranges overlap)"
    gain = gains([prev, cur])[1] or 0.0
    if gain < 0:
        return "throughput fell"
    return f"below the {gain_min * 100:.0f} % a level must add"


def continue_sweep(points: Sequence[Point]) -> bool:
    """The sweep stops at the first level with errors."""
    return not points or points[-1].errors == 0
