"""What a long stage shows while it runs: on a terminal a table that grows as tiers finish, a
progress bar under it (steps done, time left); in a log the same table a row at a time."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from calibrate.io.tier_table.columns import Kind
from calibrate.io.tier_table.row import TierRow
from calibrate.numbers import clock_text
from calibrate.redact import printable
from calibrate.report.tables.cells import Cells, context_axis
from calibrate.report.tables.columns import fitting_columns
from calibrate.report.tables.tiers import LEFT_JUSTIFIED, tier_table

# What a later row may need more than the first: an error kind ("2 oom:2"), a range and a
# gain of a faster level ("123.45–130.00", "(+12%)").
ROOM = {"errors": len("2 oom:2"), "range": len("123.45–130.00"), "gain": len("(+12%)")}
# A context ladder's rows grow: 512 first, up to the server's context last (a 6-digit length on
# a long-context model), so its first row cannot size the length columns: this one sizes them.
LONGEST_CONTEXT = 131072
# A rate level's verdict may say it saturated ("pass saturated"), where the first level's said
# "pass": its column has that room from the first row.
SWEEP_ROOM = {"verdict": len("pass saturated")}


Span = tuple[float, float]  # (low, high) seconds


@dataclass(frozen=True)
class Plan:
    """What the progress bar counts: ``steps`` tiers (levels, candidates) of about ``step_s``;
    with ``pace``, step i's own planned seconds instead — one number or a (low, high) range —
    asked again at each refresh (a ladder's and a sweep's, sized from the answers' time as the
    steps finish: ``cli.views.pace``)."""

    steps: int
    step_s: float
    label: str = "tiers"
    pace: Callable[[int], float | Span] | None = field(default=None, compare=False)

    def left_span(self, done: int, elapsed_s: float, in_step_s: float) -> Span:
        """(low, high) seconds left after ``done`` steps in ``elapsed_s``, ``in_step_s`` of them
        into the step running now: the planned steps left, less what the running one has had
        (never below the steps after it). Without ``pace``: ``step_s`` each until a step
        finished, then the measured pace (elapsed per step done)."""
        if done >= self.steps:
            return 0.0, 0.0
        planned: list[Span] = []
        for i in range(done, self.steps):
            if self.pace is None:
                each = elapsed_s / done if done else self.step_s
                planned.append((each, each))
            else:
                value = self.pace(i)
                planned.append(value if isinstance(value, tuple) else (value, value))
        (low, high), rest = planned[0], planned[1:]
        low = max(low - in_step_s, 0.0) + sum(p[0] for p in rest)
        return low, max(high - in_step_s, 0.0) + sum(p[1] for p in rest)

    def left_s(self, done: int, elapsed_s: float, in_step_s: float) -> float:
        """The low end of ``left_span``."""
        return self.left_span(done, elapsed_s, in_step_s)[0]

    def total_s(self) -> float:
        """The whole plan, before any step ran (its low end)."""
        return self.left_s(0, 0.0, 0.0)

    def total_span(self) -> Span:
        return self.left_span(0, 0.0, 0.0)


def span_text(span: Span) -> str:
    """``0:42``, or ``0:42–1:30`` where the high end is more than 10 % above the low."""
    low, high = span
    if high <= low * 1.1:
        return clock_text(low)
    return f"{clock_text(low)}–{clock_text(high)}"


def progress_bar(console: Console, plan: Plan) -> Progress:
    """A bar with the steps done and the time left: planned until a step finishes, then
    measured (elapsed per step done)."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(plan.label),
        TimeElapsedColumn(),
        EtaColumn(plan),
        console=console,
        transient=True,
    )


