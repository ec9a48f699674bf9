"""A setting's lead over the next best (tune's winner over its runner-up): the fraction, the
interval of the runs behind it, and whether it clears zero — or why it is no claim."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from calibrate.confidence import percent


@dataclass(frozen=True)
class Margin:
    """The winner's lead, the runs behind it, and whether their interval clears zero."""

    fraction: float  # the winner's goodput over the runner-up's − 1 (0.25 = 25 % more)
    level: float  # the confidence level of the interval
    significant: bool | None  # None: fewer than two runs on a side, no interval
    low: float | None = None  # the interval of the difference, as fractions of the runner-up's
    high: float | None = None
    runs: tuple[int, int] = (0, 0)  # (the winner's, the runner-up's) runs at their best levels
    unchecked: str = ""  # why a lead its runs call sure was not measured again in the other order

    def caveat(self) -> str:
        """What follows "+X% over the runner-up …" when the lead is not a claim ("" when it is)."""
        if self.significant:
            return ""
        if self.unchecked:
            return f" (not measured again in the other order: {self.unchecked}, so not a claim)"
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
            "unchecked": self.unchecked or None,
        }
