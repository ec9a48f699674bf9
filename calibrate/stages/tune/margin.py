"""Whether the tune winner's lead over the runner-up is more than noise (SPEC §13).

The margin is the winner's goodput over the runner-up's (each at its best level). It is claimed
as significant only when the runs of those two levels say so: Welch's t-interval of the winner's
mean goodput per run minus the runner-up's, at ``[confidence] level``, lies wholly on the
margin's side of zero (``stages.measure.confidence.compare``). With fewer than two runs on
either side there is no interval and nothing is claimed either way; the pick stays the ranking's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from calibrate.confidence import DEFAULT_LEVEL, compare, percent, spread
from calibrate.stages.tune.result import BestLevel


@dataclass(frozen=True)
class Margin:
    """The winner's lead, the runs behind it, and whether their interval clears zero."""

    fraction: float  # the winner's goodput over the runner-up's − 1 (0.25 = 25 % more)
    level: float  # the confidence level of the interval
    significant: bool | None  # None: fewer than two runs on a side, no interval
    low: float | None = None  # the interval of the difference, as fractions of the runner-up's
    high: float | None = None
    runs: tuple[int, int] = (0, 0)  # (the winner's, the runner-up's) runs at their best levels

    def caveat(self) -> str:
        """What follows "+X% over the runner-up …" when the lead is not a claim ("" when it is)."""
        if self.significant:
            return ""
        if self.significant is False:
            return (
                f", not significant at {percent(self.level)} (the intervals overlap): "
                "about equal, measure longer to tell"
            )
        if min(self.runs) == 0:  # a result read back from a line written before runs were kept
            return " (no interval: an earlier calibrate kept no runs for one of them)"
        if max(self.runs) <= 1:
            return " (one run each: no interval; set [sweep] repeats = 3 to tell)"
        return " (fewer than two runs on a side: no interval)"

    def to_json(self) -> dict[str, Any]:
        interval = None
        if self.low is not None and self.high is not None:
            interval = [round(self.low, 4), round(self.high, 4)]
        return {
            "margin": round(self.fraction, 4),
            "significant": self.significant,
            "margin_interval": interval,
            "confidence": self.level,
        }


def margin_of(
    winner: BestLevel, runner_up: BestLevel, level: float = DEFAULT_LEVEL
) -> Margin | None:
    """The winner's margin over the runner-up and its test; None when the runner-up had no
    goodput (no ratio to give)."""
    if runner_up.goodput_per_s <= 0:
        return None
    fraction = winner.goodput_per_s / runner_up.goodput_per_s - 1
    runs = (len(winner.runs_per_s), len(runner_up.runs_per_s))
    a, b = spread(runner_up.runs_per_s, level), spread(winner.runs_per_s, level)
    if a is None or b is None:
        return Margin(fraction, level, None, runs=runs)
    diff = compare(a, b)
    if diff.ci_low is None or diff.ci_high is None:
        return Margin(fraction, level, None, runs=runs)
    low, high = diff.relative(a.mean)
    clear = diff.ci_low > 0 if fraction >= 0 else diff.ci_high < 0
    return Margin(fraction, level, clear, low, high, runs)
