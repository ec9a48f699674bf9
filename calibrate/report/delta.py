"""One metric of one tier in two runs: its change, whether the rounds of both tell it apart,
and the words ``report A B`` says it with.

A round's p99 over four requests is its slowest request, not its p99: a percentile's difference
is tested only where every round on both sides had at least ``1 / (1 − q)`` values (a p99: 100
requests, a p90: 10, a p50: 2) — one value above the percentile, on average. Inter-token
latencies are gaps between tokens, ``output tokens − 1`` per request.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from calibrate.confidence import DEFAULT_LEVEL, Spread, percent
from calibrate.confidence import Difference as Test
from calibrate.io.tier_table.columns import Column as C

_PERCENTILE = re.compile(r"_p(\d{2})_s$")


def percentile_of(metric: str) -> float | None:
    """``0.99`` for ``latency_p99_s``; None for a metric that is not a percentile."""
    found = _PERCENTILE.search(metric)
    return int(found.group(1)) / 100 if found else None


def needed_for(quantile: float) -> int:
    """The values a round needs for its ``quantile`` to be more than its largest value."""
    return math.ceil(round(1 / (1 - quantile), 6))


def fewest_per_round(metric: str, rounds: Mapping[str, Sequence[float]]) -> int | None:
    """The fewest values any round of a tier took ``metric`` over (its requests; the gaps
    between tokens for inter-token latency); None when the rounds do not say."""
    items = rounds.get(C.ITEMS)
    if not items:
        return None
    fewest = int(min(items))
    if metric.startswith("itl_"):
        tokens = rounds.get(C.OUTPUT_TOKENS_MEAN)
        return int(fewest * max(min(tokens) - 1, 0)) if tokens else None
    return fewest


@dataclass(frozen=True)
class Samples:
    """A percentile's values a round in A and B (the fewest of any round), and the least a
    round needs for it."""

    metric: str
    a: int | None  # None: the rounds do not say
    b: int | None
    needed: int

    @property
    def enough(self) -> bool:
        return all(n is not None and n >= self.needed for n in (self.a, self.b))

    @property
    def unit(self) -> str:
        return "gaps" if self.metric.startswith("itl_") else "requests"

    @property
    def name(self) -> str:
        """``p99``."""
        return f"p{round(100 * (percentile_of(self.metric) or 0))}"

    @property
    def known(self) -> bool:
        return self.a is not None and self.b is not None

    def text(self) -> str:
        """``too few requests (1 a round in A, 1 in B; a p99 needs 100)``."""
        needs = f"a {self.name} needs {self.needed}"
        if not self.known:
            return f"{self.unit} a round not known ({needs})"
        return f"too few {self.unit} ({self.a} a round in A, {self.b} in B; {needs})"

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "needed": self.needed, "enough": self.enough}


def samples_of(
    metric: str, rounds_a: Mapping[str, Sequence[float]], rounds_b: Mapping[str, Sequence[float]]
) -> Samples | None:
    """For a percentile metric, its values a round on both sides; None for any other."""
    quantile = percentile_of(metric)
    if quantile is None:
        return None
    return Samples(
        metric,
        fewest_per_round(metric, rounds_a),
        fewest_per_round(metric, rounds_b),
        needed_for(quantile),
    )


def requests_range(per_tier: Mapping[float, Mapping[str, Sequence[float]]]) -> str | None:
    """``1–4``: the fewest and most requests a round over a run's tiers; None when unknown."""
    counts = [n for rounds in per_tier.values() for n in rounds.get(C.ITEMS, ())]
    if not counts:
        return None
    low, high = int(min(counts)), int(max(counts))
    return f"{low}" if low == high else f"{low}–{high}"


NOISE = 0.05  # a relative change smaller than this is neither better nor worse (not coloured)


