"""The ladder's setting among its kept tiers (SPEC §5.3, §5.14), as pure functions of the tiers.

**The setting is the best kept tier, not the last.** Of the tiers that passed or were kept
(``pass``, ``stop: vram``, ``stop: latency``), in order of B, the best is found as the sweep
finds its best level (``verdict.knee``): each tier against the best so far, a gain when it adds
``gain_min`` and its rounds put it above. The setting is the smallest B over which the best adds
less than ``gain_min`` — every percentage on one base, the setting's.

**Sure only when the rounds back it**: each smaller tier beaten by the best, the best adding
nothing that counts over the setting, no larger tier adding anything that counts. A pair the
rounds leave unsure is repeated by the ladder (rounds of the two interleaved, up to its round
bound) and, still unsure, makes the setting inconclusive: exit 1, no gate opened, unless
``--conservative`` takes the smaller batch. A tier during which calibrate itself was the
bottleneck measured the client, not the server: it is never the setting, and when it leaves the
best unknown (it is above the best the client could measure) the setting is inconclusive too;
what leaves the setting unknown, and why, is ``doubt.py``'s (``setting_doubt``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from calibrate.confidence import DEFAULT_LEVEL
from calibrate.stages.ladder.slower import slower_text
from calibrate.stages.measure.stop_rules import reached
from calibrate.stages.measure.tier import Tier
from calibrate.stages.verdict.doubt import pct
from calibrate.stages.verdict.knee import Point, interval, judge, spread_of, within_noise
from calibrate.stages.verdict.separation import judged_range


def tier_point(tier: Tier) -> Point:
    """A kept tier as the knee rule sees it: its throughput, and each round's."""
    rounds = tuple(r.items_per_s for r in tier.rounds)
    span = judged_range(rounds)
    return Point(
        tier.batch_size,
        tier.stats.items_per_s,
        0,
        span[0] if span else None,
        span[1] if span else None,
        rounds,
    )


def measured(history: Sequence[Tier]) -> list[Tier]:
    """The kept tiers the ladder stands on (``reached``), whose throughput the server set (not
    calibrate's own limit) and that it is known to have run whole (``unconfirmed``), by B."""
    kept = sorted((t for t in reached(history) if t.passed), key=lambda t: t.batch_size)
    return [t for t in kept if not t.client_bound and not unconfirmed(t, history)]


def unconfirmed(tier: Tier, history: Sequence[Tier]) -> bool:
    """The server is not known to have run ``tier``'s B at once: its own running count could
    not show it (``Tier.unseen``) and no tier of the run showed B running either — a server seen
    running 8 at once ran a wave of 4 whole. Never a setting above what was seen running. A
    count read through every answer of the tier that never showed B (``Unseen.read_through``)
    is the tier's own witness: B did not run at once there, whatever another tier ran."""
    if tier.unseen is None:
        return False
    seen = max((t.stats.server_running_max or 0 for t in history), default=0)
    return tier.unseen.read_through or tier.batch_size > seen


@dataclass(frozen=True)
class Choice:
    """The setting among the measured kept tiers: the chosen tier, the fastest, the pairs the
    rounds could not tell apart (base, cur), and the conservative answer."""

    chosen: Tier
    fastest: Tier
    doubts: tuple[tuple[Tier, Tier], ...]
    conservative: Tier


def choose(history: Sequence[Tier], gain_min: float, level: float = DEFAULT_LEVEL) -> Choice | None:
    """The smallest measured kept B over which the fastest adds less than ``gain_min`` (one
    base: its own), and what its rounds leave unsure (see the module's doc)."""
    tiers = measured(history)
    if not tiers:
        return None
    points = {t.batch_size: tier_point(t) for t in tiers}
    spread = spread_of(list(points.values()))
    fastest = max(tiers, key=lambda t: t.stats.items_per_s)
    chosen = next(
        t for t in tiers if within_noise(points[fastest.batch_size], points[t.batch_size], gain_min)
    )
    doubts: list[tuple[Tier, Tier]] = []
    for tier in tiers:
        if tier.batch_size < chosen.batch_size:  # must be beaten by the fastest
            said = judge(
                points[tier.batch_size], points[fastest.batch_size], gain_min, level, spread
            )
            if said == "unsure":
                doubts.append((tier, fastest))
        elif tier is not chosen:  # must add less than gain_min over the setting
            said = judge(
                points[chosen.batch_size], points[tier.batch_size], gain_min, level, spread
            )
            if said == "unsure":
                doubts.append((chosen, tier))
    below = [base for base, cur in doubts if cur is fastest and base.batch_size < chosen.batch_size]
    conservative = min([chosen, *below], key=lambda t: t.batch_size)
    return Choice(chosen, fastest, tuple(doubts), conservative)


