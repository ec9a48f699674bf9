"""The stop rules as pure functions of the history (SPEC §5.3, §5.6): no I/O, no clock."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import Literal

from calibrate.config import SloConfig
from calibrate.stages.measure.slo import p99_breaches
from calibrate.stages.measure.tiers import Stats, StopReason, Tier, Verdict
from calibrate.stages.verdict.separation import Sample

LatencySeen = Literal["rise", "unsure", "flat"]


@dataclass(frozen=True)
class ServerCap:
    """The server's own limit on sequences decoded at once, when it is known."""

    slots: int
    source: str  # "llama.cpp /props total_slots", "SGLang max_running_requests", …


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


def throughput_span(tier: Tier) -> tuple[float, float]:
    """A tier's slowest and fastest round in items/s (its aggregate alone without rounds)."""
    values = [r.items_per_s for r in tier.rounds] or [tier.stats.items_per_s]
    return min(values), max(values)


def within_noise(tier: Tier, best: Tier, gain_min: float) -> bool:
    """``tier``'s throughput cannot be told from ``best``'s: their ranges overlap, or it is
    less than ``gain_min`` below."""
    if throughput_span(tier)[1] >= throughput_span(best)[0]:
        return True
    return tier.stats.items_per_s >= best.stats.items_per_s * (1 - gain_min)


def setting_tier(history: Sequence[Tier], gain_min: float) -> Tier | None:
    """The calibrated batch size (SPEC §5.3 "the setting is the best kept tier"): of the kept
    tiers, the smallest B whose throughput is within noise of the fastest kept tier's."""
    kept = sorted((t for t in history if t.passed), key=lambda t: t.batch_size)
    if not kept:
        return None
    best = max(kept, key=lambda t: t.stats.items_per_s)
    return next(t for t in kept if within_noise(t, best, gain_min))


def _rate(tier: Tier) -> str:
    return f"{tier.stats.items_per_s:.3g} items/s"


def _full(tier: Tier) -> str:
    """Why a kept tier above the setting is worse besides its speed (its memory, its latency)."""
    s = tier.stats
    if tier.verdict == "stop: vram" and s.pressure is not None:
        if s.peak_kv_usage is not None and s.peak_kv_usage >= s.pressure:
            return f", and its KV cache was full ({s.peak_kv_usage:.0%})"
        return f", and its VRAM pressure reached {s.pressure:.0%}"
    if tier.verdict == "stop: latency":
        return ", and each item cost more there (stop: latency)"
    return ""


def _not_kept(tier: Tier) -> str:
    s = tier.stats
    if tier.verdict == "stop: preempt" and s.preemptions:
        return f"the server preempted {s.preemptions} requests there ({s.preemption_metric})"
    if tier.verdict == "stop: cap":
        return "above the server's own cap"
    if tier.verdict == "stop: slo":
        return "over an SLO"
    return f"it failed ({s.kinds_text})" if s.errors else tier.verdict


def setting_reason(history: Sequence[Tier], gain_min: float) -> str:
    """Which tier the setting is and why, in one line, e.g. ``batch 4: 15.9 items/s; batch 8
    kept but 12 % slower, and its KV cache was full``. Empty when no tier was kept."""
    chosen = setting_tier(history, gain_min)
    if chosen is None:
        return ""
    kept = [t for t in history if t.passed]
    best = max(kept, key=lambda t: t.stats.items_per_s)
    parts = [f"batch {chosen.batch_size}: {_rate(chosen)}"]
    if best is chosen and len(kept) > 1:
        parts[0] += ", the fastest kept tier"
    for tier in history:
        if tier.batch_size <= chosen.batch_size:
            continue
        where = f"batch {tier.batch_size}"
        if not tier.passed:
            parts.append(f"{where} not kept: {_not_kept(tier)}")
            continue
        base = chosen.stats.items_per_s
        change = tier.stats.items_per_s / base - 1 if base > 0 else 0.0
        if change > 0:
            parts.append(
                f"{where} {change:.0%} faster ({_rate(tier)}) but within noise"
                f"{_full(tier)}: the smaller batch is the setting"
            )
        else:
            parts.append(f"{where} kept but {-change:.0%} slower{_full(tier)}")
    return "; ".join(parts).replace("%", " %")


def stopped_by(history: Sequence[Tier], batch_sizes: Sequence[int]) -> StopReason:
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


def continue_sweep(points: Sequence[Point]) -> bool:
    """The sweep stops at the first level with errors."""
    return not points or points[-1].errors == 0