@dataclass(frozen=True)
class Delta:
    """One metric of one tier in both runs; ``b - a`` and the relative change. With rounds
    (or repeats) on both sides, ``spread_a``/``spread_b`` are their spreads and ``test`` says
    whether B − A is significant; a percentile's ``samples`` say whether its rounds had enough
    requests to be tested at all."""

    a: float | None
    b: float | None
    higher_better: bool
    spread_a: Spread | None = None
    spread_b: Spread | None = None
    test: Test | None = None
    samples: Samples | None = None

    @property
    def too_few(self) -> bool:
        """A percentile whose rounds had too few requests to be one (or did not say)."""
        return self.samples is not None and not self.samples.enough

    @property
    def significant(self) -> bool | None:
        """True when Welch's interval of B − A excludes zero and the change is at least
        ``NOISE``; None with fewer than two rounds on a side, or too few requests a round for
        the percentile (nothing to test)."""
        if self.test is None or self.test.significant is None or self.too_few:
            return None
        return self.test.significant and not self.inside_noise

    @property
    def inside_noise(self) -> bool:
        """A change of under ``NOISE`` (5 %) of A: what two runs of one setting differ by."""
        return self.change is not None and abs(self.change) < NOISE

    @property
    def cv(self) -> float | None:
        """The larger coefficient of variation of A's and B's rounds."""
        found = [s.cv for s in (self.spread_a, self.spread_b) if s is not None and s.cv is not None]
        return max(found) if found else None

    @property
    def diff(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def change(self) -> float | None:
        return None if self.diff is None or not self.a else self.diff / abs(self.a)

    @property
    def better(self) -> bool | None:
        """True when B is better than A on this metric; None when equal, not comparable, or
        within ``NOISE`` of A — a 1 % change between two runs is the machine, not a result —
        or not significant over the rounds both runs measured, or not tested (fewer than two
        rounds on a side: no interval, so no direction is claimed, SPEC §13)."""
        if not self.diff or self.inside_noise or self.significant is not True:
            return None
        return (self.diff > 0) == self.higher_better

    def to_json(self) -> dict[str, Any]:
        test = self.test
        low, high = (None, None)
        if test is not None and self.spread_a is not None:
            low, high = test.relative(self.spread_a.mean)
        return {
            "a": self.a,
            "b": self.b,
            "delta": self.diff,
            "change": self.change,
            "better": self.better,
            "significant": self.significant,
            "ci_excludes_zero": test.significant if test else None,  # before the 5 % floor
            # Welch's interval of B − A over the rounds (the metric's unit), and relative to A
            "ci_low": test.ci_low if test else None,
            "ci_high": test.ci_high if test else None,
            "change_low": low,
            "change_high": high,
            "level": test.level if test else None,
            "cv": self.cv,
            "rounds_a": self.spread_a.to_json() if self.spread_a else None,
            "rounds_b": self.spread_b.to_json() if self.spread_b else None,
            # a percentile's values a round (the fewest) in A and B, and the least it needs
            "samples": self.samples.to_json() if self.samples else None,
        }


def delta_text(delta: Delta | None) -> str:
    """``+12%`` (relative), or the plain difference when A is zero; empty when not comparable.
    Tested over rounds (from 5 % up): ``+6%, not significant`` or ``+18%, significant at 95 %``;
    a percentile over too few requests a round: ``+27%, too few requests (1 a round in A, …)``."""
    if delta is None or delta.diff is None:
        return ""
    text = f"{delta.diff:+.4g}" if delta.change is None else f"{delta.change:+.0%}"
    said = delta.samples
    claimable = delta.diff and not delta.inside_noise
    if said is not None and delta.too_few and claimable and (said.known or delta.test):
        return f"{text}, {said.text()}"
    if delta.significant is None or not delta.diff or delta.inside_noise:
        return text  # a change under 5 % is never claimed: no need to say it is not significant
    if delta.significant:
        level = delta.test.level if delta.test else DEFAULT_LEVEL
        return f"{text}, significant at {percent(level)}"
    return f"{text}, not significant"
