"""The stop rules as pure functions of the history (SPEC §5.3, §5.6): no I/O, no clock.

A sweep level as the knee rule sees it is ``verdict.knee.Point``; the ladder's setting among its
kept tiers is ``stages.ladder.setting``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any, Literal

from calibrate.config import SloConfig
from calibrate.stages.measure.slo import p99_breaches
from calibrate.stages.measure.tier import StopReason, Tier, Verdict
from calibrate.stages.measure.tiers import Stats
from calibrate.stages.verdict.knee import Point

LatencySeen = Literal["rise", "unsure", "flat"]


@dataclass(frozen=True)
class ServerCap:
    """The server's own limit on sequences decoded at once, when it is known."""

    slots: int
    source: str  # "llama.cpp /props total_slots", "SGLang max_running_requests", …

    def to_json(self) -> dict[str, Any]:
        return {"slots": self.slots, "source": self.source}


def tier_verdict(
    stats: Stats,
    previous: Stats | None,
    *,
    vram_limit: float,
    latency_rise: float,
    slo: SloConfig | None = None,
    rounds_run: int = 1,
    rounds_planned: int = 1,
    rounds: Sequence[Stats] = (),
    previous_rounds: Sequence[Stats] = (),
    cap: ServerCap | None = None,
) -> tuple[Verdict, str]:
    """fail → stop: slo → stop: cap → stop: preempt → stop: vram → stop: latency → pass, with
    the reason in words.

    The rules that do not keep their tier (an SLO breach, the server's cap below B, preempted
    requests) are judged before the VRAM and latency rules, which keep theirs. ``rounds`` and
    ``previous_rounds`` are the rounds of this tier and the one before: the latency rule fires
    only on a rise beyond their spread (``latency_seen``).
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
    if cap is not None and cap.slots < stats.batch_size:
        return "stop: cap", (
            f"{where}: the server's own cap is {cap.slots} ({cap.source}), below {where}: the "
            f"tier measured the server's queue, not {where}; not kept"
        )
    if stats.preemptions:
        requests = "request" if stats.preemptions == 1 else "requests"
        return "stop: preempt", (
            f"{where}: the server preempted {stats.preemptions} {requests} during the tier "
            f"({stats.preemption_metric} +{stats.preemptions}): its KV cache is full at this "
            "batch; not kept"
        )
    if stats.pressure is not None and stats.pressure >= vram_limit:
        return "stop: vram", (
            f"{where}: VRAM pressure {stats.pressure:.0%} ({stats.pressure_source}) reached "
            f"the limit {vram_limit:.0%}; not stepping higher"
        )
    rise = latency_ratio(stats, previous)
    seen = latency_seen(stats, previous, rounds, previous_rounds, latency_rise)
    if rise is not None and seen != "flat":
        assert previous is not None and previous.per_item_s and stats.per_item_s
        said = (
            f"{where}: {_secs(stats.per_item_s)} per item is {rise:.2f}× batch "
            f"{previous.batch_size}'s {_secs(previous.per_item_s)} (limit {latency_rise:g}×)"
        )
        if seen == "rise" or every_round_slower(rounds, previous_rounds):
            return "stop: latency", (
                f"{said}: batching made each item more expensive; kept, flagged for a look"
            )
        return "pass", (
            f"{said}, but within the spread of {len(rounds)} rounds: not a stop; "
            f"{stats.items} requests clean"
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


def _per_item(rounds: Sequence[Stats]) -> list[float]:
    return [r.per_item_s for r in rounds if r.per_item_s]


def latency_seen(
    stats: Stats,
    previous: Stats | None,
    rounds: Sequence[Stats],
    previous_rounds: Sequence[Stats],
    limit: float,
) -> LatencySeen:
    """Whether the time per item rose beyond ``limit`` over the previous tier, beyond the
    spread of the rounds: ``rise`` when even this tier's fastest round over the previous
    tier's slowest is above the limit, ``flat`` when the rounds' medians are within it, and
    ``unsure`` when the medians are above it but the rounds disagree (more rounds can tell)."""
    rise = latency_ratio(stats, previous)
    now, before = _per_item(rounds), _per_item(previous_rounds)
    if now and before:  # the rounds' medians: one slow round of a busy box does not move them
        rise = median(now) / median(before)
    if rise is None or rise <= limit:
        return "flat"
    if not now or not before:
        return "rise"
    return "rise" if min(now) / max(before) > limit else "unsure"


def every_round_slower(rounds: Sequence[Stats], previous_rounds: Sequence[Stats]) -> bool:
    """Every round of this tier took longer per item than every round of the tier before:
    after the most rounds the ladder runs, a rise whose ranges do not overlap is a stop."""
    now, before = _per_item(rounds), _per_item(previous_rounds)
    return bool(now and before) and min(now) > max(before)


def reached(history: Sequence[Tier]) -> list[Tier]:
    """The tiers a batch ladder stands on: up to and including the first whose verdict is not
    ``pass``, where the ladder stopped. A round run again to settle the setting can stop a tier
    below the top (it failed, met the server's cap, preempted): the ladder stops there as it
    would have the first time, and the tiers above it, run before, are not judged — never a last
    passing tier, a setting or "every tier passed" above a tier that failed."""
    out: list[Tier] = []
    for tier in history:
        out.append(tier)
        if tier.verdict != "pass":
            break
    return out


def next_tier(history: Sequence[Tier], batch_sizes: Sequence[int]) -> int | None:
    """The batch size to try next, or None when the ladder is done."""
    if not history:
        return batch_sizes[0] if batch_sizes else None
    if history[-1].verdict != "pass":
        return None
    done = len(history)
    return batch_sizes[done] if done < len(batch_sizes) else None


def last_passing(history: Sequence[Tier]) -> Tier | None:
    """The highest tier kept as passed (stop: vram and stop: latency tiers count; stop: slo,
    cap and preempt not): the ceiling the ladder reached."""
    passing = [t for t in history if t.passed]
    return passing[-1] if passing else None


def stopped_by(history: Sequence[Tier], batch_sizes: Sequence[int]) -> StopReason:
    """What stopped the ladder: the verdict of the last tier of ``history`` (a batch ladder
    passes the tiers it stands on, ``reached``; the context axis every length it bisected)."""
    if not history:
        return "interrupted"
    verdict = history[-1].verdict
    if verdict == "fail":
        return "failure"
    reasons: dict[str, StopReason] = {
        "stop: slo": "slo",
        "stop: cap": "cap",
        "stop: preempt": "preempt",
        "stop: vram": "vram",
        "stop: latency": "latency",
    }
    if verdict in reasons:
        return reasons[verdict]
    return "completed" if len(history) >= len(batch_sizes) else "interrupted"


def mismatch_notes(history: Sequence[Tier]) -> list[str]:
    """One note per tier whose outputs differ from the single-call baseline. The batch is
    blamed only where batch 1 (one request at a time) matched: outputs that differ there
    already say the server's answer changed since the baseline, at every batch."""
    differs = [
        t
        for t in history
        if t.passed
        and t.stats.baseline_match is not None
        and t.stats.baseline_match < t.stats.baseline_items
    ]
    alone = any(t.stats.batch_size == 1 for t in differs)
    notes: list[str] = []
    for tier in differs:
        s = tier.stats
        assert s.baseline_match is not None
        if s.batch_size == 1:
            why = (
                "one at a time, so not the batch: the server answers otherwise than when the "
                "baseline was recorded (its build, weights or flags?); run calibrate repro"
            )
        elif alone:
            why = "as they already did at batch 1: not the batch"
        else:
            why = "this server is not batch-invariant"
        notes.append(
            f"outputs differ from the single-call baseline at batch {s.batch_size}: "
            f"{s.baseline_match} of {s.baseline_items} outputs match the baseline, "
            f"{s.baseline_items - s.baseline_match} differ: {why}"
        )
    return notes


def continue_sweep(points: Sequence[Point]) -> bool:
    """The sweep stops at the first level with errors."""
    return not points or points[-1].errors == 0
