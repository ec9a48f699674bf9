"""``sweep --find-max`` (SPEC §13): the largest concurrency (or, with ``--rates``, the highest
offered rate) that meets every SLO, in few probes.

The search, pure (``next_probe(history, top) -> int | None``), as the ladder asks ``next_tier``:

- **Exponential probe**: 1, then ×8 each time (1, 8, 64, 512, then ``top``, 1024 unless the
  ladder capped it) until a probe breaks an SLO or errors. ×8 rather than ×2 because doubling
  alone takes 11 probes to reach 1024.
- **Bisection** between the last passing and the first failing level, at their geometric middle
  (the precision asked is relative), until the gap is at most 5 % of the last passing level or 1.

That is at most 10 probes for any boundary on [1, 1024] (``tests/test_sweep_find_max.py``
counts every one): 1, 8, 3, 5, 4 for a boundary at 4; 9 probes for one at 37. The same search
over offered rates (``--rates``) is ``stages.sweep.rates.next_rate``.

**The probe rule**: a probe runs the sweep's ``repeats`` times; it passes when no request
failed and, for each SLO set, the **median over its runs of the run's p99** is within the bound
(one noisy run of three neither passes nor fails a level). A p99 that could not be measured
(answers not streamed, for TTFT/TPOT) is a miss, as everywhere (``stages.slo``).

**The cliff**: between the last passing and the first failing level, the SLO the failing one
breaks most, its p99 at both and the jump; a *cliff* when the failing level is over twice the
bound (SPEC §13: "a step that breaks the SLO by more than 2×").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from calibrate.config import SloConfig
from calibrate.stages.measure.slo import SloName, bounds_of
from calibrate.stages.verdict.probe import PROBE_RULE, Probe, judge_probe

__all__ = ["PROBE_RULE", "Probe", "judge_probe"]

TOP = 1024  # the search's upper end (SPEC §13: [1, 1024])
FACTOR = 8  # the exponential probe's step
PRECISION = 0.05  # the bisection stops at a gap of 5 % of the last passing level (or 1)
CLIFF_OVER = 2.0  # a failing level over twice its SLO is a cliff
Over = Literal["concurrency", "rates"]  # what the search steps: requests in flight, or req/s


def bracket(history: Sequence[Probe]) -> tuple[float | None, float | None]:
    """(last passing, first failing): the lowest failing level, and the highest passing one
    below it (a noisy pass above a failure does not move the boundary up)."""
    failing = [p.level for p in history if not p.passed]
    first_failing = min(failing, default=None)
    passing = [
        p.level for p in history if p.passed and (first_failing is None or p.level < first_failing)
    ]
    return max(passing, default=None), first_failing


def next_probe(history: Sequence[Probe], top: int = TOP) -> int | None:
    """The next concurrency to probe, or None when the boundary is found (see the module's doc)."""
    if not history:
        return 1
    passing, failing = bracket(history)
    if failing is None:
        assert passing is not None
        return None if passing >= top else int(min(passing * FACTOR, top))
    low, first_failing = int(passing or 0), int(failing)
    if close_enough(low, first_failing):
        return None
    middle = round(math.sqrt(low * first_failing)) if low else first_failing // 2
    return min(max(middle, low + 1), first_failing - 1)


def close_enough(last_passing: float, first_failing: float) -> bool:
    gap = first_failing - last_passing
    return gap <= 1 or (last_passing > 0 and gap <= PRECISION * last_passing)


@dataclass(frozen=True)
class Cliff:
    """How the SLO the first failing level breaks most jumped from the last passing level."""

    slo: SloName
    bound_s: float
    from_s: float | None  # its median p99 at the last passing level
    to_s: float | None  # at the first failing level (None: not measured)

    @property
    def jump(self) -> float | None:
        if self.from_s is None or self.to_s is None or self.from_s <= 0:
            return None
        return self.to_s / self.from_s

    @property
    def over(self) -> float | None:
        """The failing level's p99 over the bound (2.1 = 2.1× the SLO)."""
        return None if self.to_s is None else self.to_s / self.bound_s

    @property
    def steep(self) -> bool:
        return self.over is None or self.over > CLIFF_OVER

    def text(self, last_passing: str, first_failing: str) -> str:
        """``median ttft p99 0.032 → 0.21 s from 4 to 5 (×6.6), 2.1× the SLO: a cliff``."""
        if self.to_s is None:
            return f"{self.slo} p99 not measured at {first_failing}"
        start = f"{self.from_s:.3g}" if self.from_s is not None else "—"
        jump = f" (×{self.jump:.2g})" if self.jump is not None else ""
        kind = "a cliff" if self.steep else "a gradual rise, not a cliff"
        return (
            f"median {self.slo} p99 {start} → {self.to_s:.3g} s from {last_passing} to "
            f"{first_failing}{jump}, {self.over or 0.0:.2g}× the SLO: {kind}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "slo": self.slo,
            "bound_s": self.bound_s,
            "last_passing_p99_s": _round(self.from_s),
            "first_failing_p99_s": _round(self.to_s),
            "jump": _round(self.jump),
            "over_slo": _round(self.over),
            "steep": self.steep,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


@dataclass(frozen=True)
class FindMax:
    """The search's result: the boundary, how it was found, how it broke. Levels are
    concurrencies (ints), or with ``over == "rates"`` offered rates in req/s from ``bottom``."""

    last_passing: float | None
    first_failing: float | None
    order: tuple[float, ...]  # the levels in the order they were probed
    top: float
    cliff: Cliff | None = None
    failed_why: str = ""  # why the first failing level failed
    over: Over = "concurrency"
    bottom: float = 1
    start: str = ""  # rates: where the bottom came from ("the synchronous rate", "--rates 1:64")
    unsure: tuple[Probe, ...] = ()  # boundary probes the runs could not settle (see find_max)
    surely_below: float | None = (
        None  # the highest probe below the boundary none of whose runs missed
    )

    @property
    def probes(self) -> int:
        return len(self.order)

    @property
    def gap(self) -> float | None:
        """The boundary's precision: the gap over the last passing level (None: not bracketed)."""
        if self.last_passing is None or self.first_failing is None:
            return None
        return (self.first_failing - self.last_passing) / self.last_passing

    def named(self, level: float) -> str:
        """``concurrency 4`` or ``14.1 req/s``."""
        return f"{level:g} req/s" if self.over == "rates" else f"concurrency {level:g}"

    @property
    def text(self) -> str:
        """After the last passing level: how the search ended, in words."""
        lp, ff, n = self.last_passing, self.first_failing, self.probes
        unit = " req/s" if self.over == "rates" else ""
        if not n:
            return "no rate was probed: the synchronous level, which sets where the search starts, failed"
        probes = f"{n} probe{'s' if n != 1 else ''} ({', '.join(f'{x:g}' for x in self.order)})"
        if ff is None:
            kept = " without saturating" if self.over == "rates" else ""
            return f"every probe met the SLOs{kept} up to {self.top:g}{unit}, the top of the search; {probes}"
        broke = self.failed_why
        if self.cliff and lp is not None:
            broke = self.cliff.text(f"{lp:g}", f"{ff:g}{unit}")
        verb = "broke them" if self.cliff else "failed"
        if lp is None:
            lower = f" (the bottom of the search, {self.start})" if self.over == "rates" else ""
            return f"{self.named(ff)} already {verb}{lower}: {broke}; {probes}"
        return f"{self.named(ff)} {verb}: {broke}; {probes}"

    def to_json(self) -> dict[str, Any]:
        rates = {"boundary_rate": self.last_passing, "start": self.start or None}
        return {
            "last_passing": self.last_passing,
            "first_failing": self.first_failing,
            "probes": self.probes,
            "cliff": self.cliff.to_json() if self.cliff else None,
            "order": list(self.order),
            "top": self.top,
            "gap": _round(self.gap),
            "first_failing_why": self.failed_why or None,
            "rule": PROBE_RULE,
            "over": self.over,
            "bottom": self.bottom,
            "unsure": [p.level for p in self.unsure],
            **(rates if self.over == "rates" else {}),
        }


def find_max(
    history: Sequence[Probe],
    slo: SloConfig,
    top: float = TOP,
    *,
    over: Over = "concurrency",
    bottom: float = 1,
    start: str = "",
) -> FindMax:
    """The result of the probes so far (an interrupted search: the bracket it reached)."""
    last_passing, first_failing = bracket(history)
    by_level = {p.level: p for p in history}
    failed = by_level.get(first_failing) if first_failing is not None else None
    passed = by_level.get(last_passing) if last_passing is not None else None
    cliff = None
    if failed is not None and not failed.errors:
        cliff = _cliff(passed, failed, slo)
    # the boundary's probes the runs could not settle: runs on both sides of an SLO, or a rate
    # that failed only for being unsure it kept up, unless a rate that surely failed lies within
    # twice the search's precision above the last passing one (the bracket its runs back)
    surely = [p.level for p in history if not p.passed and not p.unsure]
    above = [x for x in surely if last_passing is None or x > last_passing]
    settled = bool(above) and (
        last_passing is not None and min(above) <= last_passing * (1 + 2 * PRECISION)
    )
    unsure = tuple(
        p for p in (passed, failed) if p is not None and (p.straddles or (p.unsure and not settled))
    )
    clean = [
        p.level
        for p in history
        if p.passed and not p.over_runs and (first_failing is None or p.level < first_failing)
    ]
    return FindMax(
        last_passing,
        first_failing,
        tuple(p.level for p in history),
        top,
        cliff,
        failed.why if failed else "",
        over,
        bottom,
        start,
        unsure,
        max(clean, default=None),
    )


def _cliff(passed: Probe | None, failed: Probe, slo: SloConfig) -> Cliff | None:
    """The SLO ``failed`` breaks most (a measure it lacks counts as the worst); None when it
    met them all (a rate that failed only by saturating)."""
    bounds = bounds_of(slo)

    def badness(name: SloName) -> float:
        value = failed.p99(name)
        return math.inf if value is None else value / bounds[name]

    name = max(bounds, key=badness, default=None)
    if name is None or badness(name) <= 1:
        return None
    return Cliff(name, bounds[name], passed.p99(name) if passed else None, failed.p99(name))
