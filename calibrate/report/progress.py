"""What a long stage shows while it runs: on a terminal a table that grows as tiers finish, a
progress bar under it (steps done, time left); in a log one short line per tier."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

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

from calibrate.io.tier_table import Kind
from calibrate.report.tables.cells import tier_line
from calibrate.report.tables.tiers import tier_table


@dataclass(frozen=True)
class Plan:
    """What the progress bar counts: ``steps`` tiers (levels, candidates) of about ``step_s``."""

    steps: int
    step_s: float
    label: str = "tiers"


def progress_bar(console: Console, plan: Plan) -> Progress:
    """A bar with the steps done and the time left: planned until a step finishes, then
    measured (elapsed per step done)."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(plan.label),
        TimeElapsedColumn(),
        EtaColumn(plan.step_s),
        console=console,
        transient=True,
    )


class EtaColumn(ProgressColumn):
    """``ETA 0:42``: (steps left) × planned seconds per step, then the measured pace."""

    def __init__(self, step_s: float) -> None:
        super().__init__()
        self.step_s = step_s

    def render(self, task: Task) -> RenderableType:
        elapsed = task.elapsed or 0.0
        total = task.total or 0
        if task.finished or not total:
            return Text("")
        if task.completed:
            left = elapsed / task.completed * (total - task.completed)
        else:
            left = max(total * self.step_s - elapsed, 0.0)
        minutes, seconds = divmod(int(left + 0.5), 60)
        return Text(f"ETA {minutes}:{seconds:02d}", style="progress.remaining")


@contextmanager
def live_rows(
    console: Console,
    kind: Kind,
    title: str,
    live: bool,
    *,
    wide: bool = False,
    plan: Plan | None = None,
) -> Iterator[Callable[[Mapping[str, Any]], None]]:
    """On a TTY a table that grows as rows finish, a progress bar under it; in a log one short
    line per row (the table comes once, at the end: ``finish_tables``)."""
    rows: list[Mapping[str, Any]] = []
    if not live:
        yield lambda row: console.print(tier_line(row, kind), markup=False, highlight=False)
        return
    bar = progress_bar(console, plan) if plan is not None and plan.steps > 0 else None
    task = bar.add_task(kind, total=plan.steps) if bar is not None and plan is not None else None

    def view(done: bool = False) -> RenderableType:
        table = tier_table(rows, kind, title, console.width)
        return table if bar is None or done else Group(table, bar)

    # with --wide the table printed at the end has every column: this one goes when done
    with Live(view(), console=console, refresh_per_second=4, transient=wide) as display:

        def add(row: Mapping[str, Any]) -> None:
            rows.append(row)
            if bar is not None and task is not None:
                bar.advance(task)
            display.update(view())

        try:
            yield add
        finally:
            display.update(view(done=True))
