"""The one reader and writer of ``tiers.csv`` and ``tiers.jsonl``: a ladder's tiers, a sweep's
levels (``TierRow``, written here with ``csv``, still what pandas reads), a tune's ranked
candidates (``tune.TuneRow``).

``report RUN`` and ``--compare`` both read tables here, so a table one of them accepts the other
does too. Rows are typed on read and on write; a column this version does not know is kept in
the row's ``extra``, a cell that is not what its column holds is exit 2 naming file, line and
column.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibrate.errors import InputError
from calibrate.io.atomic import write_atomic
from calibrate.io.bounded import read_text
from calibrate.io.jsonl import read_jsonl
from calibrate.io.tier_table.cell_values import CellError
from calibrate.io.tier_table.cells import cell, csv_text, row_from_cells
from calibrate.io.tier_table.columns import ENERGY, OLD_NAMES, REQUIRED, TABLE, Column, Kind
from calibrate.io.tier_table.row import TierRow

REWRITE = "Rerun the stage to write the table again."


@dataclass(frozen=True)
class TierTable:
    """A tiers.csv read back: its columns (today's names) and its rows."""

    path: Path
    columns: tuple[str, ...]
    rows: tuple[TierRow, ...]

    def has(self, column: Column) -> bool:
        return column in self.columns

    @property
    def kind(self) -> Kind:
        """What wrote it, told by its columns (a sweep's levels have a gain)."""
        return "sweep" if self.has(Column.GAIN) else "ladder"


def _damaged(path: Path | str, line: int, exc: CellError) -> InputError:
    return InputError(f"{path}:{line}: {exc}, not what a ladder or sweep writes", REWRITE)


def read_table(csv_path: Path) -> TierTable:
    """A tiers.csv with typed rows (old column names upgraded); unreadable, empty or holding a
    cell its column cannot hold is exit 2."""
    try:
        with io.StringIO(read_text(csv_path), newline="") as handle:
            reader = csv.DictReader(handle)
            raw = list(reader)
            header = [OLD_NAMES.get(name, name) for name in reader.fieldnames or ()]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InputError(
            f"cannot read {csv_path}: {exc}",
            "Give a ladder or sweep run folder, e.g. runs/<run_id>",
        ) from exc
    if not raw:
        raise InputError(f"{csv_path} has no rows")
    rows = []
    for line, cells in enumerate(raw, 2):
        try:
            rows.append(row_from_cells({str(k): v or "" for k, v in cells.items() if k}, text=True))
        except CellError as exc:
            raise _damaged(csv_path, line, exc) from exc
    return TierTable(csv_path, tuple(dict.fromkeys(header)), tuple(rows))


def read_row_lines(path: Path) -> Iterator[tuple[int, TierRow]]:
    """The lines of a tiers.jsonl or rounds.jsonl as rows, with their line numbers; a line that
    is not a row (damaged, or a cell its column cannot hold) is left out."""
    for number, line in enumerate(read_jsonl(path), 1):
        try:
            yield number, row_from_cells(line)
        except CellError:
            continue


def check_table(table: TierTable, kind: Kind) -> None:
    """Exit 2 on a table this tool did not write: missing columns or empty cells in them."""
    missing = [c.value for c in REQUIRED[kind] if not table.has(c)]
    if missing:
        raise InputError(
            f"{table.path} is not a {kind} tier table: no column {', '.join(missing)}",
            f"A table written by calibrate {kind} is needed; rerun that stage.",
        )
    for number, row in enumerate(table.rows, 2):
        for column in REQUIRED[kind]:
            value = cell(row, column)
            ok = value is not None and (not isinstance(value, float) or math.isfinite(value))
            if not ok:
                raise InputError(
                    f"{table.path}:{number}: {column} is {value!r}, not what a {kind} writes",
                    REWRITE,
                )


def level_key(record: Mapping[str, Any], key: Column) -> float | None:
    """The value naming a tier or level in a record of records.jsonl (an offered rate of
    ``"inf"`` is infinity); None when it has none."""
    value = record.get(key)
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            return None if math.isnan(value) else float(value)
        except OverflowError:  # an integer of hundreds of digits (a damaged file): no tier
            return None
    return math.inf if isinstance(value, str) and value.strip().lower() == "inf" else None


def write_tiers_csv(path: Path, rows: Sequence[TierRow], kind: Kind, vram_source: str) -> Path:
    """One row per tier (or level), the SPEC columns in a fixed order; an energy column no row
    has a figure in is left out (never a column of zeros)."""
    energy = [c for c in ENERGY if any(cell(r, c) is not None for r in rows)]
    columns = [*TABLE[kind], *energy]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(
            csv_text(vram_source if c is Column.VRAM_SOURCE else cell(row, c)) for c in columns
        )
    write_atomic(path, buffer.getvalue())
    return path
