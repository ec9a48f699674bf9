"""A tier failed by calibrate's own request limit, ``[target] timeout_s``: what to raise and to
what (pure, no I/O).

On a slow server (a CPU build, a big model offloaded) one answer takes seconds to a minute, and
a wave of B waits in the server's queue behind its slots: the wave's last answer comes after
about B / b × the answer time of the tier b before it. A request cut at ``timeout_s`` is the
client's limit, not a server error, and the user must be told which setting to raise and to what.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from calibrate.numbers import seconds_text
from calibrate.stages.measure.tier import Tier

HEADROOM = 2.0  # the advised limit: twice the slowest wave measured or estimated


def timeout_advice(tiers: Sequence[Tier], timeout_s: float) -> str | None:
    """``what to do: …`` for a ladder stopped by a tier whose requests hit ``timeout_s``; None
    when the tier that stopped it had no timeout."""
    if not tiers:
        return None
    stopped = tiers[-1]
    timeouts = stopped.stats.error_kinds.get("timeout", 0)
    if stopped.verdict != "fail" or not timeouts:
        return None
    where = f"batch {stopped.batch_size}"
    said = (
        f"{timeouts} request(s) of {where} were cut at calibrate's own limit, [target] "
        f"timeout_s = {timeout_s:g} s, not by an error of the server"
    )
    needed = _wave_s(tiers)
    if needed is None:
        return (
            f"what to do: {said}; raise timeout_s in calibrate.toml above the time one wave of "
            f"{stopped.batch_size} takes on this server, then run calibrate ladder again"
        )
    advised = _round_up(max(needed * HEADROOM, timeout_s * HEADROOM))
    if needed <= timeout_s:  # the tier before cannot explain it: the server slowed more than that
        return (
            f"what to do: {said}: a wave of {stopped.batch_size} took longer than that here, "
            f"though {_basis(tiers)} puts it at about {seconds_text(needed)} s (the server slowed "
            f"more than its slots explain); set timeout_s = {advised:g} in calibrate.toml's "
            "[target], then run calibrate ladder again"
        )
    return (
        f"what to do: {said}: a wave of {stopped.batch_size} needs about {seconds_text(needed)} s "
        f"here ({_basis(tiers)}); set timeout_s = {advised:g} in calibrate.toml's [target], then "
        "run calibrate ladder again"
    )


def _before(tiers: Sequence[Tier]) -> Tier | None:
    """The kept tier just below the one that stopped the ladder, with an answer time."""
    for tier in reversed(tiers[:-1]):
        if tier.passed and tier.stats.latency_max_s:
            return tier
    return None


def _wave_s(tiers: Sequence[Tier]) -> float | None:
    """How long the stopped tier's wave takes: the tier before's slowest answer × B / its b (a
    server that runs b at once answers B in B / b turns); None with no kept tier before it."""
    stopped, before = tiers[-1], _before(tiers)
    if before is None or not before.stats.latency_max_s:
        return None
    return before.stats.latency_max_s * stopped.batch_size / before.batch_size


def _basis(tiers: Sequence[Tier]) -> str:
    stopped, before = tiers[-1], _before(tiers)
    assert before is not None and before.stats.latency_max_s
    turns = stopped.batch_size / before.batch_size
    return (
        f"{turns:g} × batch {before.batch_size}'s slowest answer, "
        f"{seconds_text(before.stats.latency_max_s)} s, if the server runs {before.batch_size} at "
        "a time"
    )


def _round_up(seconds: float) -> float:
    """Up to a number a user writes, 2 significant digits: 28 → 28, 137 → 140, 1234 → 1300."""
    if seconds <= 0:
        return seconds
    step = 10 ** max(0, math.floor(math.log10(seconds)) - 1)
    return float(math.ceil(seconds / step) * step)
