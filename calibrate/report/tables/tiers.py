"""The tier (or level) table of a run, its ``key=value`` line, and its spreads over the rounds."""

from __future__ import annotations

from collections.abc import Sequence

from rich.markup import escape
from rich.table import Table

from calibrate.confidence import percent
from calibrate.io.tier_table.columns import Column as C
from calibrate.io.tier_table.columns import Kind
from calibrate.io.tier_table.row import TierRow
from calibrate.report.compare import headline
from calibrate.report.run_view import RunView
from calibrate.report.spreads import Spreads, spread_text
from calibrate.report.tables.columns import fitting_columns, short_name
from calibrate.report.tables.grid import compact, grid

LEFT_JUSTIFIED = ("verdict", "errors", "pressure")  # the text columns; figures go right


def tier_table(
    rows: Sequence[TierRow],
    kind: Kind,
    title: str | None = None,
    width: int | None = None,
    *,
    wide: bool = False,
) -> Table:
    """The tier (or level) table: the essential columns (every one with ``wide``); with
    ``width``, minor columns are left out until it fits."""
    columns = fitting_columns(rows, kind, None if wide else width, wide)
    return grid(columns, rows, title, left=LEFT_JUSTIFIED, style=_verdict_style)


def _verdict_style(_: int, row: TierRow) -> str | None:
    """A failed tier in red, one that stopped the run in yellow."""
    if row.verdict == "fail":
        return "red"
    return "yellow" if (row.verdict or "").startswith("stop") else None


CONFIDENCE_METRICS = 4  # headline metrics in the confidence table (the tier table has the rest)


def confidence_table(
    view: RunView, spreads: Spreads, level: float, width: int | None = None, wide: bool = False
) -> Table:
    """``report RUN``: each tier's headline metrics over its rounds (ladder) or repeats (sweep):
    mean [t-interval at ``level``] and CV; a CV over 10 % in yellow. Metrics are left out (last
    first) until it fits ``width`` unless ``wide``."""
    repeated = [
        m
        for m in headline(view)
        if any((s := spreads[k].get(m)) is not None and s.n > 1 for k in spreads)
    ][:CONFIDENCE_METRICS]
    keys = sorted(spreads)

    def texts(name: str) -> list[str]:
        return [spread_text(spreads[k].get(name)) for k in keys]

    def needed(metrics: Sequence[str]) -> int:
        key_w = max([len(short_name(view.key)), *(len(f"{k:g}") for k in keys)])
        return key_w + 3 + sum(2 + max([len(short_name(m)), *map(len, texts(m))]) for m in metrics)

    while not wide and width is not None and len(repeated) > 1 and needed(repeated) > width:
        # tokens/s follows items/s: it goes first, then the last metric
        if C.OUTPUT_TOKENS_PER_S in repeated:
            repeated.remove(C.OUTPUT_TOKENS_PER_S)
        else:
            repeated.pop()
    table = compact(
        f"over the {'rounds' if view.kind == 'ladder' else 'repeats'}: mean "
        f"[{percent(level)} interval] and CV"
    )
    for name in (short_name(view.key), "n", *map(short_name, repeated)):
        table.add_column(name, justify="right")
    for key in keys:
        metrics = spreads[key]
        n = max((s.n for s in metrics.values()), default=0)
        cells = [f"{key:g}", str(n)]
        for name in repeated:
            found = metrics.get(name)
            text = escape(spread_text(found))
            cells.append(f"[yellow]{text}[/]" if found is not None and found.noisy else text)
        table.add_row(*cells)
    return table
