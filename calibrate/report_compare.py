"""``calibrate report RUN_A RUN_B``: two runs of one kind side by side, with deltas per tier.

Rows are matched the way ``--compare`` matches a baseline: by batch size for ladders, by
concurrency (or offered rate) for sweeps. Every numeric column both runs have gets a delta in
``--json``; the tables show the headline metrics each run has.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from calibrate.errors import InputError
from calibrate.numbers import finite
from calibrate.run_differences import Difference, differences
from calibrate.run_view import RunView
from calibrate.tier_table import level_key

# (column, True when bigger is better); the first of each group a run has is shown.
_HEADLINE: tuple[tuple[tuple[str, ...], bool], ...] = (
    (("items_per_s",), True),
    (("achieved_rate",), True),
    (("goodput",), True),
    (("output_tokens_per_s",), True),
    (("per_item_s", "per_item_mean_s"), False),
    (("latency_p50_s", "e2e_p50_s", "per_item_p50_s"), False),
    (("latency_p99_s", "e2e_p99_s", "per_item_p99_s"), False),
    (("ttft_p50_s",), False),
    (("ttft_p99_s",), False),
    (("tpot_p99_s",), False),
    (("itl_p99_s",), False),
    (("peak_vram_mib",), False),
    (("pressure",), False),
    (("errors",), False),
)
_HIGHER_BETTER = {
    "items_per_s",
    "achieved_rate",
    "goodput",
    "output_tokens_per_s",
    "gain",
    "items_per_s_min",
    "items_per_s_max",
    "baseline_match",
}
NOISE = 0.05  # a relative change smaller than this is neither better nor worse (not coloured)
_NOT_METRICS = {
    "batch_size",
    "concurrency",
    "offered_rate",
    "auto_step",
    "rounds",
    "round",
    "repeats",
}


@dataclass(frozen=True)
class Delta:
    """One metric of one tier in both runs; ``b - a`` and the relative change."""

    a: float | None
    b: float | None
    higher_better: bool

    @property
    def diff(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def change(self) -> float | None:
        return None if self.diff is None or not self.a else self.diff / abs(self.a)

    @property
    def better(self) -> bool | None:
        """True when B is better than A on this metric; None when equal, not comparable, or
        within ``NOISE`` of A — a 1 % change between two runs is the machine, not a result."""
        if not self.diff or (self.change is not None and abs(self.change) < NOISE):
            return None
        return (self.diff > 0) == self.higher_better

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "delta": self.diff,
            "change": self.change,
            "better": self.better,
        }


@dataclass(frozen=True)
class PairRow:
    key: float
    a: Mapping[str, Any] | None
    b: Mapping[str, Any] | None
    deltas: dict[str, Delta] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": "inf" if math.isinf(self.key) else self.key,  # JSON has no infinity
            "a": self.a,
            "b": self.b,
            "deltas": {k: d.to_json() for k, d in self.deltas.items()},
        }


@dataclass(frozen=True)
class RunComparison:
    a: RunView
    b: RunView
    metrics: tuple[str, ...]  # the headline columns, in display order
    rows: tuple[PairRow, ...]
    differences: tuple[Difference, ...] = ()

    @property
    def warning(self) -> str | None:
        """The one line said above the table when A and B are not like for like."""
        if not self.differences:
            return None
        return (
            "A and B did not measure the same thing — "
            + "; ".join(d.text() for d in self.differences)
            + ": the deltas are not the effect of one change"
        )

    @property
    def kind(self) -> str:
        return self.a.kind

    @property
    def key(self) -> str:
        return self.a.key

    def to_json(self) -> dict[str, Any]:
        def side(view: RunView) -> dict[str, Any]:
            return {
                "run": str(view.path),
                "run_id": view.run_id,
                "passed": view.verdict.passed,
                "stopped_by": view.verdict.stopped_by,
                "last_passing": view.verdict.last_passing,
            }

        return {
            "kind": self.kind,
            "key": self.key,
            "a": side(self.a),
            "b": side(self.b),
            "metrics": list(self.metrics),
            "rows": [r.to_json() for r in self.rows],
            "differences": [d.to_json() for d in self.differences],
            "warning": self.warning,
        }


def _headline(a: RunView, b: RunView) -> tuple[str, ...]:
    have = {k for v in (a, b) for row in v.rows for k, x in row.items() if finite(x) is not None}
    out: list[str] = []
    for names, _ in _HEADLINE:
        found = next((n for n in names if n in have), None)
        if found:
            out.append(found)
    return tuple(out)


def _deltas(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, key: str) -> dict[str, Delta]:
    if a is None or b is None:
        return {}
    out: dict[str, Delta] = {}
    for name in a:
        if name == key or name in _NOT_METRICS or name not in b:
            continue
        x, y = finite(a[name]), finite(b[name])
        if x is not None or y is not None:
            out[name] = Delta(x, y, name in _HIGHER_BETTER)
    return out


def compare_runs(a: RunView, b: RunView) -> RunComparison:
    """Match the tiers of two runs; runs of different kinds (or sweep modes) are exit 2."""
    if a.kind != b.kind:
        raise InputError(
            f"{a.path.name} is a {a.kind} and {b.path.name} a {b.kind}: report compares two "
            "runs of one kind",
            f"Give two ladder runs or two sweep runs, e.g. calibrate report {a.path} <another {a.kind} run>",
        )
    if a.key != b.key:
        raise InputError(
            f"{a.path.name} is keyed by {a.key} and {b.path.name} by {b.key}: their levels do "
            "not match",
            "Compare sweeps of one load mode: rates with rates, concurrency with concurrency, "
            "--auto with --auto.",
        )
    rows_a = {k: r for r in a.rows if (k := level_key(r, a.key)) is not None}
    rows_b = {k: r for r in b.rows if (k := level_key(r, b.key)) is not None}
    pairs = tuple(
        PairRow(k, rows_a.get(k), rows_b.get(k), _deltas(rows_a.get(k), rows_b.get(k), a.key))
        for k in sorted(set(rows_a) | set(rows_b))
    )
    return RunComparison(a, b, _headline(a, b), pairs, differences(a, b))


def delta_text(delta: Delta | None) -> str:
    """``+12%`` (relative), or the plain difference when A is zero; empty when not comparable."""
    if delta is None or delta.diff is None:
        return ""
    if delta.change is None:
        return f"{delta.diff:+.4g}"
    return f"{delta.change:+.0%}"


def value_text(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"