def setting_tier(
    history: Sequence[Tier],
    gain_min: float,
    level: float = DEFAULT_LEVEL,
    *,
    conservative: bool = False,
) -> Tier | None:
    """The calibrated batch size (``conservative``: the smallest the rounds cannot tell from the
    fastest, when they leave the setting in doubt)."""
    found = choose(history, gain_min, level)
    if found is None:
        return None
    return found.conservative if conservative else found.chosen


def _rate(tier: Tier) -> str:
    rounds = len(tier.rounds)
    return f"{tier.stats.items_per_s:.3g} items/s over {rounds} round{'s' if rounds != 1 else ''}"


def _full(tier: Tier) -> str:
    """Why a kept tier above the setting is worse besides its speed (its memory, its latency)."""
    s = tier.stats
    if tier.verdict == "stop: vram" and s.pressure is not None:
        if s.peak_kv_usage is not None and s.peak_kv_usage >= s.pressure:
            return f", and its KV cache was full ({s.peak_kv_usage * 100:.0f} %)"
        return f", and its VRAM pressure reached {s.pressure * 100:.0f} %"
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
        return "over an SLO" + (", calibrate itself the limit there" if tier.client_bound else "")
    return f"it failed ({s.kinds_text})" if s.errors else tier.verdict


def setting_reason(
    history: Sequence[Tier],
    gain_min: float,
    level: float = DEFAULT_LEVEL,
    *,
    conservative: bool = False,
) -> str:
    """Which tier the setting is and why, in one line, every percentage over the setting's own
    throughput and the rounds behind each figure, e.g. ``batch 4: 15.9 items/s over 2 rounds;
    batch 8 kept but 12 % slower, and its KV cache was full``. Empty when no tier was kept."""
    found = choose(history, gain_min, level)
    if found is None:
        return ""
    chosen = found.conservative if conservative else found.chosen
    parts = [f"batch {chosen.batch_size}: {_rate(chosen)}"]
    if found.fastest is chosen and len(measured(history)) > 1:
        parts[0] += ", the fastest kept tier"
    unsure = {t.batch_size for pair in found.doubts for t in pair}
    base = chosen.stats.items_per_s
    spread = spread_of([tier_point(t) for t in measured(history)])
    stood = reached(history)
    for tier in history:
        if tier.batch_size <= chosen.batch_size:
            continue
        where = f"batch {tier.batch_size}"
        if tier not in stood:  # run before a round again stopped a smaller batch
            stop = f"batch {stood[-1].batch_size} below it did not hold when run again"
            parts.append(f"{where} not judged: {stop} ({stood[-1].verdict})")
            continue
        if not tier.passed:
            parts.append(f"{where} not kept: {_not_kept(tier)}")
            continue
        if tier.client_bound:
            parts.append(f"{where} not judged: calibrate itself was the limit there")
            continue
        if unconfirmed(tier, history):
            parts.append(f"{where} not judged: the server may not have run it whole")
            continue
        change = tier.stats.items_per_s / base - 1 if base > 0 else 0.0
        if change <= 0:
            gain = interval(tier_point(chosen), tier_point(tier), level, spread)
            parts.append(f"{where} kept but {slower_text(change, gain)}{_full(tier)}")
        elif tier.batch_size in unsure:
            parts.append(
                f"{where} {pct(change).lstrip('+')} faster ({_rate(tier)}): whether that is the "
                f"{gain_min * 100:.0f} % a larger batch must add cannot be told from noise"
            )
        else:
            parts.append(
                f"{where} {pct(change).lstrip('+')} faster ({_rate(tier)}), under the "
                f"{gain_min * 100:.0f} % a larger batch must add{_full(tier)}: the smaller batch "
                "is the setting"
            )
    return "; ".join(parts)
