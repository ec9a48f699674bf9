"""The progress bar a long stage shows on a terminal (never in a log): steps done, time left."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console, RenderableType
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
