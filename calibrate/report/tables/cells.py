"""A tier's cells as text: the table's columns per kind (the HTML report's too)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from calibrate.io.tier_table.cells import kinds_text
from calibrate.io.tier_table.row import TierRow
from calibrate.numbers import rate_text as shown_rate

Cells = list[tuple[str, Callable[[TierRow], str]]]  # (header, row → text)


def figure(value: float | None, fmt: str) -> str:
    """A number in ``fmt``; ``—`` when there is none."""
    return "—" if value is None else format(float(value), fmt)


def rate(value: float | None, fmt: str) -> str:
    """A rate in ``fmt``, never rounded to zero when it is not (``numbers.rate_text``)."""
    return "—" if value is None else shown_rate(float(value), fmt)


def count(value: int | None) -> str:
    return "—" if value is None else str(value)


def _pressure(row: TierRow) -> str:
    memory = row.memory
    if memory.pressure is None:
        return "not measured"
    return f"{memory.pressure:.0%} {memory.pressure_source or ''}".strip()


def pressure_short(row: TierRow) -> str:
    """The default table's pressure: the figure alone (its source is said once, above)."""
    return figure(row.memory.pressure, ".0%")


def _match(row: TierRow) -> str:
    if row.baseline_match is None or not row.baseline_items:
        return "—"
    return f"{row.baseline_match}/{row.baseline_items}"


def _in_tokens(row: TierRow) -> str:
    """``3000→3006`` (target → what the server counted), or the count alone when not sized."""
    tokens = row.tokens
    actual = figure(tokens.input_tokens_mean, ".0f")
    if tokens.input_tokens_target is None:
        return actual
    return f"{figure(tokens.input_tokens_target, '.0f')}→{actual}"


def _errors(row: TierRow) -> str:
    return f"{count(row.errors)} {kinds_text(row.error_kinds)}".strip()


_TOKEN_CELLS: Cells = [
    ("in tok", _in_tokens),
    ("out tok", lambda r: figure(r.tokens.output_tokens_mean, ".0f")),
]


def range_text(row: TierRow) -> str:
    """A level's lowest–highest throughput over its runs (a single run has no range)."""
    low, high = row.sweep.items_per_s_min, row.sweep.items_per_s_max
    if low is None or high is None:
        return "—"
    if row.sweep.repeats == 1:
        return "one run"
    return f"{shown_rate(low, '.2f')}–{shown_rate(high, '.2f')}"


def gain_text(row: TierRow) -> str:
    """``+85%``; in parentheses when it did not count (below gain_min, or within noise)."""
    if row.sweep.gain is None:
        return "—"
    text = f"{row.sweep.gain:+.0%}"
    return f"({text})" if row.sweep.gain_counted is False else text


LADDER: Cells = [
    ("batch", lambda r: count(r.batch_size)),
    ("conc", lambda r: count(r.concurrency)),
    ("rounds", lambda r: count(r.ladder.rounds)),
    ("waves", lambda r: figure(r.waves, ".0f")),
    ("items", lambda r: count(r.items)),
    *_TOKEN_CELLS,
    ("s/item", lambda r: figure(r.per_item_s, ".4f")),
    ("p50 s", lambda r: figure(r.latency.p50_s, ".3f")),
    ("p90 s", lambda r: figure(r.latency.p90_s, ".3f")),
    ("p99 s", lambda r: figure(r.latency.p99_s, ".3f")),
    ("max s", lambda r: figure(r.latency.max_s, ".3f")),
    ("ttft p50", lambda r: figure(r.ttft.p50_s, ".3f")),
    ("ttft p99", lambda r: figure(r.ttft.p99_s, ".3f")),
    ("tpot p99", lambda r: figure(r.tpot.p99_s, ".4f")),
    ("itl p99", lambda r: figure(r.itl.p99_s, ".4f")),
    ("items/s", lambda r: rate(r.items_per_s, ".2f")),
    ("tok/s", lambda r: rate(r.output_tokens_per_s, ".0f")),
    ("goodput", lambda r: rate(r.goodput_per_s, ".2f")),
    ("J/tok", lambda r: figure(r.energy.joules_per_output_token, ".3g")),
    ("peak MiB", lambda r: figure(r.memory.peak_vram_mib, ".0f")),
    ("pressure", _pressure),
    ("queue", lambda r: figure(r.server.server_queue_max, ".0f")),
    ("errors", _errors),
    ("match", _match),
    ("verdict", lambda r: r.verdict or "—"),
]
SWEEP: Cells = [
    ("conc", lambda r: count(r.concurrency)),
    ("batch", lambda r: count(r.batch_size)),
    ("runs", lambda r: figure(r.sweep.repeats, ".0f")),
    ("items", lambda r: count(r.items)),
    ("total s", lambda r: figure(r.total_s, ".2f")),
    *_TOKEN_CELLS,
    ("offered", lambda r: rate_text(r)),
    ("achieved", lambda r: rate(r.rate.achieved_rate, ".2f")),
    ("items/s", lambda r: rate(r.items_per_s, ".2f")),
    ("range", range_text),
    ("gain", gain_text),
    ("tok/s", lambda r: rate(r.output_tokens_per_s, ".0f")),
    ("goodput", lambda r: rate(r.goodput_per_s, ".2f")),
    ("J/tok", lambda r: figure(r.energy.joules_per_output_token, ".3g")),
    ("p50 s", lambda r: figure(r.latency.p50_s, ".3f")),
    ("p90 s", lambda r: figure(r.latency.p90_s, ".3f")),
    ("p99 s", lambda r: figure(r.latency.p99_s, ".3f")),
    ("ttft p50", lambda r: figure(r.ttft.p50_s, ".3f")),
    ("ttft p99", lambda r: figure(r.ttft.p99_s, ".3f")),
    ("tpot p50", lambda r: figure(r.tpot.p50_s, ".4f")),
    ("tpot p99", lambda r: figure(r.tpot.p99_s, ".4f")),
    ("itl p99", lambda r: figure(r.itl.p99_s, ".4f")),
    ("lag p99", lambda r: figure(r.rate.send_lag_p99_s, ".3f")),
    ("peak MiB", lambda r: figure(r.memory.peak_vram_mib, ".0f")),
    ("queue", lambda r: figure(r.server.server_queue_max, ".0f")),
    ("errors", _errors),
    ("verdict", lambda r: level_verdict(r)),
]


def level_verdict(row: TierRow) -> str:
    """A sweep level's verdict, with ``saturated`` and ``(over server cap)`` when they apply."""
    return (
        (row.verdict or "—")
        + (" saturated" if row.rate.saturated else "")
        + (" (over server cap)" if row.sweep.capped_by_server else "")
    )


def rate_text(row: TierRow) -> str:
    """An offered rate; ``inf`` for a rate level sent all at once; an auto sweep's closed-loop
    ends are ``sync`` and ``max``."""
    load = row.auto.load
    if load in ("synchronous", "maximum"):
        return "sync" if load == "synchronous" else "max"
    if row.rate.offered_rate is None:
        return "inf" if row.rate.achieved_rate is not None else "—"
    return figure(row.rate.offered_rate, "g")


def context_axis(rows: Sequence[TierRow]) -> bool:
    """Rows of ``ladder --axis context``: keyed by input length, not batch size."""
    return any(r.context_axis for r in rows)
