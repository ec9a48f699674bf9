"""A ``TierRow`` to and from its cells: a CSV line's texts, a JSONL line's values.

Each column's place in the row (its part and field) and its type come from the dataclasses of
``row``; its spelling from ``columns.Column``; what one cell holds from ``cell_values``. A cell
that is not what its column holds (text in a number's column, ``2.5`` rounds) is a
``CellError``; a column this version does not know is kept in ``extra``, so a newer run's table
still reads, and its values are still shown and compared.
"""

from __future__ import annotations

import json
import math
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from calibrate.io.tier_table.cell_values import PARSERS, CellError, guess
from calibrate.io.tier_table.columns import OLD_NAMES, Column, Kind
from calibrate.io.tier_table.row import TierRow, Written


@dataclass(frozen=True)
class _Spec:
    """Where one column lives in a ``TierRow`` and how it is read and written."""

    column: Column
    part: str | None  # the TierRow field holding its part (None: a field of the row itself)
    name: str  # its field in the part (or the row)
    parse: Callable[[Any], Any]
    written: Written
    group: str  # the columns written together under "any"


def _specs() -> tuple[_Spec, ...]:
    out: list[_Spec] = []
    hints = typing.get_type_hints(TierRow)
    for f in fields(TierRow):
        if f.name == "extra":
            continue
        written: Written = f.metadata.get("written", "always")
        if "prefix" not in f.metadata:
            group = f.metadata.get("group", f.name)
            out.append(_Spec(Column(f.name), None, f.name, PARSERS[hints[f.name]], written, group))
            continue
        inner = typing.get_type_hints(hints[f.name])
        for g in fields(hints[f.name]):
            column = Column(f.metadata["prefix"] + g.name)  # a field no column spells: ValueError
            group = f"{f.name}.{g.metadata.get('group', '')}"
            how = g.metadata.get("written", written)
            out.append(_Spec(column, f.name, g.name, PARSERS[inner[g.name]], how, group))
    return tuple(out)


SPECS = _specs()
_BY_COLUMN: dict[str, _Spec] = {s.column: s for s in SPECS}
_PARTS: dict[str, Any] = {
    f.name: typing.get_type_hints(TierRow)[f.name]
    for f in fields(TierRow)
    if "prefix" in f.metadata
}


def row_from_cells(cells: Mapping[str, Any], *, text: bool = False) -> TierRow:
    """A row from its cells (``text``: a CSV line's, where an unknown column's number is text);
    older column names are read as today's. Raises ``CellError``."""
    top: dict[str, Any] = {}
    parts: dict[str, dict[str, Any]] = {name: {} for name in _PARTS}
    extra: dict[str, Any] = {}
    for key, value in cells.items():
        name = OLD_NAMES.get(key, key)
        spec = _BY_COLUMN.get(name)
        if spec is None:
            extra[key] = guess(value) if text and isinstance(value, str) else value
            continue
        if name != key and name in cells:
            continue  # both spellings: today's wins
        try:
            parsed = spec.parse(value)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            raise CellError(name, value) from exc
        (top if spec.part is None else parts[spec.part])[spec.name] = parsed
    built = {name: cls(**parts[name]) for name, cls in _PARTS.items()}
    return TierRow(**top, **built, extra=extra)


def cell(row: TierRow, column: Column | str) -> Any:
    """The value of one column (an unknown one from ``extra``; None when the row has none)."""
    spec = _BY_COLUMN.get(column)
    if spec is None:
        return row.extra.get(str(column))
    holder = row if spec.part is None else getattr(row, spec.part)
    return getattr(holder, spec.name)


def known_cells(row: TierRow) -> Iterator[tuple[Column, Any]]:
    """Every known column and its value, in the row's order."""
    for spec in SPECS:
        yield spec.column, cell(row, spec.column)


def json_value(value: Any) -> Any:
    """A cell as JSON holds it: an infinite rate is ``"inf"`` (JSON has no infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, tuple):
        return [asdict(d) for d in value]  # per-device figures
    if isinstance(value, Mapping):
        return dict(value)
    return value


def row_json(row: TierRow, columns: Sequence[str] | None = None) -> dict[str, Any]:
    """The row as a JSONL line holds it; with ``columns``, exactly those (as the table read
    had them). A part's columns are written as its ``written`` says."""
    if columns is not None:
        return {str(c): json_value(cell(row, c)) for c in columns}
    values = list(known_cells(row))
    filled = {_BY_COLUMN[c].group for c, v in values if v is not None}
    out: dict[str, Any] = {}
    for (column, value), spec in zip(values, SPECS, strict=True):
        written = spec.written
        if (written == "each" and value is None) or (written == "any" and spec.group not in filled):
            continue
        out[column.value] = json_value(value)
    return {**out, **row.extra}


def picked(
    row: TierRow, columns: Sequence[Column], digits: int, *, measured: bool = False
) -> dict[str, Any]:
    """Some of a row's cells as a summary holds them: figures to ``digits``; with ``measured``,
    a column without a value is left out."""
    out: dict[str, Any] = {}
    for column in columns:
        value = json_value(cell(row, column))
        if value is None and measured:
            continue
        out[column.value] = round(value, digits) if isinstance(value, float) else value
    return out


def written(row: TierRow, columns: Sequence[Column]) -> dict[str, Any]:
    """Those of ``columns`` its JSON line holds (a part as its ``written`` says)."""
    line = row_json(row)
    return {c.value: line[c.value] for c in columns if c.value in line}


def csv_text(value: Any) -> str:
    """A cell as tiers.csv holds it: empty for none, ``oom:2`` for error kinds, per-device
    figures as compact JSON."""
    if value is None:
        return ""
    if isinstance(value, Mapping):
        return kinds_text(value)
    if isinstance(value, tuple):
        return json.dumps(json_value(value), separators=(",", ":")) if value else ""
    return str(value)


def kinds_text(kinds: Mapping[str, int]) -> str:
    """``{"oom": 2}`` → ``oom:2``."""
    return " ".join(f"{k}:{n}" for k, n in sorted(kinds.items()))


def numbers(row: TierRow) -> dict[str, float]:
    """Every finite number the row holds, by column (flags, text and a count of hundreds of
    digits left out): what ``report`` compares and spreads over the rounds."""
    out: dict[str, float] = {}
    pairs = [*((c.value, v) for c, v in known_cells(row)), *row.extra.items()]
    for name, value in pairs:
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        try:
            number = float(value)
        except OverflowError:
            continue
        if math.isfinite(number):
            out[name] = number
    return out


def key_value(row: TierRow, key: Column) -> float | None:
    """The value naming a tier or level (batch size, concurrency, offered rate — ``inf`` for
    everything at once —, auto step, input length); None when the row has none."""
    value = cell(row, key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:  # an integer of hundreds of digits (a damaged file): no tier
        return None


def row_key(kind: Kind, rows: Sequence[TierRow]) -> Column:
    """The column a table's rows are matched by (``report A B``, ``--compare``): ladders by
    batch size (input length on the context axis); sweeps by concurrency, by offered rate
    when the sweep ran in rate mode, by step when it ran ``--auto``."""
    if kind == "ladder":
        return (
            Column.INPUT_TOKENS_TARGET if any(r.context_axis for r in rows) else Column.BATCH_SIZE
        )
    if any(r.auto.auto_step is not None for r in rows):
        return Column.AUTO_STEP  # two auto runs offer different rates; their steps match
    return (
        Column.OFFERED_RATE
        if any(r.rate.offered_rate is not None for r in rows)
        else Column.CONCURRENCY
    )
