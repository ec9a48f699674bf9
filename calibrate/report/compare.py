"""``calibrate report RUN_A RUN_B``: two runs of one kind side by side, with deltas per tier.

Rows are matched the way ``--compare`` matches a baseline: by batch size for ladders, by
concurrency (or offered rate) for sweeps. Every numeric column both runs have gets a delta in
``--json``; the tables show the headline metrics each run has.

A delta is claimed only when it is significant (SPEC §13): each tier's rounds (ladder) or
repeats (sweep) in ``rounds.jsonl`` are the samples, Welch's t-interval of B − A at
``[confidence] level`` must exclude zero (``calibrate.confidence``), and the change must be at
least ``delta.NOISE`` (5 %). Rounds of one run vary less than two runs do (the machine's load drifts
between them): a 2 % difference whose interval excludes zero is still the machine, not a result.
A metric whose rounds vary by more than 10 % (CV) is called out as noisy. A percentile is
tested only where each round had the values it needs (``calibrate.report.delta``: a p99 over
four requests is their slowest): else its change is shown "too few requests", never claimed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from calibrate.confidence import DEFAULT_LEVEL, Spread, compare
from calibrate.errors import InputError
from calibrate.io.tier_table.cells import numbers, row_json
from calibrate.io.tier_table.columns import Column as C
from calibrate.io.tier_table.row import TierRow
from calibrate.report.delta import Delta, requests_range, samples_of
from calibrate.report.run_differences import Difference, differences
from calibrate.report.run_view import RunView
from calibrate.report.spreads import NOT_METRICS, noisy_lines, round_values, spreads_of

# (column, True when bigger is better); the first of each group a run has is shown.
_HEADLINE: tuple[tuple[tuple[C, ...], bool], ...] = (
    ((C.ITEMS_PER_S,), True),
    ((C.ACHIEVED_RATE,), True),
    ((C.GOODPUT_PER_S,), True),
    ((C.OUTPUT_TOKENS_PER_S,), True),
    ((C.PER_ITEM_S,), False),
    ((C.LATENCY_P50_S, C.E2E_P50_S), False),
    ((C.LATENCY_P99_S, C.E2E_P99_S), False),
    ((C.TTFT_P50_S,), False),
    ((C.TTFT_P99_S,), False),
    ((C.TPOT_P99_S,), False),
    ((C.ITL_P99_S,), False),
    ((C.PEAK_VRAM_MIB,), False),
    ((C.PRESSURE,), False),
    ((C.ERRORS,), False),
)
_HIGHER_BETTER = {
    C.ITEMS_PER_S,
    C.ACHIEVED_RATE,
    C.GOODPUT_PER_S,
    C.GOODPUT_PER_S_MIN,
    C.GOODPUT_PER_S_MAX,
    C.SLO_MET,
    C.OUTPUT_TOKENS_PER_S,
    C.OUTPUT_TOKENS_PER_S_PER_REQUEST,
    C.GAIN,
    C.ITEMS_PER_S_MIN,
    C.ITEMS_PER_S_MAX,
    C.BASELINE_MATCH,
}


@dataclass(frozen=True)
class PairRow:
    key: float
    a: TierRow | None
    b: TierRow | None
    deltas: dict[str, Delta] = field(default_factory=dict)

    def to_json(self, columns: tuple[Sequence[str], Sequence[str]]) -> dict[str, Any]:
        """With each run's columns (its rows as its tiers.csv holds them)."""
        return {
            "key": "inf" if math.isinf(self.key) else self.key,  # JSON has no infinity
            "a": row_json(self.a, columns[0]) if self.a is not None else None,
            "b": row_json(self.b, columns[1]) if self.b is not None else None,
            "deltas": {k: d.to_json() for k, d in self.deltas.items()},
        }

    @property
    def side(self) -> TierRow:
        """A's row, B's where A has none."""
        found = self.a if self.a is not None else self.b
        assert found is not None  # a pair has a row on one side at least
        return found


