"""The one reader and writer of ``tiers.csv``: a ladder's tiers, a sweep's levels, a tune's
ranked candidates.

``report RUN`` and ``--compare`` both read tables here, so a table one of them accepts the other
does too. Plain ``csv`` is enough to read it back (numbers parsed, empty cells as None); a
ladder's or sweep's table is written with pandas (imported on use), a tune's with ``csv``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from calibrate.errors import InputError
from calibrate.gpu.energy import ENERGY_COLUMNS
from calibrate.io.atomic import write_atomic

Kind = Literal["ladder", "sweep"]

REQUIRED: dict[str, tuple[str, ...]] = {
    "ladder": ("batch_size", "concurrency", "rounds", "items", "errors", "verdict"),
    "sweep": ("concurrency", "batch_size", "items", "verdict"),
}


def _cell(text: str) -> Any:
    """``"4"`` → 4, ``"0.25"`` → 0.25, ``""`` → None, anything else stays text."""
    if text == "":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return text
    if math.isinf(number):
        return text  # "inf": an offered rate of everything at once, read by level_key
    return None if math.isnan(number) else number


def level_key(row: Mapping[str, Any], key: str) -> float | None:
    """The value that names a tier or level (batch size, concurrency, offered rate, auto step);
    an offered rate of ``"inf"`` is infinity. None when the row has none."""
    value = row.get(key)
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            return None if math.isnan(value) else float(value)
        except OverflowError:  # an integer of hundreds of digits (a damaged file): no tier
            return None
    return math.inf if isinstance(value, str) and value.strip().lower() == "inf" else None


# Request latency was once written as per_item_*; per_item_s now means wall time / items.
OLD_NAMES = {f"per_item_{q}_s": f"latency_{q}_s" for q in ("mean", "p50", "p90", "p99", "max")}


def upgraded(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row of a table written before the rename, under today's column names."""
    out = dict(row)
    for old, new in OLD_NAMES.items():
        if old in out and new not in out:
            out[new] = out.pop(old)
    return out


def read_rows(csv_path: Path) -> list[dict[str, Any]]:
    """The rows of a tiers.csv with typed cells (old column names upgraded); unreadable or empty
    is exit 2."""
    try:
        with csv_path.open(newline="", encoding="utf-8") as handle:
            raw = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InputError(
            f"cannot read {csv_path}: {exc}",
            "Give a ladder or sweep run folder, e.g. runs/<run_id>",
        ) from exc
    if not raw:
        raise InputError(f"{csv_path} has no rows")
    return [
        upgraded({str(k): _cell(v or "") for k, v in row.items() if k is not None}) for row in raw
    ]


def check_rows(rows: Sequence[Mapping[str, Any]], kind: Kind, csv_path: Path) -> None:
    """Exit 2 on a table this tool did not write: missing columns or non-numbers in them."""
    missing = [c for c in REQUIRED[kind] if c not in rows[0]]
    if missing:
        raise InputError(
            f"{csv_path} is not a {kind} tier table: no column {', '.join(missing)}",
            f"A table written by calibrate {kind} is needed; rerun that stage.",
        )
    for number, row in enumerate(rows, 2):
        for column in REQUIRED[kind]:
            value = row.get(column)
            if column == "verdict":
                ok = isinstance(value, str)
            elif isinstance(value, int | float) and not isinstance(value, bool):
                ok = math.isfinite(value)
            else:
                ok = False
            if not ok:
                raise InputError(
                    f"{csv_path}:{number}: {column} is {value!r}, not what a {kind} writes",
                    "Rerun the stage to write the table again.",
                )


