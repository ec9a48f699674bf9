"""What the setting was calibrated at, at the concurrency a production batch runs (SPEC §13).

``batch`` compares each window of its run with one measurement: the newest passing **sweep**
level at the setting's batch size and the batch's concurrency (a closed loop of C, as the batch
sends), else the newest passing **ladder** tier of that many in flight (waves of C). Its
throughput comes with its own interval (the range of its repeats or rounds), its latency, error
count, token counts, the server's preemptions, KV usage and running count, and the machine's
noise while it ran.

Where it is read: the ledger's level or tier, whose ``measured`` block (``measured_of``, written
by sweep and ladder since the drift watch) holds all of it; an older line without that block is
completed from its run folder's ``tiers.csv``. A setting whose engine flags a tune chose is
compared only with measurements made after that tune (earlier ones ran other flags).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from calibrate.errors import CalibrateError
from calibrate.io.store import read_object, run_path
from calibrate.io.tier_table import read_table
from calibrate.io.tier_table.cells import cell, row_json
from calibrate.io.tier_table.columns import Column
from calibrate.state.ledger import Ledger, LedgerEntry, is_context_ladder
from calibrate.state.summaries import ladder_summary, sweep_summary

# the columns of a level's or tier's row (tiers.csv, Stats.to_json) the comparison reads
MEASURED = (
    "items",
    "errors",
    "latency_p50_s",
    "latency_p99_s",
    "input_tokens_mean",
    "output_tokens_mean",
    "ttft_p50_s",
    "tpot_p50_s",
    "preemptions",
    "peak_kv_usage",
    "server_running_max",
    "noise_other_cpu_cores",
)


def measured_of(row: Mapping[str, Any], runs_per_s: Sequence[float] = ()) -> dict[str, Any]:
    """The ``measured`` block of a level or tier in the ledger: what a batch at that
    concurrency is compared with, from its row; ``runs_per_s`` each repeat's (or round's)
    items/s, whose range is the measurement's own interval."""
    keys = ("items_per_s", *MEASURED)
    out = {k: _rounded(row.get(k)) for k in keys if _number(row.get(k)) is not None}
    if runs_per_s:
        out["items_per_s_min"] = round(min(runs_per_s), 4)
        out["items_per_s_max"] = round(max(runs_per_s), 4)
        out["repeats"] = len(runs_per_s)
    return out


