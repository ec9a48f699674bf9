"""The tier table of the HTML report: the essential columns, every column folded under them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from calibrate.io.tier_table.cells import cell
from calibrate.io.tier_table.columns import Column as C
from calibrate.numbers import finite
from calibrate.report.html.parts import folded, table, verdict_class
from calibrate.report.run_view import RunView
from calibrate.report.tables.cells import Cells
from calibrate.report.tables.columns import table_cells

# The columns shown by default (the rest are folded under the table): what tells the tiers
# apart at a glance, and fits 1280 px without scrolling.
ESSENTIAL = (
    "input",
    "batch",
    "conc",
    "offered",
    "achieved",
    "items/s",
    "gain",
    "tok/s",
    "goodput",
    "p50 s",
    "p99 s",
    "ttft p50",
    "peak MiB",
    "pressure",
    "errors",
    "verdict",
)


def _cells_of(view: RunView, cells: Cells, extras: Sequence[C]) -> list[list[str]]:
    return [
        [text(row) for _, text in cells] + [_extra(cell(row, c)) for c in extras]
        for row in view.rows
    ]


def _row_attrs(view: RunView) -> list[dict[str, str]]:
    return [
        {
            "class": f"tier {verdict_class(r.verdict)}",
            "data-key": f"{view.key_of(r) or 0:g}",
        }
        for r in view.rows
    ]


def tier_table_html(view: RunView) -> str:
    """The essential columns, then every column (the terminal's plus any latency percentile /
    rate columns the run has) folded under them."""
    cells = table_cells(view.rows, view.kind)
    shown = {C.TTFT_P50_S} if any(name == "ttft p50" for name, _ in cells) else set()
    extras = [c for c in view.extra_columns() if c not in shown]
    headers = [name for name, _ in cells] + extras
    left = ("verdict", "errors", "pressure")
    short = [c for c in cells if c[0] in ESSENTIAL]
    every = table(
        "tiers",
        headers,
        _cells_of(view, cells, extras),
        row_attrs=_row_attrs(view),
        text_columns=left,
    )
    return "\n".join(
        [
            table(
                "tier-summary",
                [name for name, _ in short],
                _cells_of(view, short, []),
                row_attrs=_row_attrs(view),
                text_columns=left,
            ),
            folded(
                "tier-columns",
                f"every column ({len(headers)}): rounds, percentiles, tokens, queue, rates",
                [every],
            ),
        ]
    )


def _extra(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    number = finite(value)
    return f"{number:.4g}" if number is not None else ("—" if value is None else str(value))
