"""A tier's cells as text: the table's columns per kind (the HTML report's too)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from calibrate.io.tier_table import kinds_text

Cells = list[tuple[str, Callable[[Mapping[str, Any]], str]]]  # (header, row → text)


def figure(value: Any, fmt: str) -> str:
    """A number in ``fmt``; ``—`` when there is none."""
    return "—" if value is None or value == "" else format(float(value), fmt)


def _pressure(row: Mapping[str, Any]) -> str:
    if row.get("pressure") is None:
        return "not measured"
    return f"{float(row['pressure']):.0%} {row.get('pressure_source') or ''}".strip()


def pressure_short(row: Mapping[str, Any]) -> str:
    """The default table's pressure: the figure alone (its source is said once, above)."""
    return "—" if row.get("pressure") is None else f"{float(row['pressure']):.0%}"


def _match(row: Mapping[str, Any]) -> str:
    if row.get("baseline_match") is None or not row.get("baseline_items"):
        return "—"
    return f"{int(row['baseline_match'])}/{int(row['baseline_items'])}"


def _in_tokens(row: Mapping[str, Any]) -> str:
    """``3000→3006`` (target → what the server counted), or the count alone when not sized."""
    actual = figure(row.get("input_tokens_mean"), ".0f")
    if row.get("input_tokens_target") in (None, ""):
        return actual
    return f"{figure(row.get('input_tokens_target'), '.0f')}→{actual}"


_TOKEN_CELLS: Cells = [
    ("in tok", _in_tokens),
    ("out tok", lambda r: figure(r.get("output_tokens_mean"), ".0f")),
]


def range_text(row: Mapping[str, Any]) -> str:
    """A level's lowest–highest throughput over its runs (a single run has no range)."""
    low, high = row.get("items_per_s_min"), row.get("items_per_s_max")
    if low is None or high is None:
        return "—"
    if row.get("repeats") == 1:
        return "one run"
    return f"{float(low):.2f}–{float(high):.2f}"


def gain_text(row: Mapping[str, Any]) -> str:
    """``+85%``; in parentheses when it did not count (below gain_min, or within noise)."""
    if row.get("gain") is None:
        return "—"
    text = f"{float(row['gain']):+.0%}"
    return (
        f"({text})"
        if row.get("gain_counted") is not None and not is_true(row["gain_counted"])
        else text
    )


LADDER: Cells = [
    ("batch", lambda r: str(int(r["batch_size"]))),
    ("conc", lambda r: str(int(r["concurrency"]))),
    ("rounds", lambda r: str(int(r["rounds"]))),
    ("waves", lambda r: figure(r.get("waves"), ".0f")),
    ("items", lambda r: str(int(r["items"]))),
    *_TOKEN_CELLS,
    ("s/item", lambda r: figure(r.get("per_item_s"), ".4f")),
    ("p50 s", lambda r: figure(r.get("latency_p50_s"), ".3f")),
    ("p90 s", lambda r: figure(r.get("latency_p90_s"), ".3f")),
    ("p99 s", lambda r: figure(r.get("latency_p99_s"), ".3f")),
    ("max s", lambda r: figure(r.get("latency_max_s"), ".3f")),
    ("ttft p50", lambda r: figure(r.get("ttft_p50_s"), ".3f")),
    ("ttft p99", lambda r: figure(r.get("ttft_p99_s"), ".3f")),
    ("tpot p99", lambda r: figure(r.get("tpot_p99_s"), ".4f")),
    ("itl p99", lambda r: figure(r.get("itl_p99_s"), ".4f")),
    ("items/s", lambda r: figure(r.get("items_per_s"), ".2f")),
    ("tok/s", lambda r: figure(r.get("output_tokens_per_s"), ".0f")),
    ("goodput", lambda r: figure(r.get("goodput_per_s"), ".2f")),
    ("J/tok", lambda r: figure(r.get("joules_per_output_token"), ".3g")),
    ("peak MiB", lambda r: figure(r.get("peak_vram_mib"), ".0f")),
    ("pressure", _pressure),
    ("queue", lambda r: figure(r.get("server_queue_max"), ".0f")),
    ("errors", lambda r: f"{int(r['errors'])} {kinds_text(r.get('error_kinds'))}".strip()),
    ("match", _match),
    ("verdict", lambda r: str(r["verdict"])),
]
SWEEP: Cells = [
    ("conc", lambda r: str(int(r["concurrency"]))),
    ("batch", lambda r: str(int(r["batch_size"]))),
    ("runs", lambda r: figure(r.get("repeats"), ".0f")),
    ("items", lambda r: str(int(r["items"]))),
    ("total s", lambda r: figure(r.get("total_s"), ".2f")),
    *_TOKEN_CELLS,
    ("offered", lambda r: rate_text(r.get("offered_rate"), r)),
    ("achieved", lambda r: figure(r.get("achieved_rate"), ".2f")),
    ("items/s", lambda r: figure(r.get("items_per_s"), ".2f")),
    ("range", range_text),
    ("gain", gain_text),
    ("tok/s", lambda r: figure(r.get("output_tokens_per_s"), ".0f")),
    ("goodput", lambda r: figure(r.get("goodput_per_s"), ".2f")),
    ("J/tok", lambda r: figure(r.get("joules_per_output_token"), ".3g")),
    ("p50 s", lambda r: figure(r.get("latency_p50_s"), ".3f")),
    ("p90 s", lambda r: figure(r.get("latency_p90_s"), ".3f")),
    ("p99 s", lambda r: figure(r.get("latency_p99_s"), ".3f")),
    ("ttft p50", lambda r: figure(r.get("ttft_p50_s"), ".3f")),
    ("ttft p99", lambda r: figure(r.get("ttft_p99_s"), ".3f")),
    ("tpot p50", lambda r: figure(r.get("tpot_p50_s"), ".4f")),
    ("tpot p99", lambda r: figure(r.get("tpot_p99_s"), ".4f")),
    ("itl p99", lambda r: figure(r.get("itl_p99_s"), ".4f")),
    ("lag p99", lambda r: figure(r.get("send_lag_p99_s"), ".3f")),
    ("peak MiB", lambda r: figure(r.get("peak_vram_mib"), ".0f")),
    ("queue", lambda r: figure(r.get("server_queue_max"), ".0f")),
    ("errors", lambda r: f"{int(r['errors'])} {kinds_text(r.get('error_kinds'))}".strip()),
    ("verdict", lambda r: level_verdict(r)),
]


def level_verdict(row: Mapping[str, Any]) -> str:
    """A sweep level's verdict, with ``saturated`` and ``(over server cap)`` when they apply."""
    return (
        str(row["verdict"])
        + (" saturated" if is_true(row.get("saturated")) else "")
        + (" (over server cap)" if is_true(row.get("capped_by_server")) else "")
    )


def rate_text(value: Any, row: Mapping[str, Any]) -> str:
    """An offered rate; ``inf`` for a rate level sent all at once; an auto sweep's closed-loop
    ends are ``sync`` and ``max``."""
    load = row.get("load")
    if load in ("synchronous", "maximum"):
        return "sync" if load == "synchronous" else "max"
    if value is None or value == "":
        return "inf" if row.get("achieved_rate") not in (None, "") else "—"
    return figure(value, "g")


def is_true(value: Any) -> bool:
    """True, or ``true`` as tiers.csv spells it."""
    return value is True or str(value).lower() == "true"


def context_axis(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Rows of ``ladder --axis context``: keyed by input length, not batch size."""
    return any(r.get("axis") == "context" for r in rows)