class EtaColumn(ProgressColumn):
    """``ETA 0:42`` (``ETA 0:42–1:30`` where the plan is a range): the plan's time left
    (``Plan.left_span``), the running step's time counted from when the column saw the step
    before it finish."""

    def __init__(self, plan: Plan) -> None:
        super().__init__()
        self.plan = plan
        self.done = 0
        self.since_s = 0.0  # the elapsed time at which ``done`` steps were seen done

    def render(self, task: Task) -> RenderableType:
        elapsed = task.elapsed or 0.0
        if task.finished or not task.total:
            return Text("")
        done = int(task.completed)
        if done != self.done:
            self.done, self.since_s = done, elapsed
        left = self.plan.left_span(done, elapsed, elapsed - self.since_s)
        return Text(f"ETA {span_text(left)}", style="progress.remaining")


@contextmanager
def live_rows(
    console: Console,
    kind: Kind,
    title: str,
    live: bool,
    *,
    wide: bool = False,
    plan: Plan | None = None,
) -> Iterator[Callable[[TierRow], None]]:
    """On a TTY a table that grows as rows finish, a progress bar under it; in a log the table
    a row at a time (``LogTable``); the finished table again only with --wide (every column)."""
    rows: list[TierRow] = []
    if not live:
        yield LogTable(console, kind).add
        return
    bar = progress_bar(console, plan) if plan is not None and plan.steps > 0 else None
    task = bar.add_task(kind, total=plan.steps) if bar is not None and plan is not None else None

    def view(done: bool = False) -> RenderableType:
        table = tier_table(rows, kind, title, console.width)
        return table if bar is None or done else Group(table, bar)

    # with --wide the table printed at the end has every column: this one goes when done
    with Live(view(), console=console, refresh_per_second=4, transient=wide) as display:

        def add(row: TierRow) -> None:
            rows.append(row)
            if bar is not None and task is not None:
                bar.advance(task)
            display.update(view())

        try:
            yield add
        finally:
            display.update(view(done=True))


class LogTable:
    """A log's table, a row as each tier finishes: the header (no rule under it in a log) comes
    with the first row, which fixes the columns (the essential ones, fitting the console, as a
    terminal's live table) and their widths (a later, wider cell pushes the rest of its row right;
    a context ladder's length columns have room for a long context from the start). --wide
    prints every column once more at the end, as on a terminal."""

    def __init__(self, console: Console, kind: Kind) -> None:
        self.console = console
        self.kind = kind
        self.columns: Cells = []
        self.widths: list[int] = []

    def add(self, row: TierRow) -> None:
        if not self.columns:
            self._fit(row)
            self._print([name for name, _ in self.columns])
        self._print([cell(row) for _, cell in self.columns])

    def _fit(self, row: TierRow) -> None:
        """The columns that fit with their room (fitted narrower until they do)."""
        limit = width = self.console.width
        longest = replace(
            row.tokens, input_tokens_target=LONGEST_CONTEXT, input_tokens_mean=LONGEST_CONTEXT
        )
        rows = [row, replace(row, tokens=longest)] if context_axis([row]) else [row]
        while True:
            before = len(self.columns)
            self.columns = fitting_columns(rows, self.kind, limit, wide=False)
            room = {**ROOM, **(SWEEP_ROOM if self.kind == "sweep" else {})}
            self.widths = [
                max(len(name), *(len(cell(r)) for r in rows), room.get(name, 0))
                for name, cell in self.columns
            ]
            over = sum(self.widths) + 2 * (len(self.widths) - 1) - width
            if over <= 0 or len(self.columns) == before:  # fits, or none left to drop
                return
            limit -= over

    def _print(self, texts: list[str]) -> None:
        cells = [
            text.ljust(width) if name in LEFT_JUSTIFIED else text.rjust(width)
            for (name, _), text, width in zip(self.columns, texts, self.widths, strict=True)
        ]
        self._say("  ".join(cells))  # padded as a rich table pads: ``report RUN``'s lines

    def _say(self, line: str) -> None:
        shown = printable(line)
        self.console.print(shown, markup=False, highlight=False, crop=False, soft_wrap=True)
