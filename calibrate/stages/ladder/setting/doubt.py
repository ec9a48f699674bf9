"""Why the ladder cannot name its setting (SPEC §5.3, §5.14): the rounds could not tell the
tiers around it apart (noise), calibrate itself was the limit above the best it could measure (a
starved client), or no kept tier is known to have run whole. Pure functions of the tiers, over
the setting's own rule (``setting.choose``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from calibrate.confidence import DEFAULT_LEVEL
from calibrate.gpu.noise import combined
from calibrate.stages.ladder.setting import Choice, choose, measured, tier_point, unconfirmed
from calibrate.stages.measure.stop_rules import reached
from calibrate.stages.measure.tier import Tier
from calibrate.stages.verdict.doubt import Doubt, Inconclusive
from calibrate.stages.verdict.knee import interval, spread_of

UNSEEN_REMEDY = (
    "sample the server's running count more often ([ladder] sample_interval_s), send longer "
    "answers (--output-tokens), or add a smaller tier to [ladder] batch_sizes"
)


@dataclass(frozen=True)
class SettingDoubt:
    """Why the ladder cannot name its setting: noise between tiers, or a starved client."""

    noise: Inconclusive | None  # tiers the rounds could not tell apart
    starved: str  # "" or why calibrate itself was the limit above the best it could measure
    takeable: bool = True  # a measured tier is there for --conservative to take
    remedy: str = ""  # what to do, where it is neither the noise's nor the starved client's

    @property
    def text(self) -> str:
        if self.noise is None:
            return self.starved
        also = self.starved.removeprefix("inconclusive: ")
        return f"{self.noise.text}; and {also}" if also else self.noise.text


def setting_doubt(
    history: Sequence[Tier], gain_min: float, level: float = DEFAULT_LEVEL
) -> SettingDoubt | None:
    """What leaves the setting unknown (None: the rounds back it)."""
    found = choose(history, gain_min, level)
    kept = sorted((t for t in reached(history) if t.passed), key=lambda t: t.batch_size)
    starved = [t for t in kept if t.client_bound]
    if found is None and starved:  # every kept tier measured the client: nothing to take
        return SettingDoubt(
            None,
            f"inconclusive: the client was the limit from batch {starved[0].batch_size} on — no "
            f"kept tier measured the server, so its own throughput is unknown "
            f"({starved[0].client_bound})",
            takeable=False,
        )
    unseen = [t for t in kept if t.unseen is not None and unconfirmed(t, history)]
    if found is None and unseen:  # every kept tier may not have run whole: no setting is known
        top = unseen[-1]
        return SettingDoubt(
            None,
            f"inconclusive: no kept tier is known to have run whole — the server was never seen "
            f"running batch {top.batch_size} at once ({top.unseen.why if top.unseen else ''})",
            takeable=False,
            remedy=UNSEEN_REMEDY,
        )
    if found is None:
        return None
    why = _starved_above(history, starved, found.fastest)
    noise = _noise_doubt(history, found, gain_min, level)
    # both kinds of doubt are kept: the noise's conservative answer is the smaller tier, and a
    # starved tier above never lifts the setting past what the rounds could tell apart
    return SettingDoubt(noise, why) if noise is not None or why else None


def _starved_above(history: Sequence[Tier], starved: Sequence[Tier], fastest: Tier) -> str:
    """Why what a batch above the fastest measured tier gives is unknown: a kept tier there was
    client-bound, or the tier over an SLO was timed by a starved client ("" when neither)."""
    top = next((t for t in starved if t.batch_size > fastest.batch_size), None)
    if top is not None:
        return (
            f"inconclusive: the client was the limit at batch {top.batch_size} — the fastest tier "
            f"it could measure is batch {fastest.batch_size}, so what a larger batch gives "
            f"is unknown ({top.client_bound})"
        )
    over = next((t for t in history if t.verdict == "stop: slo" and t.client_bound), None)
    if over is not None and over.batch_size > fastest.batch_size:
        # a boundary is only as good as its side above: the p99s it broke were timed by a
        # starved client (find-max's rule, sweep/result/client_limit.py, for the ladder's SLO stop)
        return (
            f"inconclusive: the client was the limit at batch {over.batch_size}, the tier over "
            f"an SLO — whether the server or calibrate missed it is unknown, so what a larger "
            f"batch gives is unknown ({over.client_bound})"
        )
    return ""


def _noise_doubt(
    history: Sequence[Tier], found: Choice, gain_min: float, level: float
) -> Inconclusive | None:
    """The tiers the rounds could not tell apart around the setting (None: none)."""
    if not found.doubts:
        return None
    spread = spread_of([tier_point(t) for t in measured(history)])
    doubts = []
    for base, cur in found.doubts:
        gain = interval(tier_point(base), tier_point(cur), level, spread)
        if gain is not None:
            doubts.append(
                Doubt(f"batch {base.batch_size}", f"batch {cur.batch_size}", gain, gain_min)
            )
    return Inconclusive(
        tuple(doubts),
        combined(t.stats.noise for t in history),
        "the ladder",
        f"batch {found.conservative.batch_size}",
        "[ladder] rounds, [ladder] min_round_s",
    )
