"""SLOs and goodput, defined once (SPEC §5.13) for the ladder, the sweep and tune.

A request meets the SLOs when its own TTFT, TPOT and E2E are each within the bound set (an SLO
it cannot be judged on — TTFT of an answer that was not streamed — is missed, not assumed met).
Goodput is the requests per second that met every SLO. A tier or level breaches an SLO when the
measure's p99 is over the bound (the ladder's ``stop: slo``); the SLO that *binds* a
recommendation is the one closest to (or furthest over) its bound.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from calibrate.config import SloConfig
from calibrate.errors import UsageError
from calibrate.stages.measure.latency import tpot_of

if TYPE_CHECKING:
    from calibrate.load.items import ItemResult
    from calibrate.stages.measure.tiers import Stats

SloName = Literal["ttft", "tpot", "e2e"]
LABELS: dict[SloName, str] = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E latency"}


def bounds_of(slo: SloConfig) -> dict[SloName, float]:
    """The SLOs that are set, by name."""
    values: dict[SloName, float | None] = {
        "ttft": slo.ttft_p99_s,
        "tpot": slo.tpot_p99_s,
        "e2e": slo.e2e_p99_s,
    }
    return {name: float(v) for name, v in values.items() if v is not None}


def has_slo(slo: SloConfig) -> bool:
    return bool(bounds_of(slo))


def describe(slo: SloConfig) -> str:
    """``ttft p99 ≤ 0.5 s, e2e p99 ≤ 20 s`` (or ``no SLOs``)."""
    parts = [f"{name} p99 ≤ {bound:g} s" for name, bound in bounds_of(slo).items()]
    return ", ".join(parts) or "no SLOs"


def parse_slo_flags(texts: Iterable[str], base: SloConfig) -> SloConfig:
    """``--slo ttft:0.5 tpot:0.05 e2e:20`` over ``[slo]`` (a flag replaces that one bound)."""
    values = {"ttft": base.ttft_p99_s, "tpot": base.tpot_p99_s, "e2e": base.e2e_p99_s}
    for text in texts:
        for part in text.replace(",", " ").split():
            name, _, number = part.partition(":")
            try:
                bound = float(number)
            except ValueError:
                bound = math.nan
            if name not in values or not math.isfinite(bound) or bound <= 0:
                raise UsageError(
                    f"--slo {part!r} is not NAME:SECONDS with NAME ttft, tpot or e2e and a "
                    "positive number of seconds; e.g. --slo ttft:0.5 tpot:0.05 e2e:20"
                )
            values[name] = bound
    return SloConfig(values["ttft"], values["tpot"], values["e2e"])


def misses(
    slo: SloConfig, *, e2e_s: float | None, ttft_s: float | None, tokens: int | None
) -> tuple[SloName, ...]:
    """The SLOs one answered request missed (empty: it counts as goodput)."""
    measured: dict[SloName, float | None] = {
        "ttft": ttft_s,
        "tpot": tpot_of(e2e_s, ttft_s, tokens) if e2e_s is not None else None,
        "e2e": e2e_s,
    }
    if tokens is not None and tokens <= 1 and ttft_s is not None:
        measured["tpot"] = 0.0  # one token: no time per token to miss
    out: list[SloName] = []
    for name, bound in bounds_of(slo).items():
        value = measured[name]
        if value is None or value > bound:
            out.append(name)
    return tuple(out)


def item_met(slo: SloConfig, item: ItemResult) -> bool:
    """A successful request within every SLO."""
    if not item.ok:
        return False
    return not misses(slo, e2e_s=item.elapsed_s, ttft_s=item.ttft_s, tokens=item.completion_tokens)


@dataclass(frozen=True)
class Goodput:
    """Requests that met every SLO, over ``window_s``."""

    met: int
    window_s: float

    @property
    def per_s(self) -> float:
        return self.met / self.window_s if self.window_s > 0 else 0.0


def goodput(slo: SloConfig, items: Sequence[ItemResult], window_s: float) -> Goodput:
    """The goodput of ``items`` (those finished in the measured window) over ``window_s``."""
    return Goodput(sum(1 for i in items if item_met(slo, i)), window_s)


def with_goodput(
    stats: Stats, slo: SloConfig, items: Sequence[ItemResult], window_s: float
) -> Stats:
    """``stats`` with the goodput of ``items`` over ``window_s`` (unchanged without SLOs)."""
    if not has_slo(slo):
        return stats
    good = goodput(slo, items, window_s)
    return replace(stats, goodput_per_s=good.per_s, slo_met=good.met)


def p99_of(stats: Stats, name: SloName) -> float | None:
    values = {"ttft": stats.ttft_p99_s, "tpot": stats.tpot_p99_s, "e2e": stats.latency_p99_s}
    return values[name]


def p99_breaches(stats: Stats, slo: SloConfig) -> list[str]:
    """One text per SLO whose p99 this tier exceeded — or could not show it met: a tier with
    answers but no TTFT/TPOT (not streamed: the server refused streaming or answered plain
    JSON) misses those SLOs, as each of its requests does in ``misses`` (never assumed met)."""
    out: list[str] = []
    answered = stats.items > stats.errors
    for name, bound in bounds_of(slo).items():
        value = p99_of(stats, name)
        if value is None and answered:
            out.append(f"{LABELS[name]} p99 not measured (answers not streamed): SLO not met")
        elif value is not None and value > bound:
            out.append(f"{LABELS[name]} p99 {value:.3g} s is over the SLO {bound:.3g} s")
    return out


def binding_slo(stats: Stats, slo: SloConfig) -> str | None:
    """The SLO nearest its bound at this level (``ttft p99 0.5 s``), or None without SLOs."""
    ratios = [
        (value / bound, name, bound)
        for name, bound in bounds_of(slo).items()
        if (value := p99_of(stats, name)) is not None
    ]
    if not ratios:
        named = next(iter(bounds_of(slo).items()), None)
        return f"{named[0]} p99 {named[1]:g} s" if named else None
    _, name, bound = max(ratios)
    return f"{name} p99 {bound:g} s"
