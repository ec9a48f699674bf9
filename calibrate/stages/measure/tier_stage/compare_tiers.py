"""``--compare``: a ladder or sweep against a committed tier table, for CI (issue 7 §2); and
``--save-baseline``, which commits this run's table as the next one (``save_table_baseline``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibrate.errors import InputError
from calibrate.io.atomic import copy_atomic
from calibrate.io.tier_table import read_table as read_tier_table
from calibrate.io.tier_table.cells import cell, key_value, row_key
from calibrate.io.tier_table.columns import Column as C
from calibrate.io.tier_table.columns import Kind
from calibrate.io.tier_table.row import TierRow
from calibrate.stages.measure.tier import kept
from calibrate.stages.measure.tier_run import MeasureSpec

TableKind = Kind
# (row key, metric compared, True when a bigger metric is better)
_SHAPE: dict[str, tuple[C, C, bool]] = {
    "ladder": (C.BATCH_SIZE, C.PER_ITEM_S, False),
    "sweep": (C.CONCURRENCY, C.ITEMS_PER_S, True),
}
# A ladder table written before per_item_s existed is compared on mean request latency.
_FALLBACK = {C.PER_ITEM_S: C.LATENCY_MEAN_S}


@dataclass(frozen=True)
class Cell:
    baseline: str
    now: str
    bad: bool = False


@dataclass(frozen=True)
class CompareRow:
    key: float  # the level's: batch size, concurrency, offered rate, auto step
    verdict: Cell
    metric: Cell
    change: str


@dataclass(frozen=True)
class TierComparison:
    kind: TableKind
    baseline_path: str
    tolerance: float
    rows: tuple[CompareRow, ...]
    last_passing: Cell
    problems: tuple[str, ...]
    metric: C | None = (
        None  # the column compared (the kind's own, or its fallback for an old table)
    )
    key: C | None = None  # the column rows were matched by (None: the kind's own)
    not_compared: str = ""  # why the tables could not be compared at all ("" when they were)

    @property
    def passed(self) -> bool:
        """No regression found, and the tables were compared (a gate that could not look
        never passes)."""
        return not self.problems and not self.not_compared

    @property
    def key_name(self) -> str:
        return (self.key or _SHAPE[self.kind][0]).value

    @property
    def metric_name(self) -> str:
        return (self.metric or _SHAPE[self.kind][1]).value

    def to_json(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline_path,
            "tolerance": self.tolerance,
            "passed": self.passed,
            "problems": list(self.problems),
            **({"not_compared": self.not_compared} if self.not_compared else {}),
        }


def read_table(path: Path, kind: TableKind) -> tuple[TierRow, ...]:
    """The rows of a tiers.csv (the one reader, ``tier_table``); a missing column is exit 2."""
    if not path.exists():
        raise InputError(
            f"--compare {path}: no such file",
            f"Write one with: calibrate {kind} --save-baseline",
        )
    key, metric, _ = _SHAPE[kind]
    table = read_tier_table(path)
    if not table.has(metric) and table.has(_FALLBACK.get(metric, metric)):
        metric = _FALLBACK[metric]
    for column in (key, metric, C.VERDICT):
        if not table.has(column):
            raise InputError(f"{path} has no column {column.value!r}: is it a {kind} tiers.csv?")
    return table.rows


def metric_for(kind: TableKind, baseline: Sequence[TierRow], now: Sequence[TierRow]) -> C:
    """The kind's metric; for a baseline written before it existed, the old one both share."""
    metric = _SHAPE[kind][1]
    fallback = _FALLBACK.get(metric)
    if fallback and not _has(baseline, metric) and _has(baseline, fallback) and _has(now, fallback):
        return fallback
    return metric


def _has(rows: Sequence[TierRow], column: C) -> bool:
    return any(_num(r, column) is not None for r in rows)


def _num(row: TierRow | None, column: C) -> float | None:
    value = cell(row, column) if row is not None else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _top(passed: Mapping[float, bool]) -> float | None:
    keys = [k for k, ok in passed.items() if ok]
    return max(keys) if keys else None


