"""Which columns a tier table shows: the essential ones, those measured, what goes first on a
narrow terminal, and the short headers of ``report A B``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from calibrate.io.tier_table.columns import Column as C
from calibrate.io.tier_table.columns import Kind
from calibrate.io.tier_table.row import TierRow
from calibrate.report.tables.cells import LADDER, SWEEP, Cells, context_axis, figure, pressure_short
from calibrate.report.tables.grid import fit

# The default table (fits 100 columns): what a user needs to pick a setting. --wide, tiers.csv,
# the JSONL and the HTML report carry every column.
ESSENTIAL: dict[Kind, tuple[str, ...]] = {
    "ladder": (
        "input",
        "batch",
        "conc",
        "in tok",
        "items/s",
        "s/item",
        "p50 s",
        "p99 s",
        "ttft p99",
        "goodput",
        "J/tok",  # only when energy was measured (the column is left out otherwise)
        "peak MiB",
        "pressure",
        "errors",
        "verdict",
    ),
    "sweep": (
        "conc",
        "offered",
        "achieved",
        "items/s",
        "range",
        "gain",
        "goodput",
        "p50 s",
        "p99 s",
        "ttft p99",
        "J/tok",  # only when energy was measured (the column is left out otherwise)
        "peak MiB",
        "errors",
        "verdict",
    ),
}


def kind_columns(kind: Kind, rows: Sequence[TierRow] = (), wide: bool = True) -> Cells:
    """A kind's columns (the input length first on the context axis); without ``wide`` the
    essential ones, pressure as a bare figure."""
    if kind == "sweep":
        columns = SWEEP
    elif context_axis(rows):
        columns = [("input", lambda r: figure(r.tokens.input_tokens_target, ".0f")), *LADDER]
    else:
        columns = LADDER
    if wide:
        return columns
    short = [
        ("pressure", pressure_short) if name == "pressure" else (name, cell)
        for name, cell in columns
    ]
    return [
        (name, cell)
        for name, cell in short
        if name in ESSENTIAL[kind] and (name != "in tok" or _sized(rows))
    ]


def _sized(rows: Sequence[TierRow]) -> bool:
    """A workload with an input-token target: ``in tok`` (target→counted) says it was met."""
    return any(r.tokens.input_tokens_target is not None for r in rows)


# On a narrow terminal these go first (in this order), so the cells left stay readable.
_DROP_FIRST: dict[Kind, tuple[str, ...]] = {
    "ladder": (  # goodput is never dropped: under SLOs it is the tier's headline, as in a sweep
        "itl p99",
        "ttft p50",
        "rounds",
        "out tok",
        "waves",
        "tpot p99",
        "ttft p99",
        "max s",
        "p90 s",
        "items",
        "queue",
        "p99 s",
        "tok/s",
        "in tok",
        "p50 s",
        "conc",
        "match",
    ),
    "sweep": (
        "lag p99",
        "itl p99",
        "tpot p50",
        "ttft p50",
        "tpot p99",
        "achieved",
        "ttft p99",
        "p99 s",
        "items",
        "out tok",
        "runs",
        "batch",
        "total s",
        "queue",
        "tok/s",
        "in tok",
        "p90 s",
        "p50 s",
    ),
}
# Shown only when some row has a value (TTFT and TPOT need a streamed run).
WHEN_MEASURED = (
    "ttft p99",
    "tpot p99",
    "ttft p50",
    "tpot p50",
    "itl p99",
    "goodput",
    "offered",
    "achieved",
    "lag p99",
    "J/tok",  # joules per output token: NVML or a DCGM exporter (SPEC §13)
)


def fitting_columns(
    rows: Sequence[TierRow], kind: Kind, width: int | None, wide: bool = True
) -> Cells:
    """The columns with a value in some row; with ``width``, minor ones left out until they fit."""
    columns = [
        (name, cell)
        for name, cell in kind_columns(kind, rows, wide)
        if name not in WHEN_MEASURED or any(cell(row) != "—" for row in rows)
    ]
    return fit(columns, rows, width, _DROP_FIRST[kind])


def table_cells(rows: Sequence[TierRow], kind: Kind) -> Cells:
    """The terminal table's columns (all of them, as on a wide screen), for the HTML report."""
    return fitting_columns(rows, kind, None)


# report A B: a short header per metric, so none is cut ("items_per…") at 100 columns.
SHORT_NAMES: Mapping[str, str] = {
    C.BATCH_SIZE: "batch",
    C.CONCURRENCY: "conc",
    C.OFFERED_RATE: "rate",
    C.AUTO_STEP: "step",
    C.INPUT_TOKENS_TARGET: "input",
    C.ITEMS_PER_S: "items/s",
    C.ACHIEVED_RATE: "achieved",
    C.GOODPUT_PER_S: "goodput",
    C.OUTPUT_TOKENS_PER_S: "tok/s",
    C.PER_ITEM_S: "s/item",
    C.LATENCY_P50_S: "p50 s",
    C.E2E_P50_S: "e2e p50",
    C.LATENCY_P99_S: "p99 s",
    C.E2E_P99_S: "e2e p99",
    C.TTFT_P50_S: "ttft p50",
    C.TTFT_P99_S: "ttft p99",
    C.TPOT_P99_S: "tpot p99",
    C.ITL_P99_S: "itl p99",
    C.PEAK_VRAM_MIB: "peak MiB",
    C.PRESSURE: "pressure",
    C.ERRORS: "errors",
}


def short_name(column: str) -> str:
    """A column's short header: ``items_per_s`` is ``items/s``, ``queue_wait_s`` ``queue wait``."""
    return SHORT_NAMES.get(column, column.removesuffix("_s").replace("_", " "))
