"""A run's tiers over their rounds (ladder) or repeats (sweep): each metric's mean, t-interval
and CV from ``rounds.jsonl``, the noisy ones called out, and the text and --json of both."""

from __future__ import annotations

import math
from typing import Any

from calibrate.confidence import DEFAULT_LEVEL, Spread, spread
from calibrate.io.tier_table import read_row_lines
from calibrate.io.tier_table.cells import key_value, numbers
from calibrate.io.tier_table.columns import Column as C
from calibrate.io.tier_table.row import TierRow
from calibrate.report.run_view import RunView

# the tier's key and its round counters: never a metric to compare or spread
NOT_METRICS = {
    C.BATCH_SIZE,
    C.CONCURRENCY,
    C.OFFERED_RATE,
    C.AUTO_STEP,
    C.ROUNDS,
    C.ROUND,
    C.REPEATS,
}


Spreads = dict[float, dict[str, Spread]]  # per tier key, per metric: its rounds' spread


def round_values(view: RunView) -> dict[float, dict[str, list[float]]]:
    """Per tier (by the run's key), every metric's value in each round (ladder) or repeat
    (sweep) of ``rounds.jsonl``; empty when the run has none. A round written twice (a resumed
    run) counts once, the later line."""
    path = view.path / "rounds.jsonl"
    try:
        lines = list(read_row_lines(path)) if path.is_file() else []
    except OSError:
        return {}
    rounds: dict[tuple[float, Any], TierRow] = {}
    for number, line in lines:
        key = key_value(line, view.key)
        if key is None:
            continue
        rounds[key, line.round if line.round is not None else f"line {number}"] = line
    out: dict[float, dict[str, list[float]]] = {}
    for (key, _), kept in rounds.items():
        metrics = out.setdefault(key, {})
        for name, x in numbers(kept).items():
            if name != view.key and name not in NOT_METRICS:
                metrics.setdefault(name, []).append(x)
    return out


def run_spreads(view: RunView, level: float = DEFAULT_LEVEL) -> Spreads:
    """Each tier's metrics over its rounds: mean, t-interval at ``level`` and CV."""
    return spreads_of(round_values(view), level)


def spreads_of(values: dict[float, dict[str, list[float]]], level: float) -> Spreads:
    """:func:`run_spreads` of values read already."""
    return {
        key: {name: found for name, values in metrics.items() if (found := spread(values, level))}
        for key, metrics in values.items()
    }


def tier_label(key: C, value: float) -> str:
    """``batch 8``, ``concurrency 4``, ``rate 2 req/s``, ``input 4096 tokens``, ``step 3``."""
    if key == C.OFFERED_RATE:
        return "rate inf" if math.isinf(value) else f"rate {value:g} req/s"
    if key == C.INPUT_TOKENS_TARGET:
        return f"input {value:g} tokens"
    name = {C.BATCH_SIZE: "batch", C.AUTO_STEP: "step"}.get(key, key.replace("_", " "))
    return f"{name} {value:g}"


# The metrics a noisy callout is about: a tier's throughput and its typical latency (a p99 over
# a round of a few requests always varies, and its delta says "too few" below 100 requests).
_CALLOUT = (
    (C.ITEMS_PER_S, C.ACHIEVED_RATE, C.GOODPUT_PER_S, C.OUTPUT_TOKENS_PER_S),
    (C.LATENCY_P50_S, C.E2E_P50_S, C.PER_ITEM_S),
)


def noisy_lines(view: RunView, spreads: Spreads, side: str = "") -> list[str]:
    """One line per callout metric whose rounds vary by more than 10 % (CV) at some tier:
    ``noisy: items_per_s CV 14 % at batch 8, 12 % at batch 16 in B — add rounds``."""
    more = "rounds ([ladder] rounds)" if view.kind == "ladder" else "repeats ([sweep] repeats)"
    have = {name for metrics in spreads.values() for name in metrics}
    out: list[str] = []
    for group in _CALLOUT:
        metric = next((m for m in group if m in have), None)
        if metric is None:
            continue
        found = [
            f"{s.cv:.0%}".replace("%", " %") + f" at {tier_label(view.key, key)}"
            for key in sorted(spreads)
            if (s := spreads[key].get(metric)) is not None and s.noisy and s.cv is not None
        ]
        if found:
            where = f" in {side}" if side else ""
            out.append(f"noisy: {metric} CV {', '.join(found)}{where} — add {more}")
    return out


def value_text(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def confidence_json(view: RunView, spreads: Spreads, level: float) -> dict[str, Any]:
    """``report RUN --json``: per tier, every metric's mean, t-interval and CV over its rounds."""
    return {
        "level": level,
        "tiers": [
            {
                "key": "inf" if math.isinf(key) else key,
                "metrics": {name: s.to_json() for name, s in sorted(spreads[key].items())},
            }
            for key in sorted(spreads)
        ],
    }


def spread_text(found: Spread | None) -> str:
    """``33.5 [30.1, 36.9] CV 4 %``; the mean alone for one round; ``—`` for none."""
    if found is None:
        return "—"
    if found.ci_low is None or found.ci_high is None:
        return f"{value_text(found.mean)} (one round)"
    cv = f" CV {found.cv:.0%}".replace("%", " %") if found.cv is not None else ""
    return f"{value_text(found.mean)} [{value_text(found.ci_low)}, {value_text(found.ci_high)}]{cv}"