def compare_tables(
    kind: TableKind,
    baseline: Sequence[TierRow],
    now: Sequence[TierRow],
    *,
    tolerance: float = 0.2,
    baseline_path: str = "",
) -> TierComparison:
    """Fails when the top passing tier dropped, a tier that passed now fails, or the metric
    got worse by more than ``tolerance`` (latency up, or throughput down)."""
    if tolerance < 0:
        raise InputError(f"--tolerance must be ≥ 0, got {tolerance}")
    _, _, higher_better = _SHAPE[kind]
    metric = metric_for(kind, baseline, now)
    # levels matched as ``report A B`` matches them: a rate sweep's by offered rate (its rows
    # share a few in-flight counts), an auto sweep's by step; two load modes never
    key, now_key = row_key(kind, baseline), row_key(kind, now)
    if key != now_key:
        differ = (
            f"the baseline's levels are keyed by {key.value} and this {kind}'s by "
            f"{now_key.value} — compare {kind}s of one load mode (rates with "
            "rates, concurrency with concurrency, --auto with --auto)"
        )
        none = Cell("—", "—")
        return TierComparison(kind, baseline_path, tolerance, (), none, (), metric, key, differ)
    base = {v: r for r in baseline if (v := key_value(r, key)) is not None}
    cur = {v: r for r in now if (v := key_value(r, key)) is not None}
    # each row's verdict judged once (``tier.kept``), for its cells and the top passing tier
    base_ok = {k: kept(r.verdict or "") for k, r in base.items()}
    cur_ok = {k: kept(r.verdict or "") for k, r in cur.items()}
    problems: list[str] = []
    rows: list[CompareRow] = []
    for k in sorted(set(base) | set(cur)):
        b, n = base.get(k), cur.get(k)
        bv, nv = (b.verdict if b else None) or "", (n.verdict if n else None) or ""
        verdict_bad = base_ok.get(k, False) and n is not None and not cur_ok.get(k, False)
        if verdict_bad:
            problems.append(f"{key} {k:g} passed in the baseline and now fails ({nv})")
        bm, nm = _num(b, metric), _num(n, metric)
        change, metric_bad = "", False
        if bm and nm is not None and cur_ok.get(k, False):
            ratio = nm / bm - 1
            change = f"{ratio:+.0%}"
            metric_bad = (-ratio if higher_better else ratio) > tolerance
            if metric_bad:
                worse = "lower" if higher_better else "higher"
                problems.append(
                    f"{key} {k:g}: {metric} {nm:.4g} is {abs(ratio):.0%} {worse} than "
                    f"the baseline's {bm:.4g} (tolerance {tolerance:.0%})"
                )
        rows.append(
            CompareRow(
                k,
                Cell(bv or "—", nv or "not run", verdict_bad),
                Cell(_fmt(bm), _fmt(nm), metric_bad),
                change,
            )
        )
    top_b, top_n = _top(base_ok), _top(cur_ok)
    top_bad = top_b is not None and (top_n is None or top_n < top_b)
    last = Cell(
        f"{top_b:g}" if top_b is not None else "none",
        f"{top_n:g}" if top_n is not None else "none",
        top_bad,
    )
    if top_bad:
        problems.insert(
            0, f"last passing {key} is {last.now}, lower than the baseline's {last.baseline}"
        )
    return TierComparison(
        kind, baseline_path, tolerance, tuple(rows), last, tuple(problems), metric, key
    )


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def save_baseline(table: Path, dest: Path) -> Path | None:
    """Copy a run's tiers.csv to ``dest``; an existing one is kept as ``<stem>.<ts>.csv``."""
    if not table.exists():
        raise InputError(f"{table} does not exist: nothing to save as a baseline")
    kept: Path | None = None
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        kept = dest.with_name(f"{dest.stem}.{stamp}{dest.suffix}")
        copy_atomic(dest, kept)
    copy_atomic(table, dest)
    return kept


def compare_run(
    spec: MeasureSpec, kind: TableKind, rows: Sequence[TierRow]
) -> TierComparison | None:
    """``--compare``: this run's rows against the committed table (None without the flag, or
    with no row to compare)."""
    if spec.compare is None or spec.baseline is None or not rows:
        return None
    return compare_tables(
        kind,
        spec.baseline,
        rows,
        tolerance=spec.tolerance,
        baseline_path=str(spec.compare),
    )


def save_table_baseline(
    spec: MeasureSpec, baselines_dir: Path, kind: TableKind, table: Path | None
) -> tuple[Path, Path | None] | None:
    """``--save-baseline``: (where the table went, where the previous one was kept)."""
    if not spec.save_baseline or table is None:
        return None
    dest = baselines_dir / f"{kind}.csv"
    return dest, save_baseline(table, dest)
