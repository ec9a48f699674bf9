"""A tune's ranked candidates: the same cells in its tiers.csv, tiers.jsonl and printed table."""

from __future__ import annotations

import csv
import dataclasses
import io
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibrate.io.atomic import write_atomic
from calibrate.io.tier_table.cell_values import (
    CellError,
    cell_flag,
    cell_int,
    cell_number,
    cell_text,
)
from calibrate.io.tier_table.columns import PER_TOKEN


@dataclass(frozen=True)
class TuneRow:
    """One ranked tune candidate: the same cells in tiers.csv, tiers.jsonl and the printed
    table (None: not measured, an empty cell)."""

    rank: int
    id: str
    flags: str
    status: str
    cap: int | None = None
    best_concurrency: int | None = None
    goodput_per_s: float | None = None
    items_per_s: float | None = None
    output_tokens_per_s: float | None = None
    p50_s: float | None = None
    p90_s: float | None = None
    ttft_p50_s: float | None = None
    joules_per_output_token: float | None = None
    usd_per_1m_output_tokens: float | None = None
    peak_vram_mib: float | None = None
    peak_kv_usage: float | None = None
    pressure: float | None = None
    errors: int = 0
    incidents: int = 0
    start_exit_code: int | None = None
    exit_code: int | None = (
        None  # how its server ended when it crashed while measured (-9: SIGKILL)
    )
    rung: int = 0
    window: float = 0.0
    elapsed_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TuneRow:
        """A line of a tune's tiers.jsonl: ``NotARow`` when it lacks a column every row has,
        ``CellError`` for a cell its field cannot hold."""
        missing = [name for name in REQUIRED if name not in data]
        if missing:
            raise NotARow(f"no {', '.join(missing)}")
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            try:
                value = _PARSE[_HINTS[f.name]](data.get(f.name))
            except (ValueError, TypeError) as exc:
                raise CellError(f.name, data.get(f.name)) from exc
            if value is not None:
                values[f.name] = value
            elif f.default is dataclasses.MISSING:
                raise CellError(f.name, data.get(f.name))
        return cls(**values)


class NotARow(ValueError):
    """A line of a tune's tiers.jsonl without the columns every row has."""


_HINTS = typing.get_type_hints(TuneRow)
_PARSE: dict[Any, Any] = {
    int: cell_int,
    int | None: cell_int,
    float: cell_number,
    float | None: cell_number,
    str: cell_text,
    bool: cell_flag,
}
# The columns every row has (cap is null for a candidate without a cap of its own).
REQUIRED = ("rank", "id", "flags", "status", "cap", "errors", "incidents")
COLUMNS = tuple(f.name for f in dataclasses.fields(TuneRow))


def write_tune_csv(path: Path, rows: Sequence[TuneRow]) -> Path:
    """A tune's ranked candidates, one row each; an energy column no candidate has is left out."""
    table = [r.to_json() for r in rows]
    unmeasured = {c for c in PER_TOKEN if all(r.get(c) is None for r in table)}
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[c for c in COLUMNS if c not in unmeasured])
    writer.writeheader()
    for line in table:
        writer.writerow({k: "" if v is None else v for k, v in line.items() if k not in unmeasured})
    write_atomic(path, buffer.getvalue())
    return path


@dataclass(frozen=True)
class Point:
    """One candidate at its best level, as a tune's Pareto front sees it (``stages.tune.pareto``
    builds them; a summary's ``pareto`` list holds them; ``report`` reads them back)."""

    id: str
    flags: str
    concurrency: int
    per_user_tokens_per_s: float
    total_tokens_per_s: float
    goodput_per_s: float
    joules_per_output_token: float | None = None
    usd_per_1m_output_tokens: float | None = None
    on_front: bool = False
    pinned: bool = False
    window: float = 0.0  # the fraction of the sweep's window it was measured over (0: not said)

    def dominated_by(self, other: Point) -> bool:
        a = (other.per_user_tokens_per_s, other.total_tokens_per_s)
        b = (self.per_user_tokens_per_s, self.total_tokens_per_s)
        return a[0] >= b[0] and a[1] >= b[1] and a != b

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "flags": self.flags,
            "concurrency": self.concurrency,
            "per_user_tokens_per_s": round(self.per_user_tokens_per_s, 3),
            "total_tokens_per_s": round(self.total_tokens_per_s, 3),
            "goodput_per_s": round(self.goodput_per_s, 4),
            "joules_per_output_token": _rounded(self.joules_per_output_token),
            "usd_per_1m_output_tokens": _rounded(self.usd_per_1m_output_tokens),
            "on_front": self.on_front,
            "pinned": self.pinned,
            "window": self.window,
        }

    @classmethod
    def from_json(cls, data: Any) -> Point | None:
        """A point of a summary's ``pareto`` list; None for one that is not (damaged, or a cell
        its field cannot hold)."""
        if not isinstance(data, Mapping):
            return None
        try:
            return cls(
                str(data["id"]),
                str(data["flags"]),
                cell_int(data.get("concurrency")) or 0,
                cell_number(data["per_user_tokens_per_s"]) or 0.0,
                cell_number(data["total_tokens_per_s"]) or 0.0,
                cell_number(data.get("goodput_per_s")) or 0.0,
                cell_number(data.get("joules_per_output_token")),
                cell_number(data.get("usd_per_1m_output_tokens")),
                bool(cell_flag(data.get("on_front"))),
                bool(cell_flag(data.get("pinned"))),
                cell_number(data.get("window")) or 0.0,
            )
        except (KeyError, ValueError, TypeError, OverflowError):
            return None


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