# The columns a ladder and a sweep write, in order (the energy ones follow when measured).
_QUANTILES = ("p50", "p90", "p95", "p99", "mean")  # SPEC §5.13's latency columns
_COMMON = [
    "items",
    "total_s",
    "per_item_s",
    "latency_mean_s",
    "latency_p50_s",
    "latency_p90_s",
    "latency_p99_s",
    "latency_max_s",
    *(f"{m}_{q}_s" for m in ("ttft", "tpot", "itl", "e2e") for q in _QUANTILES),
    "tokens_counted_by",
    "items_per_s",
    "output_tokens_per_s",
    "output_tokens_per_s_per_request",
    "goodput_per_s",
    "slo_met",
    "peak_vram_mib",
    "vram_idle_mib",
    "vram_total_mib",
    "pressure",
    "pressure_source",
    "pressure_metric",
    "peak_kv_usage",
    "per_device",
    "server_queue_max",
    "server_running_max",
    "vram_source",
    "errors",
    "error_kinds",
    "first_done_s",
    "last_done_s",
]
# What the workload sent and the server counted (SPEC §5.11): target vs actual.
_TOKENS = [
    "input_tokens_target",
    "input_tokens_mean",
    "input_tokens_max",
    "output_tokens_mean",
    "input_chars_mean",
]
COLUMNS: dict[str, list[str]] = {
    "ladder": [
        "batch_size",
        "concurrency",
        "rounds",
        "waves",
        *_COMMON,
        *_TOKENS,
        "baseline_match",
        "baseline_items",
        "distinct_completions",
        "first_diff_token",
        "verdict",
        "reason",
        "axis",
    ],
    "sweep": [
        "concurrency",
        "batch_size",
        "repeats",
        *_COMMON,
        *_TOKENS,
        "items_per_s_min",
        "items_per_s_max",
        "auto_step",
        "load",
        "offered_rate",
        "achieved_rate",
        "saturated",
        "saturation",
        "send_lag_p99_s",
        "goodput_per_s_min",
        "goodput_per_s_max",
        "gain",
        "gain_counted",
        "capped_by_server",
        "distinct_completions",
        "first_diff_token",
        "verdict",
    ],
}


def kinds_text(value: Any) -> str:
    """``{"oom": 2}`` (JSONL) or ``"oom:2"`` (CSV) → ``oom:2``."""
    if isinstance(value, Mapping):
        return " ".join(f"{k}:{n}" for k, n in sorted(value.items()))
    return "" if value is None else str(value)


def _json_text(value: Any) -> str | None:
    """Per-device figures as compact JSON in one CSV cell (already text when read back)."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":")) if value else None


def write_tiers_csv(
    path: Path, rows: Sequence[Mapping[str, Any]], kind: Kind, vram_source: str
) -> Path:
    """One row per tier (or level), the SPEC columns in a fixed order."""
    records = [
        {
            **r,
            "error_kinds": kinds_text(r.get("error_kinds")),
            "vram_source": vram_source,
            "per_device": _json_text(r.get("per_device")),
        }
        for r in rows
    ]
    import pandas as pd  # imported on use: every command's start and --help stay light

    energy = [c for c in ENERGY_COLUMNS if any(r.get(c) is not None for r in rows)]  # or none
    frame = pd.DataFrame(records, columns=[*COLUMNS[kind], *energy])
    write_atomic(path, frame.to_csv(index=False))
    return path


@dataclass(frozen=True)
class TuneRow:
    """One ranked tune candidate: the same cells in tiers.csv, tiers.jsonl and the printed
    table (None: not measured, an empty cell)."""

    rank: int
    id: str
    flags: str
    status: str
    cap: int | None
    best_concurrency: int | None
    goodput_per_s: float | None
    items_per_s: float | None
    output_tokens_per_s: float | None
    p50_s: float | None
    p90_s: float | None
    ttft_p50_s: float | None
    joules_per_output_token: float | None
    usd_per_1m_output_tokens: float | None
    peak_vram_mib: float | None
    peak_kv_usage: float | None
    pressure: float | None
    errors: int
    incidents: int
    start_exit_code: int | None
    rung: int
    window: float
    elapsed_s: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


TUNE_COLUMNS = tuple(f.name for f in dataclasses.fields(TuneRow))
_TUNE_ENERGY = ("joules_per_output_token", "usd_per_1m_output_tokens")


def write_tune_csv(path: Path, rows: Sequence[TuneRow]) -> Path:
    """A tune's ranked candidates, one row each; an energy column no candidate has is left out."""
    table = [r.to_json() for r in rows]
    unmeasured = {c for c in _TUNE_ENERGY if all(r.get(c) is None for r in table)}
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[c for c in TUNE_COLUMNS if c not in unmeasured])
    writer.writeheader()
    for line in table:
        writer.writerow({k: "" if v is None else v for k, v in line.items() if k not in unmeasured})
    write_atomic(path, buffer.getvalue())
    return path
