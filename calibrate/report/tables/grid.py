"""The one table renderer: a view declares its columns as ``(header, row → text)``; here they are
fitted to a width (minor ones left out, in a given order), drawn as a compact rich table, or
written as one ``key=value`` line.

Titles and cells are plain text (``plain``), never rich markup and never a control character:
they hold what a run folder, a tiers.csv or a flag said, and ``[/x]`` in one would otherwise
restyle the table or raise MarkupError, an ESC move the cursor."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TypeVar

from rich import box
from rich.table import Table
from rich.text import Text

from calibrate.redact import printable

Row = TypeVar("Row")  # a tier's or level's row, a tune candidate's
Columns = Sequence[tuple[str, Callable[[Row], str]]]  # (header, row → text)


def plain(text: str, style: str = "") -> Text:
    """A cell or title as it is written: no markup read, control characters shown escaped."""
    return Text(printable(text), style=style)


def compact(title: str | None = None) -> Table:
    """A table without column rules, side edges or a bottom rule: a rule under the header, two
    spaces between columns; as wide as its cells, few lines. The title is plain text."""
    return Table(
        title=plain(title) if title is not None else None,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1, 0, 0),
        pad_edge=False,
    )


def table_width(columns: Columns[Row], rows: Sequence[Row]) -> int:
    """The width of a ``compact`` table of these columns: each cell's widest text and two
    spaces between columns."""
    return -2 + sum(
        2 + max([len(name), *(len(cell(row)) for row in rows)]) for name, cell in columns
    )


def fit(
    columns: Columns[Row], rows: Sequence[Row], width: int | None, drop_first: Iterable[str]
) -> list[tuple[str, Callable[[Row], str]]]:
    """The columns that fit ``width``: those named in ``drop_first`` left out, in that order,
    until the table fits (every one without a width)."""
    kept = list(columns)
    if width is None:
        return kept
    for name in drop_first:
        if table_width(kept, rows) <= width:
            break
        kept = [c for c in kept if c[0] != name]
    return kept


def grid(
    columns: Columns[Row],
    rows: Sequence[Row],
    title: str | None,
    *,
    left: Collection[str],
    style: Callable[[int, Row], str | None],  # (position, row) → a rich style, or none
) -> Table:
    """The rows as a ``compact`` table: the ``left`` columns (text) left, figures right."""
    table = compact(title)
    for name, _ in columns:
        table.add_column(name, justify="left" if name in left else "right", overflow="fold")
    for n, row in enumerate(rows):
        table.add_row(*(plain(cell(row)) for _, cell in columns), style=style(n, row))
    return table