@dataclass(frozen=True)
class Calibrated:
    """One measurement of the setting at the batch's concurrency: throughput with its interval
    over repeats, latency, errors, what the workload was, and what the server and the machine
    did meanwhile (None: not measured)."""

    stage: str  # "sweep" | "ladder"
    run_id: str
    concurrency: int
    batch_size: int
    items_per_s: float  # the median of its repeats (sweep) or the tier's (ladder)
    items_per_s_low: float
    items_per_s_high: float
    repeats: int
    items: int | None = None
    errors: int | None = None
    latency_p50_s: float | None = None
    latency_p99_s: float | None = None
    input_tokens_mean: float | None = None
    output_tokens_mean: float | None = None
    ttft_p50_s: float | None = None
    tpot_p50_s: float | None = None
    preemptions: int | None = None
    peak_kv_usage: float | None = None
    running_max: int | None = None
    noise_cores: float | None = None  # other processes' CPU on this machine, in cores
    workload: str = ""

    @property
    def where(self) -> str:
        """``sweep run 2026…-sweep-ab12cd at concurrency 4`` / ``ladder run …, batch 4``."""
        if self.stage == "sweep":
            return f"sweep run {self.run_id} at concurrency {self.concurrency}"
        return f"ladder run {self.run_id}, batch {self.concurrency}"

    @property
    def error_rate(self) -> float:
        return (self.errors or 0) / self.items if self.items else 0.0

    @property
    def spread(self) -> float:
        """The interval's width as a share of the median (0 for one repeat)."""
        if self.items_per_s <= 0:
            return 0.0
        return max(0.0, self.items_per_s_high - self.items_per_s_low) / self.items_per_s

    def to_json(self) -> dict[str, Any]:
        return {f.name: _rounded(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Any) -> Calibrated | None:
        """Read back (tolerant: a malformed block reads as no calibration)."""
        if not isinstance(data, dict):
            return None
        floats = {f.name: _number(data.get(f.name)) for f in fields(cls) if f.type == "float"}
        ints = {f.name: _whole(data.get(f.name)) for f in fields(cls) if "int" in str(f.type)}
        maybe = {f.name: _number(data.get(f.name)) for f in fields(cls) if f.type == "float | None"}
        texts = {k: data.get(k) for k in ("stage", "run_id", "workload")}
        if any(v is None for v in floats.values()) or not all(
            isinstance(v, str) for v in texts.values()
        ):
            return None
        if ints["concurrency"] is None or ints["batch_size"] is None or ints["repeats"] is None:
            return None
        return cls(**texts, **floats, **ints, **maybe)  # type: ignore[arg-type]


def calibration_for(
    ledger: Ledger, target: str, runs_dir: Path, batch_size: int, concurrency: int, *, tuned: bool
) -> Calibrated | str:
    """The measurement a batch at ``concurrency`` is compared with (setting batch size
    ``batch_size``), or why there is none, in words."""
    entries = [e for _, e in ledger.view().of_target(target) if e.passed and not e.interrupted]
    if tuned:  # flags a tune chose: only what was measured with them counts
        tunes = [i for i, e in enumerate(entries) if e.stage == "tune"]
        entries = entries[tunes[-1] + 1 :] if tunes else entries
    for entry in reversed(entries):
        if entry.stage == "sweep" and sweep_summary(entry.summary).batch_size == batch_size:
            found = _from_sweep(entry, runs_dir, batch_size, concurrency)
            if found is not None:
                return found
    one_request = ""  # a prompt-list ladder: what it measured is not what batch sends
    for entry in reversed(entries):
        if entry.stage == "ladder" and not is_context_ladder(entry):
            if _ladder_mode(runs_dir, entry) == "prompt-list":
                one_request = one_request or entry.run_id
                continue
            found = _from_ladder(entry, runs_dir, concurrency)
            if found is not None:
                return found
    if one_request:
        return (
            f"ladder run {one_request} ran in prompt-list mode (one request of {concurrency} "
            f"prompts), not {concurrency} requests at once as batch sends them; nothing measured "
            f"concurrency {concurrency} as this batch runs (calibrate sweep measures it)"
        )
    if tuned:
        return (
            f"nothing was measured at concurrency {concurrency} with the engine flags tune "
            "chose (calibrate sweep measures them)"
        )
    return (
        f"no passing sweep at batch {batch_size} or ladder measured concurrency {concurrency} "
        "for this target (calibrate sweep measures it)"
    )


def _from_sweep(
    entry: LedgerEntry, runs_dir: Path, batch_size: int, concurrency: int
) -> Calibrated | None:
    levels = entry.summary.get("levels")
    for level in levels if isinstance(levels, list) else []:
        closed = isinstance(level, dict) and "offered_rate" not in level  # a rate's C is a cap
        if not closed or level.get("concurrency") != concurrency or level.get("verdict") == "fail":
            continue
        measured = level.get("measured")
        row = (
            measured
            if isinstance(measured, dict)
            else _row(runs_dir, entry, Column.CONCURRENCY, concurrency)
        )
        workload = sweep_summary(entry.summary).workload.describe()
        row = {**_noise_of(entry), **row, **level}
        found = _made("sweep", entry, (batch_size, concurrency), row, workload)
        if found is not None:
            return found
    return None


def _ladder_mode(runs_dir: Path, entry: LedgerEntry) -> str:
    """How the ladder sent each tier, from its run's manifest ("wave", "prompt-list"; "" when
    its folder is gone or it did not record it)."""
    config = read_object(run_path(runs_dir, entry.run_id) / "manifest.json").get("config")
    ladder = config.get("ladder") if isinstance(config, dict) else None
    mode = ladder.get("mode") if isinstance(ladder, dict) else None
    return mode if isinstance(mode, str) else ""


def _from_ladder(entry: LedgerEntry, runs_dir: Path, concurrency: int) -> Calibrated | None:
    summary = ladder_summary(entry.summary)
    top = summary.last_passing.batch_size if summary.last_passing else concurrency
    tiers = entry.summary.get("tiers")
    for tier in tiers if isinstance(tiers, list) else []:
        if not isinstance(tier, dict) or tier.get("batch_size") != concurrency:
            continue
        if tier.get("verdict") != "pass":
            continue
        measured = tier.get("measured")
        row = (
            measured
            if isinstance(measured, dict)
            else _row(runs_dir, entry, Column.BATCH_SIZE, concurrency)
        )
        per_item = _number(tier.get("per_item_s"))
        if _number(row.get("items_per_s")) is None and per_item:
            row = {**row, "items_per_s": 1 / per_item}
        row = {**_noise_of(entry), **row}
        found = _made("ladder", entry, (top, concurrency), row, summary.workload.describe())
        if found is not None:
            return found
    return None


def _made(
    stage: str, entry: LedgerEntry, at: tuple[int, int], row: Mapping[str, Any], workload: str
) -> Calibrated | None:
    """The measurement from its row (the ledger's level or tier with its ``measured`` block,
    or its tiers.csv row); None without a throughput."""
    median = _number(row.get("items_per_s"))
    if median is None or median <= 0:
        return None
    low = _number(row.get("items_per_s_min"))
    high = _number(row.get("items_per_s_max"))
    repeats = row.get("repeats") or row.get("rounds")

    def num(key: str) -> float | None:
        return _number(row.get(key))

    def whole(key: str) -> int | None:
        value = _number(row.get(key))
        return int(value) if value is not None else None

    return Calibrated(
        stage,
        entry.run_id,
        at[1],
        at[0],
        median,
        min(low, median) if low is not None else median,
        max(high, median) if high is not None else median,
        repeats if isinstance(repeats, int) and repeats > 0 else 1,
        items=whole("items"),
        errors=whole("errors"),
        latency_p50_s=num("latency_p50_s"),
        latency_p99_s=num("latency_p99_s"),
        input_tokens_mean=num("input_tokens_mean"),
        output_tokens_mean=num("output_tokens_mean"),
        ttft_p50_s=num("ttft_p50_s"),
        tpot_p50_s=num("tpot_p50_s"),
        preemptions=whole("preemptions"),
        peak_kv_usage=num("peak_kv_usage"),
        running_max=whole("server_running_max"),
        noise_cores=num("noise_other_cpu_cores"),
        workload=workload,
    )


def _row(runs_dir: Path, entry: LedgerEntry, key: Column, value: int) -> dict[str, Any]:
    """An older ledger line's level or tier completed from its run's tiers.csv (its last row
    of that ``key``: a tier run again is written again); {} when the folder is gone."""
    path = run_path(runs_dir, entry.run_id) / "tiers.csv"
    if not path.is_file():
        return {}
    try:
        table = read_table(path)
    except CalibrateError:
        return {}
    found = [r for r in table.rows if cell(r, key) == value and r.rate.offered_rate is None]
    return row_json(found[-1], table.columns) if found else {}


def _noise_of(entry: LedgerEntry) -> dict[str, Any]:
    """The run's noise over all its levels or tiers (an older line's only figure of it)."""
    noise = entry.summary.get("noise")
    return (
        {"noise_other_cpu_cores": noise.get("noise_other_cpu_cores")}
        if isinstance(noise, dict)
        else {}
    )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _rounded(value: Any) -> Any:
    return round(value, 6) if isinstance(value, float) else value
