"""How the ladder says a kept tier above its setting was slower: by how much, and whether its
rounds can tell that from noise (the interval of the change over the setting's rounds)."""

from __future__ import annotations

from calibrate.stages.verdict.doubt import pct
from calibrate.stages.verdict.separation import GainInterval


def slower_text(change: float, gain: GainInterval | None) -> str:
    """``6 % slower`` where the rounds put the whole interval below the setting; else the
    change with what the rounds allow: ``6 % slower by the medians, within the rounds' noise
    (−24 % to +17 %)``, or ``… slower (one round a side: no spread to tell it from noise)``."""
    said = f"{pct(-change).lstrip('+')} slower"
    if gain is None or not gain.ranged:
        return f"{said} (one round a side: no spread to tell it from noise)"
    if gain.high >= 0:
        return (
            f"{said} by the medians, within the rounds' noise "
            f"({pct(gain.low)} to {pct(gain.high)}, {gain.runs[0]} and {gain.runs[1]} rounds)"
        )
    return said
