"""The stop rules as pure functions of the history (SPEC §5.3, §5.6): no I/O, no clock."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from calibrate.stages.tiers import Stats, StopReason, Tier, Verdict


def tier_verdict(
    stats: Stats,
    previous: Stats | None,
    *,
    vram_limit: float,
    latency_rise: float,
    rounds_run: int = 1,
    rounds_planned: int = 1,
) -> tuple[Verdict, str]:
    """fail → stop: vram → stop: latency → pass, in that order, with the reason in words."""
    where = f"batch {stats.batch_size}"
    if stats.errors:
        return "fail", (
            f"{where}: {stats.errors} of {stats.items} requests failed ({stats.kinds_text})"
            + (f" in round {rounds_run}" if rounds_planned > 1 else "")
        )
    if stats.pressure is not None and stats.pressure >= vram_limit:
        return "stop: vram", (
            f"{where}: VRAM pressure {stats.pressure:.0%} ({stats.pressure_source}) reached "
            f"the limit {vram_limit:.0%}; not stepping higher"
        )
    rise = latency_ratio(stats, previous)
    if rise is not None and rise > latency_rise:
        assert previous is not None
        return "stop: latency", (
            f"{where}: mean per-item latency {stats.per_item_mean_s:.3f}s is {rise:.2f}× "
            f"batch {previous.batch_size}'s (limit {latency_rise:g}×); kept, flagged for a look"
        )
    return "pass", f"{where}: {stats.items} requests clean"


def latency_ratio(stats: Stats, previous: Stats | None) -> float | None:
    """This tier's mean per-item latency over the previous tier's. The mean, not the median:
    when half a batch queues behind the other half, the median does not move but users wait."""
    if previous is None or not previous.per_item_mean_s or stats.per_item_mean_s is None:
        return None
    return stats.per_item_mean_s / previous.per_item_mean_s


def next_tier(history: Sequence[Tier], batch_sizes: Sequence[int]) -> int | None:
    """The batch size to try next, or None when the ladder is done."""
    if not history:
        return batch_sizes[0] if batch_sizes else None
    if history[-1].verdict != "pass":
        return None
    done = len(history)
    return batch_sizes[done] if done < len(batch_sizes) else None


def last_passing(history: Sequence[Tier]) -> Tier | None:
    """The highest tier kept as passed (stop: vram and stop: latency tiers count)."""
    passing = [t for t in history if t.passed]
    return passing[-1] if passing else None


def stopped_by(history: Sequence[Tier], batch_sizes: Sequence[int]) -> StopReason:
    if not history:
        return "interrupted"
    verdict = history[-1].verdict
    if verdict == "fail":
        return "failure"
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
                f"outputs differ from the single-call baseline at batch {s.batch_size} "
                f"({s.baseline_match}/{s.baseline_items}): this server is not batch-invariant"
            )
    return notes


@dataclass(frozen=True)
class Point:
    """One sweep level as the knee rule sees it."""

    concurrency: int
    items_per_s: float
    errors: int


def gains(points: Sequence[Point]) -> list[float | None]:
    """Throughput gain of each level over the previous one (None for the first)."""
    out: list[float | None] = [None]
    for prev, cur in pairwise(points):
        out.append(cur.items_per_s / prev.items_per_s - 1 if prev.items_per_s > 0 else None)
    return out


def knee(points: Sequence[Point], gain_min: float) -> Point | None:
    """The last level of the unbroken run of levels that each add ≥ ``gain_min`` throughput,
    with no errors — where the curve stops rising. None when even the first level failed."""
    if not points or points[0].errors:
        return None
    best = points[0]
    for point, gain in zip(points[1:], gains(points)[1:], strict=False):
        if point.errors or gain is None or gain < gain_min:
            break
        best = point
    return best


def continue_sweep(points: Sequence[Point]) -> bool:
    """The sweep stops at the first level with errors."""
    return not points or points[-1].errors == 0
