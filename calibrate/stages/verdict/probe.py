"""Whether a probed level meets its SLOs, on the statistic its row shows (SPEC §13, §5.14).

**The probe rule** (``sweep --find-max``, over concurrency or offered rates): a probe runs the
sweep's ``repeats`` times; it passes when no request failed and, for each SLO set, the **median
over its runs of the run's p99** is within the bound — one noisy run of three neither passes nor
fails a level. A p99 that could not be measured (answers not streamed, for TTFT/TPOT) is a miss,
as everywhere (``measure.slo``). The probe's row shows that same median (``judged_row``), so a
verdict never says "meets the SLOs" under a row that reads over them.

**How sure**: a probe whose runs fall on both sides of a bound (``straddles``) is repeated, up to
the sweep's ``max_repeats``; at the boundary of the search (the last passing and the first
failing probe) one that still straddles leaves the boundary inconclusive (``verdict.doubt``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from calibrate.config import SloConfig
from calibrate.stages.measure.slo import SloName, bounds_of, p99_of
from calibrate.stages.measure.tiers import Stats

PROBE_RULE = (
    "a probe passes when none of its requests failed and the median over its runs of each "
    "run's p99 meets every SLO (the p99 its row shows)"
)
P99_COLUMNS: dict[SloName, tuple[str, ...]] = {
    "ttft": ("ttft_p99_s",),
    "tpot": ("tpot_p99_s",),
    "e2e": ("latency_p99_s", "e2e_p99_s"),
}


@dataclass(frozen=True)
class Probe:
    """One probed level as the search sees it: passed, and each SLO's median p99 over its runs
    (None: not measured)."""

    level: float  # a concurrency (an int), or an offered rate in req/s
    passed: bool
    p99_s: tuple[tuple[SloName, float | None], ...] = ()
    runs: int = 1
    errors: int = 0
    why: str = ""  # why it failed, in words ("" when it passed)
    missed: bool = False  # an SLO was missed (a rate probe may fail only by saturating)
    over_runs: int = 0  # runs whose own p99 broke an SLO (or could not show it met)
    # a rate failed on this alone: its shortfall's interval across the 5 % line (rates.judge_rate)
    unsure: str = ""

    def p99(self, name: SloName) -> float | None:
        return dict(self.p99_s).get(name)

    @property
    def straddles(self) -> bool:
        """Some runs met every SLO and some did not: the median could tip either way."""
        return not self.errors and 0 < self.over_runs < self.runs

    @property
    def split(self) -> str:
        """``1 of 3 runs over an SLO``."""
        return f"{self.over_runs} of {self.runs} runs over an SLO"


def judge_probe(level: float, runs: Sequence[Stats], slo: SloConfig) -> Probe:
    """A level's runs under the probe rule (see the module's doc)."""
    errors = sum(r.errors for r in runs)
    medians: list[tuple[SloName, float | None]] = []
    over: list[str] = []
    bounds = bounds_of(slo)
    for name, bound in bounds.items():
        values = [_measured(r, name) for r in runs]
        median = statistics.median(values) if values else math.inf
        medians.append((name, median if math.isfinite(median) else None))
        if not math.isfinite(median):
            over.append(f"{name} p99 not measured (answers not streamed)")
        elif median > bound:
            over.append(f"{name} p99 {median:.3g} s is over the SLO {bound:g} s")
    if errors:
        total = sum(r.items for r in runs)
        why = f"{errors} of {total} requests failed ({_kinds(runs)})"
    else:
        why = "; ".join(over)
    if why and len(runs) > 1 and not errors:
        why += f" (median of {len(runs)} runs)"
    over_runs = sum(
        1 for r in runs if any(_measured(r, name) > bound for name, bound in bounds.items())
    )
    return Probe(level, not why, tuple(medians), len(runs), errors, why, bool(over), over_runs)


def judged_row(stats: Stats, probe: Probe) -> Stats:
    """A probed level's stats with each SLO's p99 the one the probe rule judged (the median of
    its runs' p99s), so its row and its verdict say the same number."""
    changes = {
        column: value
        for name, value in probe.p99_s
        if value is not None
        for column in P99_COLUMNS[name]
    }
    return replace(stats, **changes)  # type: ignore[arg-type]


def _measured(run: Stats, name: SloName) -> float:
    """The run's p99 of ``name``; infinite when it has answers but no such measure (a miss),
    or no answers at all."""
    value = p99_of(run, name)
    return math.inf if value is None else value


def _kinds(runs: Sequence[Stats]) -> str:
    return ", ".join(k for k in (r.kinds_text for r in runs) if k) or "errors"