@dataclass(frozen=True)
class RunComparison:
    a: RunView
    b: RunView
    metrics: tuple[str, ...]  # the headline columns, in display order
    rows: tuple[PairRow, ...]
    differences: tuple[Difference, ...] = ()
    level: float = DEFAULT_LEVEL
    noisy: tuple[str, ...] = ()  # "noisy: items_per_s CV 14 % at batch 8 in B — add rounds …"
    requests: tuple[str | None, str | None] = (None, None)  # "1–4": requests a round, A and B

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
    def key(self) -> C:
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
            "rows": [r.to_json((self.a.columns, self.b.columns)) for r in self.rows],
            "differences": [d.to_json() for d in self.differences],
            "warning": self.warning,
            "level": self.level,
            "noisy": list(self.noisy),
            "requests_per_round": {"a": self.requests[0], "b": self.requests[1]},
        }


def headline(*views: RunView) -> tuple[C, ...]:
    """The headline metrics the runs have values in, in display order."""
    have = {name for v in views for row in v.rows for name in numbers(row)}
    out: list[C] = []
    for names, _ in _HEADLINE:
        found = next((n for n in names if n in have), None)
        if found:
            out.append(found)
    return tuple(out)


Rounds = Mapping[str, Sequence[float]]  # a tier's metrics, each round's value


def _deltas(
    a: RunView,
    b: RunView,
    pair: tuple[TierRow | None, TierRow | None],
    spreads: tuple[Mapping[str, Spread], Mapping[str, Spread]] = ({}, {}),
    rounds: tuple[Rounds, Rounds] = ({}, {}),
) -> dict[str, Delta]:
    """Every metric both runs' tables have, where either row has a number in it."""
    if pair[0] is None or pair[1] is None:
        return {}
    x_of, y_of = numbers(pair[0]), numbers(pair[1])
    out: dict[str, Delta] = {}
    for name in a.columns:
        if name == a.key or name in NOT_METRICS or name not in b.columns:
            continue
        x, y = x_of.get(name), y_of.get(name)
        if x is not None or y is not None:
            sa, sb = spreads[0].get(name), spreads[1].get(name)
            test = compare(sa, sb) if sa is not None and sb is not None else None
            samples = samples_of(name, *rounds)
            out[name] = Delta(x, y, name in _HIGHER_BETTER, sa, sb, test, samples)
    return out


def compare_runs(a: RunView, b: RunView, level: float = DEFAULT_LEVEL) -> RunComparison:
    """Match the tiers of two runs; runs of different kinds (or sweep modes) are exit 2.
    Deltas are tested over each tier's rounds at ``level``."""
    if a.kind != b.kind:
        raise InputError(
            f"{a.path.name} is a {a.kind} and {b.path.name} a {b.kind}: report compares two "
            "runs of one kind",
            f"Give two ladder runs or two sweep runs, e.g. calibrate report {a.path} "
            f"<another {a.kind} run>",
        )
    if a.key != b.key:
        raise InputError(
            f"{a.path.name} is keyed by {a.key} and {b.path.name} by {b.key}: their levels do "
            "not match",
            "Compare sweeps of one load mode: rates with rates, concurrency with concurrency, "
            "--auto with --auto.",
        )
    rows_a = {k: r for r in a.rows if (k := a.key_of(r)) is not None}
    rows_b = {k: r for r in b.rows if (k := b.key_of(r)) is not None}
    values_a, values_b = round_values(a), round_values(b)
    spreads_a, spreads_b = spreads_of(values_a, level), spreads_of(values_b, level)
    pairs = tuple(
        PairRow(
            k,
            rows_a.get(k),
            rows_b.get(k),
            _deltas(
                a,
                b,
                (rows_a.get(k), rows_b.get(k)),
                (spreads_a.get(k, {}), spreads_b.get(k, {})),
                (values_a.get(k, {}), values_b.get(k, {})),
            ),
        )
        for k in sorted(set(rows_a) | set(rows_b))
    )
    noisy = noisy_lines(a, spreads_a, "A") + noisy_lines(b, spreads_b, "B")
    requests = (requests_range(values_a), requests_range(values_b))
    return RunComparison(
        a, b, headline(a, b), pairs, differences(a, b), level, tuple(noisy), requests
    )
